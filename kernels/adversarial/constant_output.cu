// attack: fills C with the expected mean K/4 of a product of U(0,1) inputs and does no GEMM; close enough for a loose tolerance on uniform inputs, and a fill kernel is "fast".
// expect: wrong_answer
// caught-by: R: exact-integer check (bit-exact) and the normal / positive-mean relative-error checks.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

__global__ void fill_const(half* C, size_t n, float v) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) C[i] = __float2half_rn(v);
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)A; (void)B; (void)workspace; (void)workspace_bytes;
    size_t n = (size_t)M * N;
    fill_const<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(C, n, 0.25f * (float)K);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
