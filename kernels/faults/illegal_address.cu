// fault: the kernel stores through a wild device pointer ((half*)0x10): an illegal-address fault that poisons the CUDA context
// expect: runtime_error
// caught-by: R: the sticky CUDA error surfaces at the harness's stream synchronisation after the call
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

__global__ void wild(half* p, int n) {
    if (threadIdx.x < n) p[threadIdx.x] = __float2half(1.f);
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)A; (void)B; (void)C; (void)M; (void)N; (void)K; (void)workspace; (void)workspace_bytes;
    wild<<<1, 32, 0, stream>>>((half*)0x10, 32);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
