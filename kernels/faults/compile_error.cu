// fault: does not compile: a type error (half* assigned from an int) and an undeclared identifier
// expect: compile_error
// caught-by: nvcc: non-zero exit; the first error line is the reason (cached like a successful build)
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)A; (void)B; (void)workspace; (void)workspace_bytes; (void)stream;
    half* p = 42;
    C = p + undeclared_thing(M, N, K);
    return 0;
}
