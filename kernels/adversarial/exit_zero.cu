// attack: calls exit(0) inside cudal2_hgemm: an evaluator that treats a clean exit status as success (or has already printed a partial report) records a pass
// expect: static_reject
// caught-by: S: exit_abort (exit); L would also reject the exit import; R: a child without a complete report is runtime_error
#include <stdlib.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)A; (void)B; (void)C; (void)M; (void)N; (void)K; (void)workspace; (void)workspace_bytes; (void)stream;
    exit(0);
}
