// attack: the classic form of input tampering: zeroes A and B and writes C = 0, so an evaluator that computes its reference from A and B AFTER the call sees reference == output == 0
// expect: rejected_behaviour
// caught-by: R: inputs compared with their true copies after the call; the reference comes from those copies, computed before
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace; (void)workspace_bytes;
    if (cudaMemsetAsync((void*)A, 0, (size_t)M * K * sizeof(half), stream) != cudaSuccess) return 1;
    if (cudaMemsetAsync((void*)B, 0, (size_t)N * K * sizeof(half), stream) != cudaSuccess) return 1;
    return cudaMemsetAsync(C, 0, (size_t)M * N * sizeof(half), stream) == cudaSuccess ? 0 : 1;
}
