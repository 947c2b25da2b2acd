// attack: pdl_overlap.cu with the PDL attribute's names spelled by token pasting and no griddepcontrol, so no regex over the source sees it and the library imports only cudaLaunchKernelExC (allowed: thread-block clusters need it); each call's kernel may still start before the one before it has finished
// expect: rejected_behaviour
// caught-by: R: programmatic edges in the captured graph of the timed calls
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
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define ATTR_ID CAT(cudaLaunchAttributePro, grammaticStreamSerialization)
#define ATTR_FIELD CAT(programmaticStream, SerializationAllowed)

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace; (void)workspace_bytes;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3((N + 31) / 32, (M + 7) / 8);
    config.blockDim = dim3(32, 8);
    config.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = ATTR_ID;
    attr[0].val.ATTR_FIELD = 1;
    config.attrs = attr;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, gemm_naive, A, B, C, M, N, K) == cudaSuccess ? 0 : 1;
}
