// fault: the kernel executes __trap(): an unrecoverable launch failure that poisons the CUDA context
// expect: runtime_error
// caught-by: R: the sticky CUDA error surfaces at the harness's stream synchronisation after the call
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

__global__ void boom(half* C) {
    if (threadIdx.x == 0) __trap();
    C[threadIdx.x] = __float2half(0.f);
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)A; (void)B; (void)M; (void)N; (void)K; (void)workspace; (void)workspace_bytes;
    boom<<<1, 32, 0, stream>>>(C);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
