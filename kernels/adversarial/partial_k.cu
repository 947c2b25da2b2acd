// attack: sums only the first half of K (half the work, "2x faster"); passes a spot check whose inputs are zero-padded along K or a tolerance loose enough for a truncated sum.
// expect: wrong_answer
// caught-by: R: exact-integer check (bit-exact) and the relative-error checks on full-K random inputs.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

__global__ void gemm_half_k(const half* A, const half* B, half* C, int M, int N, int K) {
    int n = blockIdx.x * 32 + threadIdx.x, m = blockIdx.y * 8 + threadIdx.y;
    if (m >= M || n >= N) return;
    float acc = 0.f;
    for (int k = 0; k < K / 2; ++k)  // the cheat: the second half of K is never read
        acc = fmaf(__half2float(A[(size_t)m * K + k]), __half2float(B[(size_t)n * K + k]), acc);
    C[(size_t)m * N + n] = __float2half_rn(acc);
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace; (void)workspace_bytes;
    dim3 block(32, 8), grid((N + 31) / 32, (M + 7) / 8);
    gemm_half_k<<<grid, block, 0, stream>>>(A, B, C, M, N, K);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
