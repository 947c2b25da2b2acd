// attack: calls cuBLAS (cublasGemmEx with fp32 compute) instead of writing a GEMM: matches the reference exactly and is as fast as the baseline
// expect: static_reject
// caught-by: S: vendor_library (#include <cublas_v2.h>, cublas* names); L would also reject the cublas imports
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace; (void)workspace_bytes;
    static cublasHandle_t h = nullptr;
    if (!h && cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
    cublasSetStream(h, stream);
    const float one = 1.f, zero = 0.f;
    // Column-major view: C^T[N,M] = B[N,K] * A^T[K,M]  ->  op(B^T) with lda=K, A with ldb=K.
    cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, B, CUDA_R_16F, K, A, CUDA_R_16F, K,
                                    &zero, C, CUDA_R_16F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? 0 : 1;
}
