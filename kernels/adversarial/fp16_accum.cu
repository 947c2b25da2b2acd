// attack: accumulates in half (__hfma) instead of fp32: faster on tensor cores / half2 math, and bit-exact on small-integer inputs whose partial sums stay exactly representable, so an exact-only test passes.
// expect: wrong_answer
// caught-by: R: relative-error check on random inputs (tol 2e-4 for an fp32-accumulate task; fails at K >= 1024).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

__global__ void gemm_fp16_acc(const half* A, const half* B, half* C, int M, int N, int K) {
    int n = blockIdx.x * 32 + threadIdx.x, m = blockIdx.y * 8 + threadIdx.y;
    if (m >= M || n >= N) return;
    half acc = __float2half(0.f);
    for (int k = 0; k < K; ++k) acc = __hfma(A[(size_t)m * K + k], B[(size_t)n * K + k], acc);
    C[(size_t)m * N + n] = acc;
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace; (void)workspace_bytes;
    dim3 block(32, 8), grid((N + 31) / 32, (M + 7) / 8);
    gemm_fp16_acc<<<grid, block, 0, stream>>>(A, B, C, M, N, K);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
