// cute_mma.cu -- legit variant: a CuTe (CUTLASS 4.x headers) tensor-core HGEMM.
//
//   C[M,N] = A[M,K] * B[N,K]^T   ("TN", torch.nn.functional.linear's layout), all row-major, half in memory:
//   C[m][n] = sum_k A[m*K + k] * B[n*K + k]
//
// Why it is legit (a strict evaluator must ACCEPT it): it includes header-only CuTe (no CUTLASS library, no
// cuBLAS), launches one kernel on `stream`, and uses only allowed runtime calls. Compile with
// -I<site-packages>/cutlass_library/source/include (pip install --no-deps nvidia-cutlass==4.2.0.0).
//
// What it is : correctness over cleverness.
//   - Global tensors: A (M,K):(K,1), B (N,K):(K,1) (64-bit row strides) -- both K-major, which is exactly what the "TN" MMA atom
//     SM80_16x8x16_F32F16F16F32_TN wants -- and C (M,N):(N,1), all built with make_tensor; local_tile cuts the
//     64x64x32 CTA tile.
//   - gmem -> smem: a TiledCopy of UniversalCopy<uint128_t> (plain 16-byte loads/stores), 128 threads laid out
//     32 (M/N) x 4 (K), 8 halves each; shared tiles are plain K-major (64,32):(32,1).
//   - smem -> registers: element copies of thr_mma.partition_A/B into register fragments.
//   - TiledMMA: 2x2 warps of SM80_16x8x16_F32F16F16F32_TN (fp32 accumulate) -> 32x16x16 per step, repeated to
//     cover 64x64x32.
//   - Epilogue: each thread converts its accumulators with __float2half_rn and stores them through
//     thr_mma.partition_C(gC).
//   Single-buffered: copy, __syncthreads, compute, __syncthreads.
// Shapes     : M % 64 == 0, N % 64 == 0, K % 32 == 0 (all >= 1), A and B 16-byte aligned. Returns 1 otherwise.
// Workspace  : none.
// Performance: modest tensor-core class (no cp.async pipeline, no ldmatrix, unswizzled smem, small tile).
//              Measured on an H200: ~82-85 TFLOP/s at 4096^3 / 8192^3 (cuBLAS: ~760).

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include <cute/tensor.hpp>

// A named namespace (not an anonymous one): CuTe itself opens anonymous namespaces inside namespace cute, and
// `using namespace cute;` inside our own anonymous namespace makes nvcc's generated launch stub ambiguous.
namespace cudal2_cute {

using namespace cute;

constexpr int kThreads = 128;
constexpr int kBM = 64, kBN = 64, kBK = 32;

using TileShape = Shape<Int<kBM>, Int<kBN>, Int<kBK>>;
using SmemLayoutA = Layout<Shape<Int<kBM>, Int<kBK>>, Stride<Int<kBK>, _1>>;  // K-major
using SmemLayoutB = Layout<Shape<Int<kBN>, Int<kBK>>, Stride<Int<kBK>, _1>>;  // K-major
using TiledMmaT = decltype(make_tiled_mma(SM80_16x8x16_F32F16F16F32_TN{}, Layout<Shape<_2, _2, _1>>{}));
using G2SCopyT = decltype(make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, half_t>{},
                                          Layout<Shape<_32, _4>, Stride<_4, _1>>{},  // 128 threads, K fastest
                                          Layout<Shape<_1, _8>>{}));                 // 8 halves (16 B) each

__global__ void __launch_bounds__(kThreads)
cute_hgemm_tn(const half_t* __restrict__ A, const half_t* __restrict__ B, __half* __restrict__ C, int M, int N,
              int K) {
    // Full tensors. Row strides are 64-bit: with int strides CuTe computes m * K in 32 bits, which overflows
    // once M * K (or M * N) reaches 2^31 elements (the evaluator allows dimensions up to 2^17).
    Tensor mA = make_tensor(make_gmem_ptr(A), make_shape(M, K), make_stride(int64_t(K), Int<1>{}));  // (M,K)
    Tensor mB = make_tensor(make_gmem_ptr(B), make_shape(N, K), make_stride(int64_t(K), Int<1>{}));  // (N,K)
    Tensor mC = make_tensor(make_gmem_ptr(C), make_shape(M, N), make_stride(int64_t(N), Int<1>{}));  // (M,N)

    // This CTA's tiles: blockIdx.y -> M tile, blockIdx.x -> N tile, all of K.
    auto cta_tiler = TileShape{};
    auto cta_coord = make_coord(int(blockIdx.y), int(blockIdx.x), _);
    Tensor gA = local_tile(mA, cta_tiler, cta_coord, Step<_1, X, _1>{});  // (BM,BK,k_tiles)
    Tensor gB = local_tile(mB, cta_tiler, cta_coord, Step<X, _1, _1>{});  // (BN,BK,k_tiles)
    Tensor gC = local_tile(mC, cta_tiler, cta_coord, Step<_1, _1, X>{});  // (BM,BN)

    __shared__ __align__(128) half_t smem_a[cosize_v<SmemLayoutA>];
    __shared__ __align__(128) half_t smem_b[cosize_v<SmemLayoutB>];
    Tensor sA = make_tensor(make_smem_ptr(smem_a), SmemLayoutA{});  // (BM,BK)
    Tensor sB = make_tensor(make_smem_ptr(smem_b), SmemLayoutB{});  // (BN,BK)

    // gmem -> smem partitioning.
    G2SCopyT g2s;
    ThrCopy thr_copy = g2s.get_slice(threadIdx.x);
    Tensor tAgA = thr_copy.partition_S(gA);  // (CPY,CPY_M,CPY_K,k_tiles)
    Tensor tAsA = thr_copy.partition_D(sA);  // (CPY,CPY_M,CPY_K)
    Tensor tBgB = thr_copy.partition_S(gB);  // (CPY,CPY_N,CPY_K,k_tiles)
    Tensor tBsB = thr_copy.partition_D(sB);  // (CPY,CPY_N,CPY_K)

    // MMA partitioning.
    TiledMmaT tiled_mma;
    ThrMMA thr_mma = tiled_mma.get_slice(threadIdx.x);
    Tensor tCsA = thr_mma.partition_A(sA);            // (MMA,MMA_M,MMA_K)
    Tensor tCsB = thr_mma.partition_B(sB);            // (MMA,MMA_N,MMA_K)
    Tensor tCrA = thr_mma.make_fragment_A(tCsA);      // registers, half_t
    Tensor tCrB = thr_mma.make_fragment_B(tCsB);      // registers, half_t
    Tensor tCgC = thr_mma.partition_C(gC);            // (MMA,MMA_M,MMA_N), __half in gmem
    Tensor tCrC = thr_mma.partition_fragment_C(gC);   // (MMA,MMA_M,MMA_N), float accumulators
    clear(tCrC);

    const int k_tiles = size<2>(gA);
    for (int kt = 0; kt < k_tiles; ++kt) {
        copy(g2s, tAgA(_, _, _, kt), tAsA);
        copy(g2s, tBgB(_, _, _, kt), tBsB);
        __syncthreads();
        copy(tCsA, tCrA);
        copy(tCsB, tCrB);
        gemm(tiled_mma, tCrA, tCrB, tCrC);
        __syncthreads();  // the next iteration overwrites sA/sB
    }

    CUTE_UNROLL
    for (int i = 0; i < size(tCrC); ++i) tCgC(i) = __float2half_rn(tCrC(i));
}

}  // namespace cudal2_cute

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
    using cudal2_cute::kBK;
    using cudal2_cute::kBM;
    using cudal2_cute::kBN;
    using cudal2_cute::kThreads;
    if (M % kBM != 0 || N % kBN != 0 || K % kBK != 0) return 1;
    if ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B)) % 16 != 0) return 1;
    const unsigned gx = (unsigned)(N / kBN), gy = (unsigned)(M / kBM);
    if (gy > 65535u) return 1;
    cudal2_cute::cute_hgemm_tn<<<dim3(gx, gy), kThreads, 0, stream>>>(
        reinterpret_cast<const cute::half_t*>(A), reinterpret_cast<const cute::half_t*>(B), C, M, N, K);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
