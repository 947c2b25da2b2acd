// fault: the kernel never terminates (spins on a volatile global flag that nothing sets); the evaluator must kill the run at its deadline and keep going with the next candidate
// expect: timeout
// caught-by: R: per-task wall-clock deadline in the runner (process group killed; the GPU context dies with it)
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

// A flag in global memory that nothing ever sets, read through volatile: the compiler can neither prove the loop
// infinite nor drop it (a loop on a volatile LOCAL was optimised away by nvcc and the kernel returned at once).
__device__ int g_release = 0;

__global__ void hang(half* C) {
    while (*(volatile int*)&g_release == 0) {}
    C[0] = __float2half(1.f);  // never reached
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)A; (void)B; (void)M; (void)N; (void)K; (void)workspace; (void)workspace_bytes;
    hang<<<1, 32, 0, stream>>>(C);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
