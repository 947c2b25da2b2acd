// attack: launches its kernel with programmatic dependent launch (PDL) and triggers its dependents at once, so in the offline graph of back-to-back timed calls each call's kernel starts while the one before it is still running (the calls use different buffers, so every answer stays right) and the per-call time shrinks
// expect: rejected_behaviour
// caught-by: R: programmatic edges between calls in the captured graph of the timed calls (PDL is allowed only between the kernels of one call, evaluator 0.3.0)
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

// Honest part: one thread per output, fp32 accumulate, bounds-checked.
__global__ void gemm_naive(const half* A, const half* B, half* C, int M, int N, int K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");  // let the next call's kernel start now
#endif
    int n = blockIdx.x * 32 + threadIdx.x, m = blockIdx.y * 8 + threadIdx.y;
    if (m >= M || n >= N) return;
    float acc = 0.f;
    for (int k = 0; k < K; ++k)
        acc = fmaf(__half2float(A[(size_t)m * K + k]), __half2float(B[(size_t)n * K + k]), acc);
    C[(size_t)m * N + n] = __float2half_rn(acc);
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace; (void)workspace_bytes;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3((N + 31) / 32, (M + 7) / 8);
    config.blockDim = dim3(32, 8);
    config.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attr;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, gemm_naive, A, B, C, M, N, K) == cudaSuccess ? 0 : 1;
}
