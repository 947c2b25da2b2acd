// templated_macros.cu -- legit variant: templates over tile sizes, dispatch by shape, indexing macros,
// __launch_bounds__, and a __constant__ array read by the kernel.
//
//   C[M,N] = A[M,K] * B[N,K]^T   ("TN", torch.nn.functional.linear's layout), all row-major, half in memory:
//   C[m][n] = sum_k A[m*K + k] * B[n*K + k]
//
// Why it is legit (a strict evaluator must ACCEPT it): templates, macros, `__constant__` data and launch bounds
// are ordinary CUDA C++; the host code only launches kernels on `stream` and checks cudaGetLastError.
//
// What it is : one kernel template, wmma_tiled_kernel<BM, BN, BK, WARPS_M, WARPS_N, CFG>, instantiated twice:
//                TileCfgLarge = 128 x 128 x 32, 8 warps (2 x 4), warp tile 64 x 32  (big problems)
//                TileCfgSmall =  64 x  64 x 32, 4 warps (2 x 2), warp tile 32 x 32  (problems with few tiles)
//              The host picks one by shape (enough 128x128 tiles to fill the 132 SMs -> large). Blocks are
//              rasterised in groups of c_raster_group[CFG] tile-rows (a __constant__ array) for L2 reuse.
//              Each K slice of A and B is staged in shared memory with predicated 16-byte loads (zero fill);
//              wmma 16x16x16, half in, float accumulate (B[N,K] row-major is loaded as a col_major K x N
//              fragment). Epilogue: each warp bounces one 16x16 fragment at a time through a private float
//              scratch tile and writes it with guards and __float2half_rn.
// Shapes     : any M >= 1, N >= 1; K >= 8 with K % 8 == 0; A and B 16-byte aligned. Returns 1 otherwise.
// Workspace  : none.
// Performance: wmma class, single-buffered (load, sync, compute, sync). Measured on an H200: ~190-200 TFLOP/s
//              at 4096^3 / 8192^3 (large config), ~20 at 128x4096x8192 (small config).

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stddef.h>
#include <stdint.h>

// ---- indexing macros ----
#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
#define GMEM_IDX(row, col, ld) ((size_t)(row) * (size_t)(ld) + (size_t)(col))  // 64-bit row-major offset
#define SMEM_IDX(row, col, ld) ((row) * (ld) + (col))
#define WARP_SIZE 32
#define RETURN_IF_LAUNCH_FAILED()                          \
    do {                                                   \
        if (cudaGetLastError() != cudaSuccess) return 1;   \
    } while (0)

namespace {

using namespace nvcuda;

// Rasterisation group height (in tile-rows) per configuration id; read by the kernel from constant memory.
__constant__ int c_raster_group[2] = {8, 4};

enum : int { kCfgLarge = 0, kCfgSmall = 1 };

template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int CFG>
struct TileCfg {
    static constexpr int kBM = BM, kBN = BN, kBK = BK, kWarpsM = WARPS_M, kWarpsN = WARPS_N, kCfg = CFG;
    static constexpr int kThreads = WARPS_M * WARPS_N * WARP_SIZE;
};
using TileCfgLarge = TileCfg<128, 128, 32, 2, 4, kCfgLarge>;
using TileCfgSmall = TileCfg<64, 64, 32, 2, 2, kCfgSmall>;

// Copy rows x BK halves of a K-contiguous operand into shared memory [row][LDS], zero outside the matrix.
template <int ROWS, int BK, int LDS, int THREADS>
__device__ __forceinline__ void load_tile(half* __restrict__ dst, const half* __restrict__ src, int rows_valid,
                                          int row0, int K, int k0, int tid) {
    constexpr int kChunksPerRow = BK / 8;
    constexpr int kChunks = ROWS * kChunksPerRow;
    static_assert(kChunks % THREADS == 0, "whole chunks per thread");
#pragma unroll
    for (int i = 0; i < kChunks / THREADS; ++i) {
        const int q = tid + i * THREADS;
        const int r = q / kChunksPerRow;
        const int c = (q % kChunksPerRow) * 8;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (row0 + r < rows_valid && k0 + c < K) v = *reinterpret_cast<const uint4*>(src + GMEM_IDX(row0 + r, k0 + c, K));
        *reinterpret_cast<uint4*>(dst + SMEM_IDX(r, c, LDS)) = v;
    }
}

template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int CFG>
__global__ void __launch_bounds__(WARPS_M * WARPS_N * WARP_SIZE)
wmma_tiled_kernel(const half* __restrict__ A, const half* __restrict__ B, half* __restrict__ C, int M, int N,
                  int K) {
    constexpr int THREADS = WARPS_M * WARPS_N * WARP_SIZE;
    constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;  // warp tile
    constexpr int FM = WM / 16, FN = WN / 16;            // fragments per warp
    constexpr int LDS = BK + 8;                          // padded smem row (halves)
    constexpr int LDE = 16 + 4;                          // epilogue scratch row (floats)
    static_assert(WM % 16 == 0 && WN % 16 == 0 && BK % 16 == 0, "wmma tile multiples");

    __shared__ __align__(128) half As[BM * LDS];
    __shared__ __align__(128) half Bs[BN * LDS];
    __shared__ __align__(128) float Es[WARPS_M * WARPS_N][16 * LDE];

    // Grouped rasterisation, group height from constant memory.
    const int tiles_m = CEIL_DIV(M, BM), tiles_n = CEIL_DIV(N, BN);
    const int group_m = c_raster_group[CFG];
    const int pid = blockIdx.x;
    const int per_group = group_m * tiles_n;
    const int first_m = (pid / per_group) * group_m;
    const int rows_in_group = min(tiles_m - first_m, group_m);
    const int tile_m = first_m + (pid % per_group) % rows_in_group;
    const int tile_n = (pid % per_group) / rows_in_group;
    const int m0 = tile_m * BM, n0 = tile_n * BN;

    const int tid = threadIdx.x;
    const int warp = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    for (int k0 = 0; k0 < K; k0 += BK) {
        load_tile<BM, BK, LDS, THREADS>(As, A, M, m0, K, k0, tid);
        load_tile<BN, BK, LDS, THREADS>(Bs, B, N, n0, K, k0, tid);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a[FM];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> b[FN];
#pragma unroll
            for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(a[i], As + SMEM_IDX(wm * WM + i * 16, kk, LDS), LDS);
#pragma unroll
            for (int j = 0; j < FN; ++j) wmma::load_matrix_sync(b[j], Bs + SMEM_IDX(wn * WN + j * 16, kk, LDS), LDS);
#pragma unroll
            for (int i = 0; i < FM; ++i)
#pragma unroll
                for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

    // Epilogue through a warp-private 16x16 float scratch tile.
    float* scratch = Es[warp];
#pragma unroll
    for (int i = 0; i < FM; ++i) {
#pragma unroll
        for (int j = 0; j < FN; ++j) {
            wmma::store_matrix_sync(scratch, acc[i][j], LDE, wmma::mem_row_major);
            __syncwarp();
            const int r0 = m0 + wm * WM + i * 16;
            const int c0 = n0 + wn * WN + j * 16;
            for (int e = lane; e < 256; e += WARP_SIZE) {
                const int r = e / 16, c = e % 16;
                if (r0 + r < M && c0 + c < N) C[GMEM_IDX(r0 + r, c0 + c, N)] = __float2half_rn(scratch[SMEM_IDX(r, c, LDE)]);
            }
            __syncwarp();  // scratch is overwritten by the next fragment
        }
    }
}

template <class Cfg>
int launch(const half* A, const half* B, half* C, int M, int N, int K, cudaStream_t stream) {
    const long long tiles = (long long)CEIL_DIV(M, Cfg::kBM) * (long long)CEIL_DIV(N, Cfg::kBN);
    if (tiles > 0x7fffffffLL) return 1;
    wmma_tiled_kernel<Cfg::kBM, Cfg::kBN, Cfg::kBK, Cfg::kWarpsM, Cfg::kWarpsN, Cfg::kCfg>
        <<<(unsigned)tiles, Cfg::kThreads, 0, stream>>>(A, B, C, M, N, K);
    RETURN_IF_LAUNCH_FAILED();
    return 0;
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
    const long long large_tiles = (long long)CEIL_DIV(M, TileCfgLarge::kBM) * CEIL_DIV(N, TileCfgLarge::kBN);
    if (large_tiles >= 132) return launch<TileCfgLarge>(A, B, C, M, N, K, stream);
    return launch<TileCfgSmall>(A, B, C, M, N, K, stream);
}
