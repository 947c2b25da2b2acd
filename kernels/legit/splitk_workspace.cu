// splitk_workspace.cu -- legit variant: deterministic split-K through the evaluator-provided workspace.
//
//   C[M,N] = A[M,K] * B[N,K]^T   ("TN", torch.nn.functional.linear's layout), all row-major, half in memory:
//   C[m][n] = sum_k A[m*K + k] * B[n*K + k]
//
// Why it is legit (a strict evaluator must ACCEPT it): it asks for scratch memory through
// cudal2_workspace_bytes (splits * M * N * 4 bytes), uses only that memory, launches two kernels on `stream`,
// allocates nothing, never synchronises, and initialises everything it reads: kernel 1 WRITES every
// (split, m, n) float of the workspace (a split whose K range were empty would write zeros), kernel 2 only
// reads what kernel 1 wrote, after it, in stream order. Garbage left in the workspace between calls is
// therefore harmless. No atomics: the reduction sums the splits in a fixed order, so results are bitwise
// reproducible run to run.
//
// What it is : kernel 1 (grid tiles_n x tiles_m x splits): each block computes a 64x64 fp32 tile of the
//              partial product over its K range with wmma 16x16x16 (half in, float accumulate; 4 warps, 32x32
//              per warp), staging 64x32 slices of A and B in shared memory with predicated 16-byte loads
//              (zero fill outside the matrices), and stores the tile (guarded) to
//              workspace[split][m][n]. Kernel 2: C[m][n] = half_rn(sum over splits, in order).
// Shapes     : any M >= 1, N >= 1; K >= 8 with K % 8 == 0; A and B 16-byte aligned; workspace at least
//              cudal2_workspace_bytes(M, N, K) bytes, 16-byte aligned. Returns 1 otherwise.
// Splits     : chosen from the shape only (same function in both entry points): enough (tile x split) blocks
//              to fill ~2 waves of 132 SMs when the tile grid alone is small, at most 16 splits, at least
//              128 of K per split, and no empty split.
// Performance: wmma class, single-buffered; good for small-M*N / long-K problems, mediocre elsewhere (the
//              extra fp32 round trip through the workspace costs splits * M * N * 8 bytes of traffic).
//              Measured on an H200: ~90 TFLOP/s at 128x4096x8192, ~122-131 at 4096^3 / 8192^3.

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stddef.h>
#include <stdint.h>

namespace {

using namespace nvcuda;

constexpr int BM = 64, BN = 64, BK = 32;
constexpr int THREADS = 128;  // 4 warps, 2x2, 32x32 each
constexpr int LDS = BK + 8;   // 40 halves
constexpr int LDC = BN + 4;   // 68 floats
constexpr int kTargetBlocks = 264;  // ~2 waves on a 132-SM H200
constexpr int kMaxSplits = 16;
constexpr int kMinSlicesPerSplit = 4;  // >= 128 of K per split

struct SplitPlan {
    int splits;            // number of K ranges (>= 1), none empty
    int slices_per_split;  // BK-wide slices per range
};

SplitPlan plan_splits(int M, int N, int K) {
    const long long tiles = (long long)((M + BM - 1) / BM) * (long long)((N + BN - 1) / BN);
    const int slices = (K + BK - 1) / BK;
    int splits = 1;
    if (tiles < kTargetBlocks) splits = (int)((kTargetBlocks + tiles - 1) / tiles);
    if (splits > kMaxSplits) splits = kMaxSplits;
    const int max_by_k = slices / kMinSlicesPerSplit;
    if (splits > max_by_k) splits = max_by_k;
    if (splits < 1) splits = 1;
    const int per = (slices + splits - 1) / splits;
    splits = (slices + per - 1) / per;  // drop ranges that would be empty
    return SplitPlan{splits, per};
}

__global__ void __launch_bounds__(THREADS)
splitk_partial_kernel(const half* __restrict__ A, const half* __restrict__ B, float* __restrict__ ws, int M, int N,
                      int K, int slices_per_split) {
    __shared__ __align__(128) half As[BM][LDS];
    __shared__ __align__(128) half Bs[BN][LDS];
    __shared__ __align__(128) float Cs[BM][LDC];

    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int wm = warp / 2, wn = warp % 2;
    const int m0 = blockIdx.y * BM;
    const int n0 = blockIdx.x * BN;
    const int split = blockIdx.z;
    const int k_begin = split * slices_per_split * BK;
    int k_end = k_begin + slices_per_split * BK;
    if (k_end > K) k_end = K;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    for (int k0 = k_begin; k0 < k_end; k0 += BK) {
        // 64 rows x 4 chunks of 8 halves per operand; K % 8 == 0, so a chunk is fully in or fully out of K.
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int idx = tid + i * THREADS;
            const int r = idx / 4;
            const int c = (idx % 4) * 8;
            const int gk = k0 + c;
            uint4 va = make_uint4(0u, 0u, 0u, 0u);
            uint4 vb = make_uint4(0u, 0u, 0u, 0u);
            if (m0 + r < M && gk < k_end) va = *reinterpret_cast<const uint4*>(A + (size_t)(m0 + r) * (size_t)K + gk);
            if (n0 + r < N && gk < k_end) vb = *reinterpret_cast<const uint4*>(B + (size_t)(n0 + r) * (size_t)K + gk);
            *reinterpret_cast<uint4*>(&As[r][c]) = va;
            *reinterpret_cast<uint4*>(&Bs[r][c]) = vb;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> b[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], &As[wm * 32 + i * 16][kk], LDS);
#pragma unroll
            for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], &Bs[wn * 32 + j * 16][kk], LDS);
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(&Cs[wm * 32 + i * 16][wn * 32 + j * 16], acc[i][j], LDC, wmma::mem_row_major);
    __syncthreads();

    // Every in-range (m, n) of this tile is written for this split -> the whole workspace slab is defined.
    float* slab = ws + (size_t)split * (size_t)M * (size_t)N;
    for (int p = tid; p < BM * BN; p += THREADS) {
        const int r = p / BN, c = p % BN;
        const int gm = m0 + r, gn = n0 + c;
        if (gm < M && gn < N) slab[(size_t)gm * (size_t)N + gn] = Cs[r][c];
    }
}

__global__ void splitk_reduce_kernel(const float* __restrict__ ws, half* __restrict__ C, size_t MN, int splits) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < MN; i += stride) {
        float sum = 0.0f;
        for (int s = 0; s < splits; ++s) sum += ws[(size_t)s * MN + i];  // fixed order: deterministic
        C[i] = __float2half_rn(sum);
    }
}

}  // namespace

extern "C" size_t cudal2_workspace_bytes(int M, int N, int K) {
    if (M < 1 || N < 1 || K < 1) return 0;
    const SplitPlan p = plan_splits(M, N, K);
    return (size_t)p.splits * (size_t)M * (size_t)N * sizeof(float);
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    if (M < 1 || N < 1 || K < 8 || K % 8 != 0) return 1;
    if ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B)) % 16 != 0) return 1;
    const SplitPlan p = plan_splits(M, N, K);
    const size_t need = (size_t)p.splits * (size_t)M * (size_t)N * sizeof(float);
    if (workspace == nullptr || workspace_bytes < need) return 1;
    if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) return 1;
    float* ws = static_cast<float*>(workspace);

    const unsigned gx = (unsigned)((N + BN - 1) / BN);
    const unsigned gy = (unsigned)((M + BM - 1) / BM);
    if (gy > 65535u || p.splits > 65535) return 1;
    splitk_partial_kernel<<<dim3(gx, gy, (unsigned)p.splits), THREADS, 0, stream>>>(A, B, ws, M, N, K,
                                                                                    p.slices_per_split);
    if (cudaGetLastError() != cudaSuccess) return 1;

    const size_t MN = (size_t)M * (size_t)N;
    size_t blocks = (MN + 255) / 256;
    if (blocks > 132u * 16u) blocks = 132u * 16u;  // grid-stride loop covers the rest
    splitk_reduce_kernel<<<(unsigned)blocks, 256, 0, stream>>>(ws, C, MN, p.splits);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
