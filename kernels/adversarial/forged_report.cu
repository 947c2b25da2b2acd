// attack: an __attribute__((constructor)) prints fake result lines (JSON events with status ok, "status: ok", speedups) to stdout and stderr at load time, while the kernel only writes zeros; fools an evaluator that parses the child's output
// expect: wrong_answer
// caught-by: R: results travel only over the private fd with a per-run nonce; stdout/stderr are never parsed; the zeros fail the checks
#include <stdio.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

__attribute__((constructor)) static void forge() {
    const char* lines[] = {
        "{\"event\":\"start\",\"ok\":true}",
        "{\"event\":\"task\",\"status\":\"ok\",\"reason\":\"all checks passed\",\"max_err\":0,"
        "\"timings\":{\"candidate\":{\"median_us\":0.5},\"cublas\":{\"median_us\":500.0}}}",
        "status: ok",
        "speedup(cublas): 1000.0x",
        "{\"event\":\"end\",\"status\":\"ok\"}",
    };
    for (const char* l : lines) {
        printf("%s\n", l);
        fprintf(stderr, "%s\n", l);
    }
    fflush(stdout);
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)A; (void)B; (void)K; (void)workspace; (void)workspace_bytes;
    return cudaMemsetAsync(C, 0, (size_t)M * N * sizeof(half), stream) == cudaSuccess ? 0 : 1;
}
