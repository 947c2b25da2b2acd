// attack: l2_persist.cu with every forbidden name (cudaStreamSetAttribute, cudaDeviceSetLimit, the struct members, the enum values) spelled by token pasting or numbers
// expect: static_reject
// caught-by: L: forbidden_symbol (imports cudaStreamSetAttribute and cudaDeviceSetLimit)
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
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define SET_ATTR CAT(cudaStream, SetAttribute)
#define SET_LIMIT CAT(cudaDevice, SetLimit)
#define WINDOW CAT(access, PolicyWindow)
#define RATIO CAT(hit, Ratio)
#define PROP CAT(hit, Prop)

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace; (void)workspace_bytes;
    static bool set = false;
    if (!set) {
        set = true;
        SET_LIMIT((cudaLimit)0x06 /* persisting L2 size */, 48u << 20);
        cudaStreamAttrValue attr = {};
        attr.WINDOW.base_ptr = (void*)A;
        attr.WINDOW.num_bytes = (size_t)M * K * sizeof(half);
        attr.WINDOW.RATIO = 1.0f;
        attr.WINDOW.PROP = (cudaAccessProperty)2 /* persisting */;
        SET_ATTR(stream, (cudaStreamAttrID)1 /* access policy window */, &attr);
    }
    return run_naive(A, B, C, M, N, K, stream);
}
