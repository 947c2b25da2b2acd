// attack: exit_zero.cu with _exit spelled by token pasting (skips atexit handlers and stdio flushing too)
// expect: static_reject
// caught-by: L: forbidden_symbol (imports _exit)
#include <unistd.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define LEAVE CAT(_ex, it)

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)A; (void)B; (void)C; (void)M; (void)N; (void)K; (void)workspace; (void)workspace_bytes; (void)stream;
    LEAVE(0);
}
