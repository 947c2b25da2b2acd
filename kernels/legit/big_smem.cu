// big_smem.cu -- legit variant: a tiled tensor-core kernel using 108 KB of dynamic shared memory.
//
//   C[M,N] = A[M,K] * B[N,K]^T   ("TN", torch.nn.functional.linear's layout), all row-major, half in memory:
//   C[m][n] = sum_k A[m*K + k] * B[n*K + k]
//
// Why it is legit (a strict evaluator must ACCEPT it): more than 48 KB of dynamic shared memory needs an
// explicit opt-in; the file raises cudaFuncAttributeMaxDynamicSharedMemorySize once per process (guarded by a
// static bool) with cudaFuncSetAttribute, an allowed runtime call, and launches on `stream`. Nothing else.
//
// What it is : 128x128 block tile, BK = 64, 3-stage cp.async pipeline (3 x 36 KB = 108 KB), 256 threads =
//              8 warps (2 along M x 4 along N), warp tile 64x32 = 4x2 wmma 16x16x16 fragments, half inputs,
//              float accumulators. Shared rows are padded to 72 halves (144 bytes). cp.async with src-size 0
//              zero-fills rows beyond M/N and 16-byte chunks beyond K. The epilogue reuses the pipeline buffers
//              as a 128x132 float tile (66 KB) and writes C with guards, rounding with __float2half_rn.
// Shapes     : any M >= 1, N >= 1; K >= 8 with K % 8 == 0; A and B 16-byte aligned. Returns 1 otherwise.
// Workspace  : none.
// Performance: wmma + cp.async class: well above the seed wmma.cu, below the inline-PTX mma_multistage.cu
//              (no ldmatrix swizzle; wmma's fragment loads from padded rows). Measured on an H200: ~287-305
//              TFLOP/s at 4096^3 / 8192^3, ~40% of cuBLAS.

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stddef.h>
#include <stdint.h>

namespace {

using namespace nvcuda;

constexpr int BM = 128, BN = 128, BK = 64, STAGES = 3;
constexpr int THREADS = 256;
constexpr int WARPS_N = 4;        // 2 warps along M
constexpr int WM = 64, WN = 32;   // warp tile
constexpr int FM = WM / 16;       // 4 fragments along M
constexpr int FN = WN / 16;       // 2 fragments along N
constexpr int LDS = BK + 8;       // 72 halves = 144 bytes per smem row (16-byte multiple, wmma ldm multiple of 8)
constexpr int LDC = BN + 4;       // 132 floats per row of the epilogue tile
constexpr int CHUNKS = BK / 8;    // 8 x 16-byte chunks per row
constexpr int A_HALVES = BM * LDS;
constexpr int STAGE_HALVES = (BM + BN) * LDS;  // 18432 halves = 36864 bytes
constexpr size_t SMEM_BYTES = (size_t)STAGES * STAGE_HALVES * sizeof(half);  // 110592 bytes = 108 KB

static_assert(SMEM_BYTES > 48 * 1024, "the point of this file: above the 48 KB default");
static_assert((size_t)BM * LDC * sizeof(float) <= SMEM_BYTES, "epilogue tile must fit in the pipeline buffers");

__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* src, bool valid) {
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
    const int src_bytes = valid ? 16 : 0;  // 0: read nothing, write 16 zero bytes
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void load_stage(half* stage, const half* __restrict__ A, const half* __restrict__ B,
                                           int M, int N, int K, int m0, int n0, int k0, int tid) {
    half* sA = stage;
    half* sB = stage + A_HALVES;
#pragma unroll
    for (int i = 0; i < (BM * CHUNKS) / THREADS; ++i) {  // 4 chunks of A per thread
        const int q = tid + i * THREADS;
        const int r = q / CHUNKS, c = (q % CHUNKS) * 8;
        const bool ok = (m0 + r < M) && (k0 + c < K);
        cp_async_16(sA + r * LDS + c, ok ? A + (size_t)(m0 + r) * (size_t)K + (k0 + c) : A, ok);
    }
#pragma unroll
    for (int i = 0; i < (BN * CHUNKS) / THREADS; ++i) {  // 4 chunks of B per thread
        const int q = tid + i * THREADS;
        const int r = q / CHUNKS, c = (q % CHUNKS) * 8;
        const bool ok = (n0 + r < N) && (k0 + c < K);
        cp_async_16(sB + r * LDS + c, ok ? B + (size_t)(n0 + r) * (size_t)K + (k0 + c) : B, ok);
    }
}

__global__ void __launch_bounds__(THREADS)
big_smem_hgemm_tn(const half* __restrict__ A, const half* __restrict__ B, half* __restrict__ C, int M, int N,
                  int K) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    half* smem = reinterpret_cast<half*>(smem_raw);

    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int m0 = blockIdx.y * BM;
    const int n0 = blockIdx.x * BN;
    const int ktiles = (K + BK - 1) / BK;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles) load_stage(smem + s * STAGE_HALVES, A, B, M, N, K, m0, n0, s * BK, tid);
        cp_async_commit();
    }

    for (int kt = 0; kt < ktiles; ++kt) {
        cp_async_wait<STAGES - 2>();  // slice kt landed (this thread's copies)
        __syncthreads();              // ... everyone's; and stage (kt-1)%STAGES is no longer being read
        const int next = kt + STAGES - 1;
        if (next < ktiles) load_stage(smem + (next % STAGES) * STAGE_HALVES, A, B, M, N, K, m0, n0, next * BK, tid);
        cp_async_commit();

        const half* sA = smem + (kt % STAGES) * STAGE_HALVES;
        const half* sB = sA + A_HALVES;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a[FM];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> b[FN];
#pragma unroll
            for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(a[i], sA + (wm * WM + i * 16) * LDS + kk, LDS);
#pragma unroll
            for (int j = 0; j < FN; ++j) wmma::load_matrix_sync(b[j], sB + (wn * WN + j * 16) * LDS + kk, LDS);
#pragma unroll
            for (int i = 0; i < FM; ++i)
#pragma unroll
                for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // all warps are done reading the pipeline buffers before they become the C tile

    float* Cs = reinterpret_cast<float*>(smem_raw);
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j)
            wmma::store_matrix_sync(Cs + (wm * WM + i * 16) * LDC + (wn * WN + j * 16), acc[i][j], LDC,
                                    wmma::mem_row_major);
    __syncthreads();

    for (int p = tid; p < BM * BN; p += THREADS) {
        const int r = p / BN, c = p % BN;
        const int gm = m0 + r, gn = n0 + c;
        if (gm < M && gn < N) C[(size_t)gm * (size_t)N + gn] = __float2half_rn(Cs[r * LDC + c]);
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

    static bool smem_limit_raised = false;  // once per process
    if (!smem_limit_raised) {
        if (cudaFuncSetAttribute(big_smem_hgemm_tn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM_BYTES) !=
            cudaSuccess)
            return 1;
        smem_limit_raised = true;
    }

    const unsigned gx = (unsigned)((N + BN - 1) / BN);
    const unsigned gy = (unsigned)((M + BM - 1) / BM);
    if (gy > 65535u) return 1;
    big_smem_hgemm_tn<<<dim3(gx, gy), THREADS, SMEM_BYTES, stream>>>(A, B, C, M, N, K);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
