// fault: cudal2_hgemm never returns: a host for(;;) loop that increments a volatile counter
// expect: timeout
// caught-by: R: per-task wall-clock deadline in the runner
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)A; (void)B; (void)C; (void)M; (void)N; (void)K; (void)workspace; (void)workspace_bytes; (void)stream;
    volatile unsigned long long n = 0;
    for (;;) n = n + 1;
    return 0;
}
