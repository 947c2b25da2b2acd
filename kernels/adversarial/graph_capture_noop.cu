// attack: asks cudaStreamIsCapturing and enqueues nothing while the stream is being captured into a CUDA graph, so a graph-replay timer measures an empty graph
// expect: static_reject
// caught-by: S: stream_graph_malloc_sync (cudaStreamIsCapturing); R would reject an empty capture as rejected_behaviour
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

// Honest part: one thread per output, fp32 accumulate, bounds-checked.
__global__ void gemm_naive(const half* A, const half* B, half* C, int M, int N, int K) {
    int n = blockIdx.x * 32 + threadIdx.x, m = blockIdx.y * 8 + threadIdx.y;
    if (m >= M || n >= N) return;
    float acc = 0.f;
    for (int k = 0; k < K; ++k)
        acc = fmaf(__half2float(A[(size_t)m * K + k]), __half2float(B[(size_t)n * K + k]), acc);
    C[(size_t)m * N + n] = __float2half_rn(acc);
}

static int run_naive(const half* A, const half* B, half* C, int M, int N, int K, cudaStream_t s) {
    dim3 block(32, 8), grid((N + 31) / 32, (M + 7) / 8);
    gemm_naive<<<grid, block, 0, s>>>(A, B, C, M, N, K);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace; (void)workspace_bytes;
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone) return 0;
    return run_naive(A, B, C, M, N, K, stream);
}
