// attack: computes correctly but skips every 4th 32x32 output tile (25% less work); passes an evaluator that checks a few sampled outputs, or one whose C happens to hold a previous correct result.
// expect: wrong_answer
// caught-by: R: C is poisoned with NaN before each checked call; the full comparison finds unwritten outputs.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

__global__ void gemm_skip(const half* A, const half* B, half* C, int M, int N, int K) {
    int tiles_n = (N + 31) / 32;
    int tile = blockIdx.y * tiles_n + blockIdx.x;
    if (tile % 4 == 3) return;  // the cheat
    int n = blockIdx.x * 32 + threadIdx.x;
    for (int m = blockIdx.y * 32 + threadIdx.y; m < min(M, (int)(blockIdx.y + 1) * 32); m += 8) {
        if (n >= N) break;
        float acc = 0.f;
        for (int k = 0; k < K; ++k)
            acc = fmaf(__half2float(A[(size_t)m * K + k]), __half2float(B[(size_t)n * K + k]), acc);
        C[(size_t)m * N + n] = __float2half_rn(acc);
    }
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace; (void)workspace_bytes;
    dim3 block(32, 8), grid((N + 31) / 32, (M + 31) / 32);
    gemm_skip<<<grid, block, 0, stream>>>(A, B, C, M, N, K);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
