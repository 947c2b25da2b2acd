// fault: on its first call prints 100 MB to stdout from the host and ~135k device printf lines (every thread of 132 x 256, 4 times: ~13 MB, so the 1 MiB device FIFO overflows), then computes correctly on every call; the logs must stay bounded and the result unaffected
// expect: ok
// caught-by: R: stdout/stderr captured and capped (head and tail kept), never parsed; the device printf FIFO is bounded by the driver
#include <stdio.h>
#include <string.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

// Honest part: one thread per output, fp32 accumulate, bounds-checked.
__global__ void gemm_naive(const half* A, const half* B, half* C, int M, int N, int K) {
    int n = blockIdx.x * 32 + threadIdx.x, m = blockIdx.y * 8 + threadIdx.y;
    if (m >= M || n >= N) return;
    float acc = 0.f;
    for (int k = 0; k < K; ++k)
        acc = fmaf(__half2float(A[(size_t)m * K + k]), __half2float(B[(size_t)n * K + k]), acc);
    C[(size_t)m * N + n] = __float2half_rn(acc);
}

static int run_naive(const half* A, const half* B, half* C, int M, int N, int K, cudaStream_t s) {
    dim3 block(32, 8), grid((N + 31) / 32, (M + 7) / 8);
    gemm_naive<<<grid, block, 0, s>>>(A, B, C, M, N, K);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

__global__ void chatter(int rounds) {
    for (int r = 0; r < rounds; ++r)
        printf("device spam block %d thread %d round %d ........................................\n", blockIdx.x,
               threadIdx.x, r);
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace; (void)workspace_bytes;
    static bool flooded = false;
    if (!flooded) {
        flooded = true;
        static char line[1024];
        memset(line, 'x', sizeof line - 2);
        line[sizeof line - 2] = '\n';
        line[sizeof line - 1] = 0;
        for (int i = 0; i < 100 * 1024; ++i) fputs(line, stdout);  // 100 MiB
        fflush(stdout);
        chatter<<<132, 256, 0, stream>>>(4);  // 1056 x 256 x 16 took > 60 s: the device printf path is slow
    }
    return run_naive(A, B, C, M, N, K, stream);
}
