// mma_multistage.cu -- seed kernel: the serious one. Ampere-style tensor-core HGEMM with inline PTX:
//   mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, ldmatrix.x4, cp.async.cg 16-byte copies in a
//   4-stage shared-memory pipeline, an XOR swizzle against ldmatrix bank conflicts, and a grouped
//   ("threadblock swizzle") rasterisation for L2 reuse.
//
//   C[M,N] = A[M,K] * B[N,K]^T   ("TN", torch.nn.functional.linear's layout), all row-major, half in memory:
//   C[m][n] = sum_k A[m*K + k] * B[n*K + k]
//
// Shapes     : any M >= 1 and N >= 1 (edge tiles: cp.async zero-fill for rows outside A/B, guarded stores);
//              K >= 8 with K % 8 == 0 (every 16-byte chunk of a row is either fully inside K or fully outside
//              it and zero-filled, so K need not be a multiple of the 32-wide K slice); A and B 16-byte
//              aligned. C is written as half2 when N is even and C is 4-byte aligned, element by element
//              otherwise. Anything else returns 1 without launching.
// Workspace  : none.
// Performance: mma.sync class (the Ampere recipe; no Hopper wgmma/TMA). Measured on an H200: ~313 TFLOP/s at
//              4096^3 and ~333 at 8192^3 (cuBLAS: ~760), i.e. ~42% of cuBLAS; only ~61 TFLOP/s at
//              128x4096x8192 (too few tiles, no split-K). It is the policy's serious starting point, to be
//              improved with wgmma, TMA, warp specialisation, larger tiles, split-K/stream-K, etc.
//
// ---------------------------------------------------------------------------------------------------------
// Tiling
//   Block tile 128 (M) x 128 (N) x 32 (K), 256 threads = 8 warps arranged 2 (M) x 4 (N); warp tile 64 x 32.
//   Per K slice of 32 a warp does 2 k16 steps x (4 m16 tiles x 4 n8 tiles) = 32 mma.sync.
//   Accumulators: acc[mi][ni][4] floats, mi in 0..3 (16-row blocks), ni in 0..3 (8-column blocks) = 64 regs.
//
// Shared memory (dynamic, 4 stages x 16 KB = 64 KB > 48 KB, so the limit is raised once per process)
//   Stage s holds the A slice (128 rows x 32 halves) followed by the B slice (128 rows x 32 halves). Both are
//   K-contiguous ("row" operand for A, "col" operand for B since B is stored [n][k]). One row = 32 halves =
//   64 bytes = four 16-byte chunks. Chunk c of row r is stored at chunk position c ^ ((r >> 1) & 3):
//     ldmatrix reads, per 8x8 matrix, the same logical chunk c of 8 consecutive rows r0..r0+7 (r0 % 8 == 0).
//     Unswizzled, row r starts at byte 64*r, so the 8 rows hit only 2 distinct 16-byte bank groups (4-way
//     conflict). Swizzled, the bank group (16-byte unit mod 8) is 4*(r & 1) + (c ^ ((r >> 1) & 3)): the pair
//     ((r & 1), (r >> 1) & 3) takes all 8 values over the 8 rows, so all 8 bank groups are distinct.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), with
//   g = lane / 4 ("groupID") and t = lane % 4 ("threadID_in_group"):
//   A (16x16, row): 4 .b32 regs, each two halves of consecutive k:
//       a0 = (row g,   k 2t..2t+1)   a1 = (row g+8, k 2t..2t+1)
//       a2 = (row g,   k 2t+8..+9)   a3 = (row g+8, k 2t+8..+9)
//   B (16x8, col): 2 .b32 regs:  b0 = (k 2t..2t+1, col g)   b1 = (k 2t+8..+9, col g)
//   C/D (16x8, f32): 4 floats:   c0,c1 = (row g, cols 2t, 2t+1)   c2,c3 = (row g+8, cols 2t, 2t+1)
// ldmatrix.x4 (non-transposed) loads four 8x8 b16 matrices; lanes 8j..8j+7 supply the 8 row addresses of
//   matrix j, and destination register j of lane l receives row l/4, elements 2*(l%4), 2*(l%4)+1 of matrix j.
//   A 16x16 tile: matrices = (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
//     -> registers a0..a3 exactly as above. Lane l addresses row (l % 16), k column (l / 16) * 8.
//   B: the smem tile is [n][k], so an 8x8 matrix with rows = n and columns = k gives lane l the pair
//     (n = l/4, k = 2(l%4)..+1) = b0's layout. One x4 covers two n8 blocks: matrices = (n 0-7, k 0-7),
//     (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15) -> {b0,b1} of n-block 0 and {b0,b1} of n-block 1.
//     Lane l addresses n row (l / 16) * 8 + (l % 8), k column ((l / 8) % 2) * 8.
//
// Pipeline (STAGES = 4, one __syncthreads per K slice)
//   prologue: issue slices 0..STAGES-2, one commit_group each (empty groups are committed too, so the group
//             count is uniform).
//   iteration kt: wait_group(STAGES-2) -> slice kt has landed for this thread; __syncthreads -> it has landed
//             for every thread AND every warp finished computing slice kt-1, whose stage
//             (kt-1) % STAGES == (kt+STAGES-1) % STAGES is refilled next; issue slice kt+STAGES-1; commit;
//             compute slice kt from stage kt % STAGES.
// ---------------------------------------------------------------------------------------------------------

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

namespace {

constexpr int BM = 128;
constexpr int BN = 128;
constexpr int BK = 32;
constexpr int STAGES = 4;
constexpr int THREADS = 256;
constexpr int WARPS_N = 4;                         // warps along N; 2 along M
constexpr int WARP_M = 64;
constexpr int WARP_N = 32;
constexpr int MI = WARP_M / 16;                    // 4 m16 blocks per warp
constexpr int NI = WARP_N / 8;                     // 4 n8 blocks per warp
constexpr int CHUNKS = BK / 8;                     // 4 16-byte chunks per smem row
constexpr int A_TILE = BM * BK;                    // halves per A slice
constexpr int B_TILE = BN * BK;                    // halves per B slice
constexpr int STAGE_HALVES = A_TILE + B_TILE;      // 8192 halves = 16 KB
constexpr size_t SMEM_BYTES = (size_t)STAGES * STAGE_HALVES * sizeof(half);  // 65536
constexpr int GROUP_M = 8;                         // rasterisation: 8 tile-rows share the B tiles in L2

static_assert(BK == 32, "the swizzle below assumes 4 chunks per row");
static_assert((BM * CHUNKS) % THREADS == 0 && (BN * CHUNKS) % THREADS == 0, "whole chunks per thread");

// Offset (in halves) of chunk `chunk` (0..3) of row `row` inside one A or B slice.
__device__ __forceinline__ int swz(int row, int chunk) {
    return row * BK + ((chunk ^ ((row >> 1) & 3)) << 3);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; src_bytes = 0 reads nothing and fills the 16 bytes with zeros.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// D = A * B + D, m16n8k16, A row-major f16, B column-major f16, fp32 accumulate.
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Issue the cp.async copies of K slice starting at k0 into one stage (A slice then B slice).
// Slice chunk q (0 .. rows*4-1) is row q / 4, chunk q % 4: eight consecutive threads cover two full rows
// (2 x 64 contiguous bytes of global memory).
__device__ __forceinline__ void load_slice(half* stage, const half* __restrict__ A, const half* __restrict__ B,
                                           int M, int N, int K, int m0, int n0, int k0, int tid) {
    half* sA = stage;
    half* sB = stage + A_TILE;
#pragma unroll
    for (int i = 0; i < (BM * CHUNKS) / THREADS; ++i) {
        const int q = tid + i * THREADS;
        const int row = q / CHUNKS;
        const int chunk = q % CHUNKS;
        const int gm = m0 + row;
        const int gk = k0 + chunk * 8;
        const bool valid = (gm < M) && (gk < K);
        // An invalid copy reads 0 bytes; pass a harmless in-bounds address anyway.
        const half* src = valid ? A + (size_t)gm * (size_t)K + gk : A;
        cp_async_16(smem_addr(sA + swz(row, chunk)), src, valid);
    }
#pragma unroll
    for (int i = 0; i < (BN * CHUNKS) / THREADS; ++i) {
        const int q = tid + i * THREADS;
        const int row = q / CHUNKS;
        const int chunk = q % CHUNKS;
        const int gn = n0 + row;
        const int gk = k0 + chunk * 8;
        const bool valid = (gn < N) && (gk < K);
        const half* src = valid ? B + (size_t)gn * (size_t)K + gk : B;
        cp_async_16(smem_addr(sB + swz(row, chunk)), src, valid);
    }
}

// Write the pair (v0, v1) to C[row][col], C[row][col+1], each half rounded with round-to-nearest-even.
__device__ __forceinline__ void store_pair(half* __restrict__ C, int M, int N, bool vec, int row, int col,
                                           float v0, float v1) {
    if (row >= M) return;
    half* p = C + (size_t)row * (size_t)N + col;
    if (vec) {
        // N even and col even: col < N implies col + 1 < N, and the address is 4-byte aligned.
        if (col < N) *reinterpret_cast<half2*>(p) = __floats2half2_rn(v0, v1);
    } else {
        if (col < N) p[0] = __float2half_rn(v0);
        if (col + 1 < N) p[1] = __float2half_rn(v1);
    }
}

__global__ void __launch_bounds__(THREADS, 2)
mma_multistage_hgemm_tn(const half* __restrict__ A, const half* __restrict__ B, half* __restrict__ C, int M,
                        int N, int K, int vec_store) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    half* smem = reinterpret_cast<half*>(smem_raw);

    // ---- grouped rasterisation: consecutive blocks walk down GROUP_M tile-rows before moving right ----
    const int tiles_m = (M + BM - 1) / BM;
    const int tiles_n = (N + BN - 1) / BN;
    const int pid = blockIdx.x;
    const int blocks_per_group = GROUP_M * tiles_n;
    const int group = pid / blocks_per_group;
    const int first_m = group * GROUP_M;
    const int group_rows = min(tiles_m - first_m, GROUP_M);
    const int in_group = pid - group * blocks_per_group;
    const int tile_m = first_m + in_group % group_rows;
    const int tile_n = in_group / group_rows;
    const int m0 = tile_m * BM;
    const int n0 = tile_n * BN;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wm = warp / WARPS_N;  // 0..1
    const int wn = warp % WARPS_N;  // 0..3

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

    const int ktiles = (K + BK - 1) / BK;

    // ---- prologue: slices 0 .. STAGES-2 ----
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles) load_slice(smem + s * STAGE_HALVES, A, B, M, N, K, m0, n0, s * BK, tid);
        cp_async_commit();
    }

    // Per-lane ldmatrix coordinates (see the header comment).
    const int a_row = wm * WARP_M + (lane & 15);                  // + mi * 16
    const int a_chunk = lane >> 4;                                 // + kk / 8
    const int b_row = wn * WARP_N + ((lane >> 4) << 3) + (lane & 7);  // + nj * 16
    const int b_chunk = (lane >> 3) & 1;                           // + kk / 8

    for (int kt = 0; kt < ktiles; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();

        {
            const int next = kt + STAGES - 1;
            if (next < ktiles)
                load_slice(smem + (next % STAGES) * STAGE_HALVES, A, B, M, N, K, m0, n0, next * BK, tid);
            cp_async_commit();
        }

        const half* sA = smem + (kt % STAGES) * STAGE_HALVES;
        const half* sB = sA + A_TILE;

#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t af[MI][4];
            uint32_t bf[NI][2];
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
                ldmatrix_x4(af[mi], smem_addr(sA + swz(a_row + mi * 16, a_chunk + (kk >> 3))));
            }
#pragma unroll
            for (int nj = 0; nj < NI / 2; ++nj) {
                uint32_t r[4];
                ldmatrix_x4(r, smem_addr(sB + swz(b_row + nj * 16, b_chunk + (kk >> 3))));
                bf[2 * nj][0] = r[0];      // n 0-7 of this pair,  k 0-7
                bf[2 * nj][1] = r[1];      // n 0-7,               k 8-15
                bf[2 * nj + 1][0] = r[2];  // n 8-15,              k 0-7
                bf[2 * nj + 1][1] = r[3];  // n 8-15,              k 8-15
            }
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int ni = 0; ni < NI; ++ni) mma_16816(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
        }
    }
    cp_async_wait<0>();  // only empty groups can remain; leave nothing in flight at exit

    // ---- epilogue: registers -> global, guarded ----
    const int g = lane >> 2;
    const int t = lane & 3;
    const bool vec = vec_store != 0;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
        const int row = m0 + wm * WARP_M + mi * 16 + g;
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
            const int col = n0 + wn * WARP_N + ni * 8 + 2 * t;
            store_pair(C, M, N, vec, row, col, acc[mi][ni][0], acc[mi][ni][1]);
            store_pair(C, M, N, vec, row + 8, col, acc[mi][ni][2], acc[mi][ni][3]);
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
    if (M < 1 || N < 1 || K < 8 || K % 8 != 0) return 1;
    if ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B)) % 16 != 0) return 1;

    // 64 KB of dynamic shared memory is above the 48 KB default: opt in once per process.
    static bool smem_opt_in_done = false;
    if (!smem_opt_in_done) {
        if (cudaFuncSetAttribute(mma_multistage_hgemm_tn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)SMEM_BYTES) != cudaSuccess)
            return 1;
        smem_opt_in_done = true;
    }

    const long long tiles = (long long)((M + BM - 1) / BM) * (long long)((N + BN - 1) / BN);
    if (tiles > 0x7fffffffLL) return 1;
    const int vec_store = (N % 2 == 0 && reinterpret_cast<uintptr_t>(C) % 4 == 0) ? 1 : 0;
    mma_multistage_hgemm_tn<<<(unsigned)tiles, THREADS, SMEM_BYTES, stream>>>(A, B, C, M, N, K, vec_store);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
