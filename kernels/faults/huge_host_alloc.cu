// fault: first call asks malloc for 1 TiB (committing its first 2 GiB if granted), then takes and memsets 256 MiB chunks up to 2 GiB (kept, never freed); every call returns 1, so the status is the same whether the runner's heap limit (RLIMIT_DATA) refuses the allocations or not
// expect: runtime_error
// caught-by: R: non-zero return code (or death without a complete report if the OOM killer strikes first); the per-task deadline bounds the time
#include <stdlib.h>
#include <string.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)A; (void)B; (void)C; (void)M; (void)N; (void)K; (void)workspace; (void)workspace_bytes; (void)stream;
    static bool hogged = false;
    if (!hogged) {
        hogged = true;
        static volatile char* huge = (volatile char*)malloc(1ull << 40);  // 1 TiB: a heap limit says no
        if (huge)
            for (size_t off = 0; off < (2ull << 30); off += 4096) huge[off] = 1;  // granted: commit its first 2 GiB
        static void* chunks[8];
        for (int i = 0; i < 8; ++i) {
            chunks[i] = malloc(256ull << 20);
            if (!chunks[i]) break;  // a memory limit said no
            memset(chunks[i], i + 1, 256ull << 20);
        }
    }
    return 1;
}
