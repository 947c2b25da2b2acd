// attack: reaches cuBLAS at run time: dlopen("libcublas.so.13") and dlsym of cublasCreate_v2 / cublasSetStream_v2 / cublasGemmEx, every name spelled by token pasting or split string literals and <dlfcn.h> not included, so no source regex sees it
// expect: static_reject
// caught-by: L: forbidden_symbol (imports dlopen and dlsym)
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
#define LOAD CAT(dl, open)
#define FIND CAT(dl, sym)
extern "C" void* LOAD(const char* file, int mode) noexcept;
extern "C" void* FIND(void* handle, const char* name) noexcept;

typedef int (*create_fn)(void**);
typedef int (*set_stream_fn)(void*, cudaStream_t);
typedef int (*gemm_ex_fn)(void*, int, int, int, int, int, const void*, const void*, int, int, const void*, int, int,
                          const void*, void*, int, int, int, int);

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace; (void)workspace_bytes;
    static void* lib = LOAD("libcu" "blas.s" "o.13", 2 /* now */);
    static void* handle = nullptr;
    static gemm_ex_fn gemm = lib ? (gemm_ex_fn)FIND(lib, "cubl" "asGemmEx") : nullptr;
    static set_stream_fn set_stream = lib ? (set_stream_fn)FIND(lib, "cubl" "asSetStream_v2") : nullptr;
    if (lib && !handle) {
        create_fn create = (create_fn)FIND(lib, "cubl" "asCreate_v2");
        if (create) create(&handle);
    }
    if (!gemm || !set_stream || !handle) return run_naive(A, B, C, M, N, K, stream);  // "fallback"
    set_stream(handle, stream);
    const float one = 1.f, zero = 0.f;
    // op T = 1, op N = 0, CUDA_R_16F = 2, CUBLAS_COMPUTE_32F = 68, CUBLAS_GEMM_DEFAULT = -1
    return gemm(handle, 1, 0, N, M, K, &one, B, 2, K, A, 2, K, &zero, C, 2, N, 68, -1) == 0 ? 0 : 1;
}
