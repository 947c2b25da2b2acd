// graph_gap.cu: what one node costs in the evaluator's offline timing (CUDA-graph replay of R back-to-back calls).
// It prices the pieces a kernel design can add to a call: a second kernel (split-K's workspace reduction), a
// memset node (zeroing split-K counters), a last-arrival cut with each fence flavour (the small family's grid_k), the
// same cut summed in a thread-block cluster (pulled and pushed), a cluster launch, the cold-input floor of a tiny GEMM
// call, a cooperative launch whose CTAs wait for one another (the small family's spread), and what the store pattern
// costs on a short-K wide output (mma fragments' 4-byte stores against 16-byte rows), and the memory traffic alone of a
// short-K wide call (1024x4096x64) in three tilings, and from persistent CTAs that overlap a tile's stores with the
// next one's loads. No cuBLAS, no cudal2 code: build and run with
//
//     nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/graph_gap benchmarks/graph_gap.cu && /tmp/graph_gap
//
// Each pattern is captured R=64 times into one graph (as the harness does), the graph is replayed REPLAYS times
// after a warm-up, and the median replay time / R is printed in microseconds, one `name us` line per pattern.
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "cuda_check.h"

namespace cg = cooperative_groups;

constexpr int R = 64;          // calls per graph, as in the harness's offline mode
constexpr int REPLAYS = 200;   // timed replays per pattern
constexpr int SETS = 64;       // rotating input sets for the cold-read pattern: 64 x 2 MiB > the 50 MiB L2
constexpr size_t SET_BYTES = 2u << 20;

__global__ void empty_kernel() {}

// One CTA per SM-slot, each bumping one counter and fencing: the arrival protocol a one-kernel split-K reduction
// ("the last CTA of a tile sums the partials") adds to every CTA.
__global__ void arrive_kernel(unsigned* counters, int per_counter) {
  __shared__ unsigned ticket;
  if (threadIdx.x == 0) {
    __threadfence();
    ticket = atomicAdd(&counters[blockIdx.x / per_counter], 1u);
  }
  __syncthreads();
  if (threadIdx.x == 0 && ticket % per_counter == per_counter - 1) counters[blockIdx.x / per_counter] = 0;
}

// The last-arrival protocol as the families render it (cuda_parts.LAST_ARRIVAL_SYNC): the last CTA resets its
// counter and then fences, so its fence also waits for the reset; arrive_kernel above resets after everything.
__global__ void last_arrival_kernel(unsigned* counters, unsigned per_counter) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(&counters[blockIdx.x / per_counter], 1u) == per_counter - 1;
    if (last) {
      atomicExch(&counters[blockIdx.x / per_counter], 0u);
      __threadfence();
    }
  }
  __syncthreads();
}

// The spread protocol (cudal2/kernels/cuda_parts.py, ALL_ARRIVED_SYNC) on its own: every CTA counts in, waits until
// the other CTAs of its counter have, then counts out; the last out resets the counter. Needs a cooperative launch.
__global__ void spread_kernel(unsigned* counters, unsigned per_counter) {
  unsigned* counter = &counters[blockIdx.x / per_counter];
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
    while (*reinterpret_cast<volatile unsigned*>(counter) < per_counter) {
    }
    __threadfence();
  }
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(counter, 1u) == 2 * per_counter - 1) atomicExch(counter, 0u);
}

// The fence a cut's protocol uses. Sc: __threadfence() (PTX fence.sc.gpu, what cuda_parts.LAST_ARRIVAL renders);
// AcqRel: fence.acq_rel.gpu, all that passing a message (partials, then a ticket) needs, as CUTLASS's GenericBarrier
// does; None: no fence at all (wrong: the last CTA may read stale partials; it prices the fences, nothing else).
enum class Fence { Sc, AcqRel, None };
template <Fence F>
__device__ __forceinline__ void fence_as() {
  if constexpr (F == Fence::Sc) __threadfence();
  if constexpr (F == Fence::AcqRel) asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
}

// A whole last-arrival cut, as the small family's grid_k 16 runs it on a 64x64 output in 16x16 tiles: 256 CTAs of
// 128 threads, each writes its 1 KiB fp32 partial past L1, fences, draws its tile's ticket; the last of a tile's 16
// resets it, fences, reads the 16 partials (16 KiB) and writes 512 B of halves. With arrive=false the CTAs only write
// their partials (the floor the protocol adds to).
template <Fence F, bool arrive>
__global__ void cut_kernel(float* work, unsigned* counters, half* out) {
  const unsigned tile = blockIdx.x / 16;
  __shared__ int last;
  for (int i = threadIdx.x; i < 256; i += blockDim.x) __stcg(work + blockIdx.x * 256 + i, (float)(i + blockIdx.x));
  if (!arrive) return;
  __syncthreads();
  if (threadIdx.x == 0) {
    fence_as<F>();
    last = atomicAdd(&counters[tile], 1u) == 15;
    if (last) {
      atomicExch(&counters[tile], 0u);
      fence_as<F>();
    }
  }
  __syncthreads();
  if (!last) return;
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    float sum = 0.f;
    for (int r = 0; r < 16; ++r) sum += __ldcg(work + (tile * 16 + r) * 256 + i);
    out[tile * 256 + i] = __float2half(sum);
  }
}

// The same cut summed in a thread-block cluster instead (the small family's cluster_k): a tile's CL CTAs are one
// cluster, the partials stay in shared memory, no global round trip. Pull (as cluster_k renders it): each CTA parks
// its partial in its own shared memory, a cluster barrier, CTA r reads its 1/CL share of the tile from all CL CTAs
// through distributed shared memory and writes it, a second barrier so that no CTA leaves while its memory is read.
// Push: each CTA writes each share of its partial into the shared memory of the CTA that owns it, one barrier, each
// CTA sums its share locally and writes it.
template <int CL, bool push>
__global__ void cluster_cut_kernel(half* out) {
  constexpr int SHARE = 256 / CL;
  __shared__ float part[256];        // pull: this CTA's partial
  __shared__ float shares[CL][SHARE];  // push: every CTA's partial of this CTA's share
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank(), tile = blockIdx.x / CL;
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    const float v = (float)(i + blockIdx.x);
    if (push)
      cluster.map_shared_rank(&shares[0][0], i / SHARE)[rank * SHARE + i % SHARE] = v;
    else
      part[i] = v;
  }
  cluster.sync();
  for (int i = threadIdx.x; i < SHARE; i += blockDim.x) {
    float sum = 0.f;
    for (int q = 0; q < CL; ++q) sum += push ? shares[q][i] : cluster.map_shared_rank(part, q)[rank * SHARE + i];
    out[tile * 256 + rank * SHARE + i] = __float2half(sum);
  }
  if (!push) cluster.sync();
}

// A 64x64x64 GEMM's memory traffic without its math: one CTA reads 2 x 8 KiB (A and B tiles) and writes 8 KiB.
__global__ void cold_tile_kernel(const int4* in, int4* out) {
  int4 a = in[threadIdx.x], b = in[threadIdx.x + 512];
  a.x ^= b.x;
  a.y ^= b.y;
  out[threadIdx.x] = a;
}

__global__ void cluster_kernel() {}

// A 1024x1024 half output (2 MiB) in 32x64 tiles, 512 CTAs of 64 threads, as the small family's default config stores
// it after its K sum: each of 2 warps a 32x32 warp tile of m16n8 fragments, lane (g, t) a half2 at rows g and g + 8,
// columns 2t, 2t + 1: 8 rows x 16 bytes per warp store. N = 1024.
__global__ void store_fragments_kernel(half2* C) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const half2 v = __floats2half2_rn((float)threadIdx.x, 1.0f);
  for (int mi = 0; mi < 2; ++mi)
    for (int ni = 0; ni < 4; ++ni) {
      const int row = blockIdx.y * 32 + mi * 16 + g, col = blockIdx.x * 64 + warp * 32 + ni * 8 + 2 * t;
      C[(row * 1024 + col) / 2] = v;
      C[((row + 8) * 1024 + col) / 2] = v;
    }
}

// The same tiles written as 16-byte row chunks (what staging the tile through shared memory would give): consecutive
// threads, consecutive 16 bytes of a row, 512 contiguous bytes per warp store.
__global__ void store_rows_kernel(int4* C) {
  const int4 v = make_int4(threadIdx.x, 1, 2, 3);
  for (int c = threadIdx.x; c < 32 * 8; c += 64) {  // 32 rows x 8 chunks of 8 halves
    const int row = blockIdx.y * 32 + c / 8, col = blockIdx.x * 64 + (c % 8) * 8;
    C[(row * 1024 + col) / 8] = v;
  }
}

// A short-K wide call's traffic without its math, where the families lose to cuBLAS (1024x4096x64: 0.93x on the H200,
// an 8 MiB output from 640 KiB of inputs): each CTA reads its BM x 64 rows of A and BN x 64 rows of B (16-byte loads,
// into shared memory), then writes its BM x BN tile of C as 16-byte row chunks, each made from loaded values (no store
// can start before the loads land). With LOAD false it only writes. Offline timing rotates 32 sets of A, B and C
// (8.6 MB each, 276 MB in all: past L2), as the harness does for this shape. What this takes is the floor a short-K
// kernel's memory traffic sets; a kernel near it would beat cuBLAS by cuBLAS / floor.
constexpr int WIDE_M = 1024, WIDE_N = 4096, WIDE_K = 64, WIDE_SETS = 32;
constexpr size_t WIDE_A = (size_t)WIDE_M * WIDE_K / 8, WIDE_B = (size_t)WIDE_N * WIDE_K / 8;  // int4s (8 halves)
constexpr size_t WIDE_SET = WIDE_A + WIDE_B + (size_t)WIDE_M * WIDE_N / 8;                     // int4s per set
// A C chunk made from one A chunk and one B chunk: the store depends on both loads.
__device__ __forceinline__ int4 xor4(int4 x, int4 y) { return make_int4(x.x ^ y.x, x.y ^ y.y, x.z ^ y.z, x.w ^ y.w); }
template <int BM, int BN, bool LOAD>
__global__ void __launch_bounds__(256) wide_tile_kernel(const int4* set) {
  __shared__ int4 a[BM * WIDE_K / 8], b[BN * WIDE_K / 8];
  int4* C = const_cast<int4*>(set) + WIDE_A + WIDE_B;
  if (LOAD) {
    const int4* at = set + (size_t)blockIdx.y * BM * (WIDE_K / 8);
    const int4* bt = set + WIDE_A + (size_t)blockIdx.x * BN * (WIDE_K / 8);
    for (int i = threadIdx.x; i < BM * WIDE_K / 8; i += blockDim.x) a[i] = at[i];
    for (int i = threadIdx.x; i < BN * WIDE_K / 8; i += blockDim.x) b[i] = bt[i];
    __syncthreads();
  }
  for (int c = threadIdx.x; c < BM * BN / 8; c += blockDim.x) {  // chunk j of row r: 8 halves
    const int r = c / (BN / 8), j = c % (BN / 8);
    int4 v = make_int4(c, r, j, 0);
    if (LOAD) v = xor4(a[(r * 8 + j) % (BM * 8)], b[(j * 8 + (r + j) % 8) % (BN * 8)]);  // no bank clashes
    C[(size_t)(blockIdx.y * BM + r) * (WIDE_N / 8) + blockIdx.x * (BN / 8) + j] = v;
  }
}

// The same traffic from persistent CTAs that overlap one tile's stores with the next tile's loads: each CTA walks the
// tiles blockIdx.x, + gridDim.x, ...; a tile's A and B rows sit in registers (loaded while the previous tile was being
// stored), go to shared memory, the next tile's loads are issued, and then the tile is stored. The floor a short-K
// kernel with a load/store pipeline could reach (the tiles' loads no longer wait in line before the first store).
template <int BM, int BN, int THREADS>
__global__ void __launch_bounds__(THREADS) wide_pipelined_kernel(const int4* set) {
  constexpr int ROW = WIDE_K / 8, PER = (BM + BN) * ROW / THREADS;  // int4s per row; int4s per thread per tile
  constexpr int TILES_N = WIDE_N / BN, TILES = TILES_N * (WIDE_M / BM);
  __shared__ int4 ab[(BM + BN) * ROW];  // the tile's A rows, then its B rows
  int4* C = const_cast<int4*>(set) + WIDE_A + WIDE_B;
  int4 next[PER];
  auto load = [&](int tile) {
    const int4* at = set + (size_t)(tile / TILES_N) * BM * ROW;
    const int4* bt = set + WIDE_A + (size_t)(tile % TILES_N) * BN * ROW;
#pragma unroll
    for (int p = 0; p < PER; ++p) {
      const int i = threadIdx.x + p * THREADS;
      next[p] = i < BM * ROW ? at[i] : bt[i - BM * ROW];
    }
  };
  if (blockIdx.x < TILES) load(blockIdx.x);
  for (int tile = blockIdx.x; tile < TILES; tile += gridDim.x) {
    __syncthreads();  // the previous tile's stores have read ab
#pragma unroll
    for (int p = 0; p < PER; ++p) ab[threadIdx.x + p * THREADS] = next[p];
    __syncthreads();
    if (tile + (int)gridDim.x < TILES) load(tile + gridDim.x);
    const int tm = tile / TILES_N, tn = tile % TILES_N;
    for (int c = threadIdx.x; c < BM * BN / 8; c += THREADS) {
      const int r = c / (BN / 8), j = c % (BN / 8);
      const int4 v = xor4(ab[r * ROW + j % ROW], ab[(BM + j) * ROW + (r + j) % ROW]);  // no bank clashes
      C[(size_t)(tm * BM + r) * (WIDE_N / 8) + tn * (BN / 8) + j] = v;
    }
  }
}

// A launch of `blocks` CTAs of 128 threads with one launch attribute (a cluster shape, or cooperative).
template <class... Params, class... Args>
static void launch_with(cudaLaunchAttribute attr, int blocks, cudaStream_t s, void (*kernel)(Params...), Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(128);
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

static cudaLaunchAttribute cluster_of(int cluster) {
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  return attr;
}

static cudaLaunchAttribute cooperative() {
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  return attr;
}

static double time_pattern(cudaStream_t s, const std::function<void(int)>& call) {
  cudaGraph_t g;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < R; ++i) call(i);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&exec, g, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 20; ++i) CK(cudaGraphLaunch(exec, s));
  std::vector<float> us;
  for (int i = 0; i < REPLAYS; ++i) {
    CK(cudaEventRecord(e0, s));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    us.push_back(ms * 1000.f / R);
  }
  std::sort(us.begin(), us.end());
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(g));
  return us[us.size() / 2];
}

int main() {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CK(cudaFuncSetAttribute(cluster_cut_kernel<16, false>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CK(cudaFuncSetAttribute(cluster_cut_kernel<16, true>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  unsigned* counters;
  CK(cudaMalloc(&counters, 4096 * sizeof(unsigned)));
  CK(cudaMemset(counters, 0, 4096 * sizeof(unsigned)));
  char* sets;
  CK(cudaMalloc(&sets, SETS * SET_BYTES));
  CK(cudaMemset(sets, 1, SETS * SET_BYTES));
  int full = 2 * sms;  // two CTAs per SM
  float* work;  // the cut patterns' partials: 256 CTAs x 16x16 fp32
  CK(cudaMalloc(&work, 256 * 256 * sizeof(float)));
  int4* wide;  // the short-K wide patterns' 32 rotating sets of A, B and C
  CK(cudaMalloc(&wide, WIDE_SETS * WIDE_SET * sizeof(int4)));
  CK(cudaMemset(wide, 1, WIDE_SETS * WIDE_SET * sizeof(int4)));
  auto wide_set = [&](int i) { return (const int4*)(wide + (size_t)(i % WIDE_SETS) * WIDE_SET); };
  half* cut_out;
  CK(cudaMalloc(&cut_out, 32 * 256 * sizeof(half)));  // up to 32 tiles (clusters of 8)
  struct Pattern {
    const char* name;
    std::function<void(int)> call;
  };
  std::vector<Pattern> patterns = {
      {"empty_kernel_1cta", [&](int) { empty_kernel<<<1, 32, 0, s>>>(); }},
      {"empty_kernel_2_per_sm", [&](int) { empty_kernel<<<full, 128, 0, s>>>(); }},
      {"two_empty_kernels", [&](int) { empty_kernel<<<full, 128, 0, s>>>(); empty_kernel<<<full, 128, 0, s>>>(); }},
      {"memset_4KiB_then_kernel", [&](int) {
         CK(cudaMemsetAsync(counters, 0, 4096, s));
         empty_kernel<<<full, 128, 0, s>>>();
       }},
      {"arrive_8_per_counter", [&](int) { arrive_kernel<<<full, 128, 0, s>>>(counters, 8); }},
      {"last_arrival_8_per_counter", [&](int) { last_arrival_kernel<<<full, 128, 0, s>>>(counters, 8u); }},
      {"cut_16_partials_only", [&](int) { cut_kernel<Fence::Sc, false><<<256, 128, 0, s>>>(work, counters, cut_out); }},
      {"cut_16_fence_sc", [&](int) { cut_kernel<Fence::Sc, true><<<256, 128, 0, s>>>(work, counters, cut_out); }},
      {"cut_16_fence_acq_rel", [&](int) { cut_kernel<Fence::AcqRel, true><<<256, 128, 0, s>>>(work, counters, cut_out); }},
      {"cut_16_no_fence", [&](int) { cut_kernel<Fence::None, true><<<256, 128, 0, s>>>(work, counters, cut_out); }},
      {"cluster_cut_8_pull", [&](int) { launch_with(cluster_of(8), 256, s, cluster_cut_kernel<8, false>, cut_out); }},
      {"cluster_cut_8_push", [&](int) { launch_with(cluster_of(8), 256, s, cluster_cut_kernel<8, true>, cut_out); }},
      {"cluster_cut_16_pull", [&](int) { launch_with(cluster_of(16), 256, s, cluster_cut_kernel<16, false>, cut_out); }},
      {"cluster_cut_16_push", [&](int) { launch_with(cluster_of(16), 256, s, cluster_cut_kernel<16, true>, cut_out); }},
      {"store_2MiB_half2_fragments", [&](int i) {
         store_fragments_kernel<<<dim3(16, 32), 64, 0, s>>>((half2*)(sets + (size_t)(i % SETS) * SET_BYTES));
       }},
      {"store_2MiB_16B_rows", [&](int i) {
         store_rows_kernel<<<dim3(16, 32), 64, 0, s>>>((int4*)(sets + (size_t)(i % SETS) * SET_BYTES));
       }},
      {"wide_1024x4096x64_traffic_128x128_tiles", [&](int i) {
         wide_tile_kernel<128, 128, true><<<dim3(WIDE_N / 128, WIDE_M / 128), 256, 0, s>>>(wide_set(i));
       }},
      {"wide_1024x4096x64_traffic_64x128_tiles", [&](int i) {
         wide_tile_kernel<64, 128, true><<<dim3(WIDE_N / 128, WIDE_M / 64), 128, 0, s>>>(wide_set(i));
       }},
      {"wide_1024x4096x64_traffic_128x256_tiles", [&](int i) {
         wide_tile_kernel<128, 256, true><<<dim3(WIDE_N / 256, WIDE_M / 128), 256, 0, s>>>(wide_set(i));
       }},
      {"wide_1024x4096x64_pipelined_64x64_tiles_2_per_sm", [&](int i) {
         wide_pipelined_kernel<64, 64, 128><<<2 * sms, 128, 0, s>>>(wide_set(i));
       }},
      {"wide_1024x4096x64_pipelined_64x64_tiles_4_per_sm", [&](int i) {
         wide_pipelined_kernel<64, 64, 128><<<4 * sms, 128, 0, s>>>(wide_set(i));
       }},
      {"wide_1024x4096x64_pipelined_128x128_tiles_1_per_sm", [&](int i) {
         wide_pipelined_kernel<128, 128, 256><<<sms, 256, 0, s>>>(wide_set(i));
       }},
      {"wide_1024x4096x64_pipelined_64x128_tiles_2_per_sm", [&](int i) {
         wide_pipelined_kernel<64, 128, 256><<<2 * sms, 256, 0, s>>>(wide_set(i));
       }},
      {"wide_1024x4096_store_only_128x128_tiles", [&](int i) {
         wide_tile_kernel<128, 128, false><<<dim3(WIDE_N / 128, WIDE_M / 128), 256, 0, s>>>(wide_set(i));
       }},
      {"cold_64x64x64_tile_traffic", [&](int i) {
         const char* base = sets + (size_t)(i % SETS) * SET_BYTES;
         cold_tile_kernel<<<1, 512, 0, s>>>((const int4*)base, (int4*)(base + (1u << 20)));
       }},
      // The same traffic as offline timing of 64^3 sees it: 32 rotating 24 KiB sets (16 KiB read, 8 KiB written),
      // 768 KiB in all, which stay in L2 between their turns.
      {"warm_64x64x64_tile_traffic", [&](int i) {
         const char* base = sets + (size_t)(i % 32) * (24u << 10);
         cold_tile_kernel<<<1, 512, 0, s>>>((const int4*)base, (int4*)(base + (16u << 10)));
       }},
      {"cluster_2_of_2_per_sm", [&](int) { launch_with(cluster_of(2), full, s, cluster_kernel); }},
      {"cluster_8_of_2_per_sm", [&](int) { launch_with(cluster_of(8), full, s, cluster_kernel); }},
      {"cluster_16_of_2_per_sm", [&](int) { launch_with(cluster_of(16), full / 16 * 16, s, cluster_kernel); }},
      // Last: a cooperative launch that cannot be captured would end the run here (CK), after the others printed.
      {"cooperative_empty_2_per_sm", [&](int) { launch_with(cooperative(), full, s, empty_kernel); }},
      {"spread_wait_8_per_counter", [&](int) { launch_with(cooperative(), full, s, spread_kernel, counters, 8u); }},
      {"spread_wait_16_per_counter", [&](int) {
         launch_with(cooperative(), full / 16 * 16, s, spread_kernel, counters, 16u);
       }},
  };
  for (auto& p : patterns) std::printf("%s %.3f\n", p.name, time_pattern(s, p.call));
  CK(cudaGetLastError());
  return 0;
}
