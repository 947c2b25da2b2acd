// fault: host code stores through a bad pointer (address 8, read from a volatile so the compiler can neither see nor drop it): SIGSEGV inside the evaluating process
// expect: runtime_error
// caught-by: R: the harness child dies without a complete report (killed by SIGSEGV)
#include <stdint.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)A; (void)B; (void)C; (void)M; (void)N; (void)K; (void)workspace; (void)workspace_bytes; (void)stream;
    volatile uintptr_t addr = 8;
    *(volatile int*)addr = 42;
    return 0;
}
