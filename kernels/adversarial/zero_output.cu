// attack: writes 0 to every output with one cudaMemsetAsync on the stream and does no GEMM; passes an evaluator that compares with a loose absolute tolerance on small-magnitude (or all-zero) test inputs.
// expect: wrong_answer
// caught-by: R: exact-integer check (bit-exact comparison) and the relative-error checks.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)A; (void)B; (void)K; (void)workspace; (void)workspace_bytes;
    return cudaMemsetAsync(C, 0, (size_t)M * N * sizeof(half), stream) == cudaSuccess ? 0 : 1;
}
