// fault: calls abort() in cudal2_hgemm (SIGABRT)
// expect: static_reject
// caught-by: S: exit_abort (abort); L would also reject the abort import; R: a death without a complete report is runtime_error
#include <stdlib.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)A; (void)B; (void)C; (void)M; (void)N; (void)K; (void)workspace; (void)workspace_bytes; (void)stream;
    abort();
}
