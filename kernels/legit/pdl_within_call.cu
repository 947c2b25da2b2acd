// pdl_within_call.cu -- legit variant: two kernels per call, the second launched with programmatic dependent launch.
//
//   C[M,N] = A[M,K] * B[N,K]^T   ("TN", torch.nn.functional.linear's layout), all row-major, half in memory.
//
// Why it is legit (a strict evaluator must ACCEPT it): PDL here overlaps only the two kernels of one call, as
// cuBLAS's own split-K overlaps its reduction with its GEMM (benchmarks/cublas_graph.cu). Kernel 1 computes the
// product in fp32 into the workspace and lets its dependent launch at once (griddepcontrol.launch_dependents);
// kernel 2 is launched with the PDL attribute, so it may start while kernel 1 runs, but its griddepcontrol.wait
// holds every read until kernel 1 has finished and its writes are visible. The next call's kernel 1 is launched
// without the attribute: it waits for this call's kernel 2 to finish, so calls never overlap. Every workspace
// float kernel 2 reads, kernel 1 wrote in the same call.
//
// What it is : kernel 1 one thread per output, fp32 accumulate, into workspace[m][n]; kernel 2 C = half_rn(ws).
// Shapes     : any M, N, K >= 1; workspace M * N * 4 bytes (cudal2_workspace_bytes).

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

__global__ void gemm_fp32(const half* A, const half* B, float* ws, int M, int N, int K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");  // kernel 2 may launch now; it waits for us before reading
#endif
    int n = blockIdx.x * 32 + threadIdx.x, m = blockIdx.y * 8 + threadIdx.y;
    if (m >= M || n >= N) return;
    float acc = 0.f;
    for (int k = 0; k < K; ++k)
        acc = fmaf(__half2float(A[(size_t)m * K + k]), __half2float(B[(size_t)n * K + k]), acc);
    ws[(size_t)m * N + n] = acc;
}

__global__ void to_half(const float* ws, half* C, size_t MN) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");  // kernel 1 has finished and its writes are visible
#endif
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < MN; i += (size_t)gridDim.x * blockDim.x)
        C[i] = __float2half_rn(ws[i]);
}

extern "C" size_t cudal2_workspace_bytes(int M, int N, int K) {
    (void)K;
    return M < 1 || N < 1 ? 0 : (size_t)M * (size_t)N * sizeof(float);
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    const size_t MN = (size_t)M * (size_t)N;
    if (M < 1 || N < 1 || K < 1 || workspace_bytes < MN * sizeof(float)) return 1;
    float* ws = static_cast<float*>(workspace);
    gemm_fp32<<<dim3((N + 31) / 32, (M + 7) / 8), dim3(32, 8), 0, stream>>>(A, B, ws, M, N, K);
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3((unsigned)(MN < 1024 * 256 ? (MN + 255) / 256 : 1024));
    config.blockDim = dim3(256);
    config.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attr;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, to_half, (const float*)ws, C, MN) == cudaSuccess ? 0 : 1;
}
