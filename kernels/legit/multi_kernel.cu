// multi_kernel.cu -- legit variant: several kernel launches per call, chained through the workspace.
//
//   C[M,N] = A[M,K] * B[N,K]^T   ("TN", torch.nn.functional.linear's layout), all row-major, half in memory:
//   C[m][n] = sum_k A[m*K + k] * B[n*K + k]
//
// Why it is legit (a strict evaluator must ACCEPT it): every launch goes on `stream`, in order, so each kernel
// sees the previous one's results without any synchronisation; the fp32 scratch tile lives in the workspace the
// evaluator provides (cudal2_workspace_bytes = M * N * 4), and the first kernel initialises all of it before
// anything reads it (the workspace holds garbage on entry). Nothing is allocated, nothing synchronises.
//
// What it is : per call, in stream order,
//                1. zero_fill_kernel        : workspace[M][N] (float) = 0                      (1 launch)
//                2. gemm_accumulate_kernel  : workspace += A[:, k-range] * B[:, k-range]^T     (2 launches,
//                   one per half of K; each wmma warp loads its 32x32 fp32 accumulator tile from the workspace,
//                   runs 16x16x16 mma_sync with fragments loaded straight from global memory -- A as
//                   row_major with ldm = K, B as col_major with ldm = K since B[N,K] row-major is B^T
//                   col-major -- and stores the tile back; each element has exactly one owner, no atomics)
//                3. convert_kernel          : C = __float2half_rn(workspace)                   (1 launch)
// Shapes     : M % 64 == 0, N % 64 == 0, K % 16 == 0 (all >= 1); A, B and the workspace 32-byte aligned
//              (wmma pointer rule), C 4-byte aligned, workspace >= M * N * 4 bytes. Returns 1 otherwise.
// Performance: slow tensor-core class (no shared-memory reuse; the fp32 tile makes 2 extra round trips).
//              Measured on an H200: ~55-59 TFLOP/s at 4096^3 / 8192^3.

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stddef.h>
#include <stdint.h>

namespace {

using namespace nvcuda;

constexpr int BM = 64, BN = 64;   // block tile, 4 warps of 32x32
constexpr int THREADS = 128;

__global__ void zero_fill_kernel(float4* __restrict__ ws4, size_t n4) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride)
        ws4[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// ws[m][n] += sum_{k in [k_begin, k_end)} A[m][k] * B[n][k]; k_begin, k_end multiples of 16.
__global__ void __launch_bounds__(THREADS)
gemm_accumulate_kernel(const half* __restrict__ A, const half* __restrict__ B, float* __restrict__ ws, int N,
                       int K, int k_begin, int k_end) {
    const int warp = threadIdx.x / 32;
    const int row0 = blockIdx.y * BM + (warp / 2) * 32;  // this warp's 32x32 tile
    const int col0 = blockIdx.x * BN + (warp % 2) * 32;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::load_matrix_sync(acc[i][j], ws + (size_t)(row0 + i * 16) * (size_t)N + (col0 + j * 16), N,
                                   wmma::mem_row_major);

    for (int k = k_begin; k < k_end; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a[2];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> b[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], A + (size_t)(row0 + i * 16) * (size_t)K + k, K);
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], B + (size_t)(col0 + j * 16) * (size_t)K + k, K);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }

#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(ws + (size_t)(row0 + i * 16) * (size_t)N + (col0 + j * 16), acc[i][j], N,
                                    wmma::mem_row_major);
}

// C = half_rn(ws), two elements per thread (M*N is even since N % 64 == 0).
__global__ void convert_kernel(const float2* __restrict__ ws2, half2* __restrict__ C2, size_t n2) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n2; i += stride) {
        const float2 v = ws2[i];
        C2[i] = __floats2half2_rn(v.x, v.y);
    }
}

unsigned grid_for(size_t n, unsigned threads) {
    size_t blocks = (n + threads - 1) / threads;
    const size_t cap = 132u * 32u;  // the grid-stride loops cover the rest
    if (blocks > cap) blocks = cap;
    if (blocks < 1) blocks = 1;
    return (unsigned)blocks;
}

}  // namespace

extern "C" size_t cudal2_workspace_bytes(int M, int N, int K) {
    (void)K;
    if (M < 1 || N < 1) return 0;
    return (size_t)M * (size_t)N * sizeof(float);
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    if (M < 1 || N < 1 || K < 1) return 1;
    if (M % BM != 0 || N % BN != 0 || K % 16 != 0) return 1;
    const size_t MN = (size_t)M * (size_t)N;
    if (workspace == nullptr || workspace_bytes < MN * sizeof(float)) return 1;
    if ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B) | reinterpret_cast<uintptr_t>(workspace)) %
            32 != 0)
        return 1;
    if (reinterpret_cast<uintptr_t>(C) % 4 != 0) return 1;
    float* ws = static_cast<float*>(workspace);

    // 1. initialise the scratch tile (MN is a multiple of 4096, so float4 covers it exactly)
    zero_fill_kernel<<<grid_for(MN / 4, 256), 256, 0, stream>>>(reinterpret_cast<float4*>(ws), MN / 4);
    if (cudaGetLastError() != cudaSuccess) return 1;

    // 2. accumulate in two K ranges: [0, k_split) and [k_split, K), both multiples of 16
    const unsigned gx = (unsigned)(N / BN), gy = (unsigned)(M / BM);
    if (gy > 65535u) return 1;
    const int k_split = ((K / 16 + 1) / 2) * 16;  // == K when K == 16: then the second launch is skipped
    const int ranges[3] = {0, k_split, K};
    for (int r = 0; r < 2; ++r) {
        if (ranges[r] >= ranges[r + 1]) continue;
        gemm_accumulate_kernel<<<dim3(gx, gy), THREADS, 0, stream>>>(A, B, ws, N, K, ranges[r], ranges[r + 1]);
        if (cudaGetLastError() != cudaSuccess) return 1;
    }

    // 3. epilogue conversion
    convert_kernel<<<grid_for(MN / 2, 256), 256, 0, stream>>>(reinterpret_cast<const float2*>(ws),
                                                              reinterpret_cast<half2*>(C), MN / 2);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
