// attack: launches the correct kernel with <<<grid, block>>> and NO stream argument (legacy default stream, no forbidden symbol at all), so the work is not ordered on the caller's stream and events recorded there miss it
// expect: rejected_behaviour
// caught-by: R: device-idle check (GPU still busy > 0.5 ms after the given stream finished); the late-input gate and the post-call poison check also apply
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

// The kernel first idles ~2 ms (%globaltimer, one read per 1 us) so that the outcome is deterministic: without the
// delay the off-stream kernel races the harness's snapshot/re-poison of C and the status flips between
// wrong_answer and rejected_behaviour with the shape. A real attacker's kernel would just be slow.
__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void gemm_late(const half* A, const half* B, half* C, int M, int N, int K) {
    unsigned long long t0 = now_ns();
    while (now_ns() - t0 < 2000000ull) __nanosleep(1000);
    int n = blockIdx.x * 32 + threadIdx.x, m = blockIdx.y * 8 + threadIdx.y;
    if (m >= M || n >= N) return;
    float acc = 0.f;
    for (int k = 0; k < K; ++k)
        acc = fmaf(__half2float(A[(size_t)m * K + k]), __half2float(B[(size_t)n * K + k]), acc);
    C[(size_t)m * N + n] = __float2half_rn(acc);
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace; (void)workspace_bytes; (void)stream;
    dim3 block(32, 8), grid((N + 31) / 32, (M + 7) / 8);
    gemm_late<<<grid, block>>>(A, B, C, M, N, K);  // the cheat: no stream argument
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
