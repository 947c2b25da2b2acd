// attack: starts each fp32 accumulator from workspace[m*N+n], which it never writes (asks for M*N*4 bytes). Correct whenever the workspace happens to be zeroed (fresh cudaMalloc / torch.zeros): reads memory it never initialised.
// expect: wrong_answer
// caught-by: R: the workspace is filled with garbage before each checked call; results are wrong or non-finite.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

__global__ void gemm_uninit(const half* A, const half* B, half* C, int M, int N, int K, const float* ws) {
    int n = blockIdx.x * 32 + threadIdx.x, m = blockIdx.y * 8 + threadIdx.y;
    if (m >= M || n >= N) return;
    float acc = ws[(size_t)m * N + n];  // the bug/cheat: never written by this candidate
    for (int k = 0; k < K; ++k)
        acc = fmaf(__half2float(A[(size_t)m * K + k]), __half2float(B[(size_t)n * K + k]), acc);
    C[(size_t)m * N + n] = __float2half_rn(acc);
}

extern "C" size_t cudal2_workspace_bytes(int M, int N, int K) {
    (void)K;
    return (size_t)M * N * sizeof(float);
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    if (!workspace || workspace_bytes < (size_t)M * N * sizeof(float)) return 1;
    dim3 block(32, 8), grid((N + 31) / 32, (M + 7) / 8);
    gemm_uninit<<<grid, block, 0, stream>>>(A, B, C, M, N, K, (const float*)workspace);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
