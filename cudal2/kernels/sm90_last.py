"""The sm90 family's `reduction=last`: split-K as a batch whose K ranges sum in the GEMM's own epilogue.

Split-K as a batch (cudal2.kernels.sm90) leaves each K range's fp32 partial in the workspace and launches a second
kernel, splitk_reduce, to sum them. With `reduction=last` the GEMM's epilogue does it instead, in the same launch:

    every K range l of a tile   accumulators -> the workspace (fp32, interleaved by thread: a warp's float4 store is
                                512 contiguous bytes) -> fence -> the tile's ticket (one thread, atomicAdd)
    the range drawing the last  reads all `splits` partials back range by range (each range's loads in flight
    ticket                      together), sums them in the order l = 0, 1, ... (deterministic), resets the
                                ticket, and stores the tile as half through shared memory in 16-byte row chunks

The epilogue is CUTLASS's DefaultEpilogue (the no-smem one) with that reduction in it, plugged in through CUTLASS's
Sm90TmaWarpSpecializedAdapter, so the mainloop, the tile scheduler and the kernel are the family's. Its named
barriers span the consumer threads of one tile, which the cooperative and basic kernels have (pingpong's two consumer
warpgroups run different tiles). The tickets are the library's own device memory (cuda_parts.TICKETS_DECL, one per
output tile, at most MAX_TICKETS), zero at load and reset by each tile's last arrival: calls on one stream do not
overlap, and cudal2.ops orders a ticket kernel's launches across streams.

Measured (benchmarks/fused_splitk.py, RESULTS forty-sixth session, H100, 6 configs x 6 few-tile long-K shapes): on
like tiles, faster than the family's batch with a plainly launched splitk_reduce on 29 of 32 pairs (1.01-1.34x), but
slower than the batch whose TMA epilogue writes the partials and whose splitk_reduce starts early by PDL on all 32
(0.68-0.98x, median 0.90x): one CTA per tile reads all its partials while the others have left. CUTLASS's
element-wise store in place of the staged one cost the prototype most of its gain (those stores cost a median 5.2 us
per 128x128 tile over the TMA epilogue on the H200).
"""

from __future__ import annotations

from cudal2.kernels import cuda_parts

INCLUDES = """#include <cutlass/arch/barrier.h>
#include <cutlass/epilogue/collective/detail.hpp>
#include <cutlass/epilogue/thread/linear_combination.h>
"""

# The class template, inside the source's namespace (before the kernel's types, which instantiate it).
TICKET_EPILOGUE = f"""// Split-K summed by its last K range (reduction=last, cudal2.kernels.sm90_last): one ticket per output tile, the
// library's own device memory, zero when it loads and reset by each tile's last arrival (cuda_parts' tickets and
// memory primitives; their last_arrival() syncs the whole CTA, which a warp-specialised epilogue cannot: the named
// barriers below span its consumer threads only).
constexpr int MAX_TICKETS = {cuda_parts.MAX_TICKETS};
{cuda_parts.TICKETS_DECL}
{cuda_parts.LAST_ARRIVAL}
// CUTLASS's no-smem epilogue (DefaultEpilogue) with split-K's reduction in it: batch l of the GEMM is K range l of
// every tile. Each range writes its fp32 accumulators to the workspace, then takes the tile's ticket; the range that
// draws the last ticket adds every range's partial in the order l = 0, 1, ... and stores the tile as half through
// shared memory in 16-byte row chunks (CUTLASS's element-wise stores cost a median 5.2 us per 128x128 tile over its
// TMA epilogue on the H200). The other ranges are done.
template <class StrideD_, class ThreadEpilogueOp_, int TileM, int TileN, int Splits>
class TicketEpilogue {{
 public:
  using EpilogueSchedule = cutlass::gemm::EpilogueDefault;
  using DispatchPolicy = EpilogueSchedule;
  using ThreadEpilogueOp = ThreadEpilogueOp_;
  using ElementOutput = typename ThreadEpilogueOp::ElementOutput;
  using ElementAccumulator = typename ThreadEpilogueOp::ElementAccumulator;
  using ElementCompute = typename ThreadEpilogueOp::ElementCompute;
  using ElementScalar = ElementCompute;
  using ElementC = void;
  using StrideC = StrideD_;
  using ElementD = typename ThreadEpilogueOp::ElementD;
  using StrideD = StrideD_;
  using GmemElementC = ElementD;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;
  static const int kOutputAlignment = ThreadEpilogueOp::kCount;
  using AlignmentType = typename cute::uint_bit<cutlass::sizeof_bits<ElementOutput>::value * kOutputAlignment>::type;

  static constexpr int kPitch = TileN + 8;  // halves per staging row: 16-byte aligned rows, skewed against bank conflicts
  struct SharedStorage {{
    int last;  // thread 0's ticket verdict, read by every epilogue thread
    alignas(16) cutlass::half_t tile[TileM * kPitch];  // the summed tile on its way to C
  }};
  using TensorStorage = SharedStorage;

  struct Arguments {{
    typename ThreadEpilogueOp::Params thread{{}};
    ElementC const* ptr_C = nullptr;
    StrideC dC{{}};
    ElementD* ptr_D = nullptr;
    StrideD dD{{}};
    float* partials = nullptr;  // tiles x Splits x TileM x TileN fp32, tile-major
  }};
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {{ return args; }}
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {{ return 0; }}
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {{
    return cutlass::Status::kSuccess;
  }}
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {{ return true; }}

  CUTLASS_HOST_DEVICE TicketEpilogue(Params const& params_, SharedStorage const& = SharedStorage()) : params(params_) {{}}
  CUTLASS_DEVICE bool is_source_needed() {{ return false; }}

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout>& accumulators,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char* smem) {{
    auto M = get<0>(problem_shape_mnkl);
    auto N = get<1>(problem_shape_mnkl);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    constexpr int kAcc = decltype(size(accumulators))::value;  // fp32 sums per thread
    constexpr int kThreads = decltype(size(tiled_mma))::value;  // epilogue threads: the consumer warpgroup(s)
    static_assert(kAcc % 4 == 0, "float4 partials");
    const int m0 = int(m_coord) * TileM, n0 = int(n_coord) * TileN;
    // A tile wholly past M or N: a CTA that pads the grid to whole clusters (a 2x1 cluster over one row of tiles).
    // It has no ticket or partial of its own (its index would be another tile's), and nothing to store.
    if (m0 >= int(M) || n0 >= int(N)) return;
    SharedStorage& shared = *reinterpret_cast<SharedStorage*>(smem);
    const int tiles_m = (int(M) + TileM - 1) / TileM;
    const long long tile = (long long)m_coord + (long long)n_coord * tiles_m;
    float4* slots = reinterpret_cast<float4*>(params.partials);
    const long long per_range = (long long)(kAcc / 4) * kThreads;  // float4s of one range's partial of one tile
    float4* mine = slots + (tile * Splits + l_coord) * per_range + thread_idx;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kAcc / 4; ++j) {{
      __stcg(mine + j * kThreads, make_float4(accumulators(4 * j), accumulators(4 * j + 1), accumulators(4 * j + 2),
                                              accumulators(4 * j + 3)));
    }}
    volatile int* last = &shared.last;
    cutlass::arch::NamedBarrier::sync(kThreads, 0);  // every thread's partial stored before thread 0's fence
    if (thread_idx == 0) {{
      fence_gpu();
      const bool is_last = ticket_arrive(&g_tickets[tile]) == unsigned(Splits) - 1u;
      if (is_last) {{
        ticket_reset(&g_tickets[tile]);
        fence_gpu();  // the other ranges fenced before their tickets: their partials are visible from here on
      }}
      *last = is_last;
    }}
    cutlass::arch::NamedBarrier::sync(kThreads, 0);
    if (!*last) return;
    // Every range's partial from the workspace, this range's own too (this thread's own stores), range by range so
    // that a range's kAcc / 4 loads are in flight together (one load per branch on "is it mine?" issued them one at a
    // time: a prototype lost ~10 us so on an H100), summed in the order l = 0, 1, ...
    const float4* first = slots + tile * Splits * per_range + thread_idx;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < Splits; ++r) {{
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kAcc / 4; ++j) {{
        const float4 p = __ldcg(first + r * per_range + j * kThreads);
        if (r == 0) {{
          accumulators(4 * j) = p.x; accumulators(4 * j + 1) = p.y;
          accumulators(4 * j + 2) = p.z; accumulators(4 * j + 3) = p.w;
        }} else {{
          accumulators(4 * j) += p.x; accumulators(4 * j + 1) += p.y;
          accumulators(4 * j + 2) += p.z; accumulators(4 * j + 3) += p.w;
        }}
      }}
    }}
    // The tile as half into shared memory at each accumulator's (m, n), then out in 16-byte row chunks (clipped at
    // M, N; element by element at a ragged right edge or an unaligned C).
    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
    Tensor cD_mn = local_tile(make_identity_tensor(make_shape(M, N)), take<0, 2>(blk_shape_MNK),
                              make_coord(m_coord, n_coord));
    Tensor tCcD_mn = thr_mma.partition_C(cD_mn);  // (m, n) of each accumulator
    cutlass::arch::NamedBarrier::sync(kThreads, 0);  // the previous tile's copy-out is done with the buffer
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(accumulators); ++i) {{
      shared.tile[(int(get<0>(tCcD_mn(i))) - m0) * kPitch + int(get<1>(tCcD_mn(i))) - n0] = ElementD(accumulators(i));
    }}
    cutlass::arch::NamedBarrier::sync(kThreads, 0);
    const int rows = min(TileM, int(M) - m0), cols = min(TileN, int(N) - n0);
    const long long ldc = get<0>(params.dD);  // C row-major: (ldc, 1, L stride)
    ElementD* out = params.ptr_D + (long long)m0 * ldc + n0;
    const bool vec = ldc % 8 == 0 && reinterpret_cast<uintptr_t>(params.ptr_D) % 16 == 0;
    for (int q = thread_idx; q < TileM * (TileN / 8); q += kThreads) {{  // 8 halves (16 bytes) of one row each
      const int r = q / (TileN / 8), c = q % (TileN / 8) * 8;
      if (r >= rows || c >= cols) continue;
      const cutlass::half_t* src = shared.tile + r * kPitch + c;
      ElementD* dst = out + r * ldc + c;
      if (vec && c + 8 <= cols) {{
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
      }} else {{
        for (int e = 0; e < 8 && c + e < cols; ++e) dst[e] = src[e];
      }}
    }}
  }}

 private:
  Params params;
}};

"""

# The kernel's epilogue type (inside _TYPES, where the tile and LayoutD are known).
COLLECTIVE_EPILOGUE = """// The epilogue: TicketEpilogue above (reduction=last), through CUTLASS's adapter for warp-specialised kernels.
using ThreadOp = cutlass::epilogue::thread::LinearCombination<ElementD, 1, ElementAccumulator, ElementCompute,
                                                              cutlass::epilogue::thread::ScaleType::OnlyAlphaScaling>;
using CollectiveEpilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<
    TicketEpilogue<cutlass::detail::TagToStrideC_t<LayoutD>, ThreadOp, $bm, $bn, $splits>>;"""

# The partials' layout and the workspace: in the namespace, after the kernel's types and make_arguments.
HELPERS = """
// reduction=last: each output tile's $splits K ranges leave fp32 partials in the workspace, tile-major (tile t, range l
// at (t * $splits + l) * BM * BN floats), and the last to arrive at the tile's ticket sums them in the GEMM's epilogue.
static long long tiles(int M, int N) { return (long long)((M + $bm - 1) / $bm) * ((N + $bn - 1) / $bn); }
// The partials' bytes, rounded up to 256 so that the GEMM's own workspace after them stays aligned.
static size_t partials_bytes(int M, int N) {
  return (size_t($splits) * tiles(M, N) * $bm * $bn * sizeof(float) + 255) / 256 * 256;
}

static size_t split_workspace_bytes(int M, int N, int K) {
  return partials_bytes(M, N) + Gemm::get_workspace_size(make_arguments(nullptr, nullptr, nullptr, nullptr, M, N, K));
}
"""

# The entry point's checks and launch after the arguments are built (args; workspace_bytes checked for the GEMM's own).
CHECKS = """  // Split-K summed by the last K range: equal K ranges of whole 16-byte rows, a ticket per output tile, the partials
  // first in the workspace, then the GEMM's.
  if (K % (8 * $splits) != 0 || cudal2_sm90::tiles(M, N) > cudal2_sm90::MAX_TICKETS) return 1;
  if (cudal2_sm90::partials_bytes(M, N) + Gemm::get_workspace_size(args) > workspace_bytes) return 2;
"""
