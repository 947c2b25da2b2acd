// attack: leftover_work's cheat on every other call only (odd calls leave a kernel spinning ~5 ms on the legacy default stream, even calls are clean), so an evaluator that runs a call again after a failed idle check, and passes it once the re-run is clean, lets it through
// expect: rejected_behaviour
// caught-by: R: device-idle check, run again after a failure with the thread on its CPU: the call must then pass twice in a row, which an every-other-call cheat never does
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

// The spinner waits for a "done" flag that a 1-thread kernel on `stream` raises after the GEMM, then spins 5 ms:
// so it outlasts the stream's work at every shape (a fixed spin could end before a slow GEMM does).
__device__ unsigned long long g_done = 0;

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void raise_done(unsigned long long id) { *(volatile unsigned long long*)&g_done = id; }

__global__ void spin_after(unsigned long long id) {
    while (*(volatile unsigned long long*)&g_done < id) __nanosleep(1000);
    unsigned long long t0 = now_ns();
    while (now_ns() - t0 < 5000000ull) __nanosleep(1000);
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace; (void)workspace_bytes;
    static unsigned long long calls = 0;
    unsigned long long id = ++calls;
    if (run_naive(A, B, C, M, N, K, stream)) return 1;
    if (id % 2 == 1) {  // the cheat, on odd calls: stream 0 = legacy default stream, not ordered on `stream`
        raise_done<<<1, 1, 0, stream>>>(id);
        spin_after<<<1, 1, 0, 0>>>(id);
    }
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
