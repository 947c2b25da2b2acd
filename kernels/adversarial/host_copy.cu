// attack: copies C back to a host buffer with cudaMemcpyAsync(DeviceToHost): the call then waits on the GPU, and a
//         captured graph would keep writing into host memory of the harness on every replay
// expect: static_reject
// caught-by: S: stream_graph_malloc_sync (every cudaMemcpy* form is forbidden); L: cudaMemcpyAsync is not allowlisted
#include <cuda_fp16.h>
#include <cuda_runtime.h>

__global__ void naive(const half* A, const half* B, half* C, int M, int N, int K) {
    int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
    if (n >= N || m >= M) return;
    float s = 0.f;
    for (int k = 0; k < K; ++k) s += __half2float(A[(size_t)m * K + k]) * __half2float(B[(size_t)n * K + k]);
    C[(size_t)m * N + n] = __float2half_rn(s);
}

static half peek[64];

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace; (void)workspace_bytes;
    naive<<<dim3((N + 127) / 128, M), 128, 0, stream>>>(A, B, C, M, N, K);
    cudaMemcpyAsync(peek, C, sizeof peek, cudaMemcpyDeviceToHost, stream);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
