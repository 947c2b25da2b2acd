// smem_tiled.cu -- seed kernel: classic shared-memory tiling with a per-thread register block (CUDA cores).
//
//   C[M,N] = A[M,K] * B[N,K]^T   ("TN", torch.nn.functional.linear's layout), all row-major, half in memory:
//   C[m][n] = sum_k A[m*K + k] * B[n*K + k]
//
// What it is : each 256-thread block computes a 64x64 tile of C. The K dimension is walked in slices of
//              BK = 32: the block stages a 64x32 slice of A and a 64x32 slice of B in shared memory (converted
//              to float and stored k-major, i.e. transposed, so that the inner loop reads one k-row), then
//              every thread accumulates a 4x4 register block in fp32. A thread (ty, tx) of the 16x16 thread
//              grid owns rows ty + 16*i and columns tx + 16*j (i, j in 0..3) of the tile: strided ownership
//              makes the shared-memory reads conflict-free and the global stores coalesced in 16-wide runs.
//              Output is rounded once to half with __float2half_rn.
// Shapes     : any M, N, K >= 1. Loads are predicated (zero fill outside the matrices), stores are guarded,
//              offsets are 64-bit. Returns 1 for M, N or K < 1 or when the launch fails.
// Workspace  : none.
// Performance: CUDA-core class: fp32 FMAs only, no tensor cores, scalar loads. Measured on an H200:
//              ~21 TFLOP/s at 4096^3 and 8192^3 (cuBLAS: ~760), i.e. ~3% of cuBLAS.

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

namespace {

constexpr int BM = 64;                 // tile rows (M)
constexpr int BN = 64;                 // tile columns (N)
constexpr int BK = 32;                 // K slice per shared-memory stage
constexpr int TM = 4;                  // rows per thread
constexpr int TN = 4;                  // columns per thread
constexpr int TY = BM / TM;            // 16 thread rows
constexpr int TX = BN / TN;            // 16 thread columns
constexpr int THREADS = TY * TX;       // 256
constexpr int PAD = 1;                 // odd row stride -> conflict-free transposed stores

__global__ void __launch_bounds__(THREADS)
smem_tiled_hgemm_tn(const half* __restrict__ A, const half* __restrict__ B, half* __restrict__ C, int M, int N,
                    int K) {
    // k-major (transposed) float tiles: As[k][m], Bs[k][n].
    __shared__ float As[BK][BM + PAD];
    __shared__ float Bs[BK][BN + PAD];

    const int tid = threadIdx.x;
    const int tx = tid % TX;  // 0..15
    const int ty = tid / TX;  // 0..15
    const int m0 = blockIdx.y * BM;
    const int n0 = blockIdx.x * BN;

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += BK) {
        // Stage the 64x32 slices. Element e of the slice: row e / BK, k e % BK, so consecutive threads read
        // consecutive k of one row (coalesced global reads).
#pragma unroll
        for (int e = tid; e < BM * BK; e += THREADS) {
            const int r = e / BK;
            const int c = e % BK;
            const int gm = m0 + r;
            const int gk = k0 + c;
            As[c][r] = (gm < M && gk < K) ? __half2float(A[(size_t)gm * (size_t)K + gk]) : 0.0f;
        }
#pragma unroll
        for (int e = tid; e < BN * BK; e += THREADS) {
            const int r = e / BK;
            const int c = e % BK;
            const int gn = n0 + r;
            const int gk = k0 + c;
            Bs[c][r] = (gn < N && gk < K) ? __half2float(B[(size_t)gn * (size_t)K + gk]) : 0.0f;
        }
        __syncthreads();

#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[k][ty + TY * i];
#pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[k][tx + TX * j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();  // the next iteration overwrites As/Bs
    }

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int gm = m0 + ty + TY * i;
        if (gm >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int gn = n0 + tx + TX * j;
            if (gn < N) C[(size_t)gm * (size_t)N + gn] = __float2half_rn(acc[i][j]);
        }
    }
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
    const unsigned gx = (unsigned)((N + BN - 1) / BN);
    const unsigned gy = (unsigned)((M + BM - 1) / BM);
    if (gy > 65535u) return 1;  // grid.y limit; never reached for M <= 4194240
    smem_tiled_hgemm_tn<<<dim3(gx, gy), THREADS, 0, stream>>>(A, B, C, M, N, K);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
