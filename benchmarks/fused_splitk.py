"""Split-K summed in the GEMM's own epilogue against the sm90 family's split-K as a batch, on the same tiles (GPU).

    python3 benchmarks/fused_splitk.py [--shapes M_N_K ...] [--repeats 2] [--target-ms 20] [--json OUT] [--compile-only]

Why: where a shape has fewer output tiles than SMs and a long K (1024x1024x4096 has 64 tiles of 128x128 for 132 SMs),
the grid's winners run 64-row tiles or split K as a batch: fp32 partials to the workspace, then a second kernel sums
them (~3.5 us more than the best kernel at 1024^3 on the H200). Here each K range writes its partial (interleaved by
thread: a warp's float4 store is 512 contiguous bytes) and takes the tile's ticket; the range that draws the last
ticket adds every range's partial in the order l = 0, 1, ... (all read back from the workspace, a range's loads in
flight together) and stores the tile as half. One launch, no second kernel, deterministic. It is CUTLASS's batched
GEMM (batch l = K range l, as the family's twin) with a no-smem epilogue of its own (CUTLASS's DefaultEpilogue plus
the ticket), so the mainloop is the family's. Each variant is timed beside its twin in the family (same tile,
cluster, schedule and K ranges, the no-smem epilogue writing fp32 partials, then splitk_reduce), `repeats` fresh
evaluations each in offline mode, cuBLAS timed in every evaluation; nothing is stored. Printed per (variant,
shape): the medians over the repeats of both kernels' times, fused / twin speedup (> 1: the fused kernel is faster)
and cuBLAS.

Measured (benchmarks/RESULTS.md, forty-fifth session, H100, a first cut without the twins): correct on every shape
(77x1000x336 included), but 1.8-4x slower than the grid's winners and than the family's split-K as a batch on like
tiles (512x512x8192 as 128 units of 4 K ranges: 128x64 tiles 25.2 us, the family's 64x128 ones with their reduction
kernel 12.4), and ~6-8 us over them even on 77x1000x336's tiny units. Part of it is the store: the first cut stores
C element by element, as CUTLASS's no-smem epilogue does, which on the H200 costs a median 5.2 us per 128x128 tile
over the TMA epilogue (2.4 us per 128x64: the store's no-smem / TMA twins). The staged variants (second cut) stage the
summed tile in shared memory and store 16-byte row chunks; the unstaged ones are the first cut (their shared storage
grew by a 16-byte placeholder). Neither the twins nor the second cut has run on a GPU yet.
"""

from __future__ import annotations

import argparse
import json
import statistics
import string
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from cudal2.kernels import cuda_parts
from cudal2.kernels.sm90 import FAMILY, Epilogue, Schedule, Scheduler, Sm90Config
from cudal2.sandbox.types import Acc, Status, Task

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing_runs import add_timing_flags, evaluator_for, prepare_all, sort_prepared  # noqa: E402  (a sibling script)

KERNELS = {Schedule.COOPERATIVE: "KernelTmaWarpSpecializedCooperative", Schedule.BASIC: "KernelTmaWarpSpecialized"}


@dataclass(frozen=True)
class Variant:
    """One fused kernel: the CTA tile (elements), the cluster (CTAs along M x N), the schedule and the K ranges."""

    bm: int
    bn: int
    bk: int
    cluster_m: int
    cluster_n: int
    schedule: Schedule  # cooperative or basic: one tile per epilogue call on all the CTA's consumer threads
    splits: int
    staged: bool = False  # the tile goes to C through shared memory in 16-byte row chunks, not element by element

    @property
    def label(self) -> str:
        return (f"fused-{self.bm}x{self.bn}x{self.bk}-c{self.cluster_m}x{self.cluster_n}-{self.schedule.value}"
                f"-s{self.splits}" + ("-staged" if self.staged else ""))


# The first cut's fastest decompositions (forty-fifth session): 128x128 cooperative and 128x64 basic, 2 and 4 ranges;
# each also staged (the second cut, not yet run on a GPU).
VARIANTS = tuple(Variant(bm, bn, 64, 1, 1, schedule, s, staged) for staged in (False, True) for bm, bn, schedule in
                 ((128, 128, Schedule.COOPERATIVE), (128, 64, Schedule.BASIC)) for s in (2, 4))
# Fewer 128x128 tiles than SMs and a long K; 77x1000x336 for odd M and N (K % (8 x 2) == 0 only: 4 ranges refuse it).
SHAPES = ("77_1000_336", "1024_1024_4096", "512_1024_4096", "512_512_8192", "256_1024_8192", "1024_512_16384")

SOURCE = string.Template(r"""// Split-K summed in the GEMM's epilogue (benchmarks/fused_splitk.py): ${bm}x${bn}x${bk} tile, ${cm}x${cn} cluster, ${sched},
// ${s} K ranges${staged_note}; the sm90 family's split-K as a batch otherwise (its twin), without the reduction kernel.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/arch/barrier.h>
#include <cutlass/kernel_hardware_info.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/detail.hpp>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>

namespace cudal2_sm90 {

using namespace cute;

// One ticket per output tile: the library's own device memory, zero when it loads, reset by each tile's last arrival
// (the small family's and sm80's tickets and memory primitives, cudal2.kernels.cuda_parts; their last_arrival() syncs
// the whole CTA, which a warp-specialised kernel's epilogue cannot: the named barriers below span its consumers only).
constexpr int MAX_TICKETS = ${max_tickets};
${tickets_decl}
${last_arrival}
// The no-smem epilogue (CUTLASS's DefaultEpilogue) with split-K's reduction in it: batch l of the GEMM is K range l
// of every tile. Each range writes its fp32 accumulators to the workspace (interleaved by thread: a warp's float4
// store is 512 contiguous bytes), then takes the tile's ticket; the range that draws the last ticket adds every
// range's partial in the order l = 0, 1, ... and stores the tile as half.
// The others are done. Deterministic, one launch, no second kernel.
// Staged (the second cut): the tile goes to C through shared memory in 16-byte row chunks instead of CUTLASS's
// element-wise stores, which cost a median 5.2 us over the TMA epilogue per 128x128 tile on the H200 (the store's
// no-smem / TMA twins, RESULTS forty-fifth session).
template <class StrideD_, class ThreadEpilogueOp_, int TileM, int TileN, int Splits, bool Staged>
class TicketEpilogue {
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
  struct SharedStorage {
    int last;  // thread 0's ticket verdict, read by every epilogue thread
    alignas(16) cutlass::half_t tile[Staged ? TileM * kPitch : 8];  // the summed tile on its way to C (Staged)
  };
  using TensorStorage = SharedStorage;

  struct Arguments {
    typename ThreadEpilogueOp::Params thread{};
    ElementC const* ptr_C = nullptr;
    StrideC dC{};
    ElementD* ptr_D = nullptr;
    StrideD dD{};
    float* partials = nullptr;  // splits x tiles x BM x BN fp32
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) { return args; }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) { return 0; }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) { return true; }

  CUTLASS_HOST_DEVICE TicketEpilogue(Params const& params_, SharedStorage const& = SharedStorage()) : params(params_) {}
  CUTLASS_DEVICE bool is_source_needed() { return false; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout>& accumulators,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char* smem) {
    using X = Underscore;
    auto M = get<0>(problem_shape_mnkl);
    auto N = get<1>(problem_shape_mnkl);
    auto L = get<3>(problem_shape_mnkl);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    constexpr int kAcc = decltype(size(accumulators))::value;  // fp32 sums per thread
    constexpr int kThreads = decltype(size(tiled_mma))::value;  // epilogue threads: the consumer warpgroup(s)
    static_assert(kAcc % 4 == 0, "float4 partials");
    if constexpr (Splits > 1) {  // L == Splits: batch l is K range l
      const int tiles_m = (int(M) + int(size<0>(blk_shape_MNK)) - 1) / int(size<0>(blk_shape_MNK));
      const long long tile = (long long)m_coord + (long long)n_coord * tiles_m;
      float4* slots = reinterpret_cast<float4*>(params.partials);
      const long long per_range = (long long)(kAcc / 4) * kThreads;  // float4s of one range's partial of one tile
      float4* mine = slots + (tile * L + l_coord) * per_range + thread_idx;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kAcc / 4; ++j) {
        __stcg(mine + j * kThreads, make_float4(accumulators(4 * j), accumulators(4 * j + 1),
                                                accumulators(4 * j + 2), accumulators(4 * j + 3)));
      }
      volatile int* last = &reinterpret_cast<SharedStorage*>(smem)->last;
      cutlass::arch::NamedBarrier::sync(kThreads, 0);
      if (thread_idx == 0) {
        fence_gpu();
        const bool is_last = ticket_arrive(&g_tickets[tile]) == unsigned(L) - 1u;
        if (is_last) {
          ticket_reset(&g_tickets[tile]);
          fence_gpu();  // the other ranges fenced before their tickets: their partials are visible from here on
        }
        *last = is_last;
      }
      cutlass::arch::NamedBarrier::sync(kThreads, 0);
      if (!*last) return;
      // Every range's partial from the workspace, this range's own too (its own stores: this thread sees them), range
      // by range, so that a range's kAcc / 4 loads are in flight together; the first cut took its own from registers
      // behind a branch per load, which issued the loads one at a time ((L - 1) x kAcc / 4 L2 round trips). Summed in
      // the order l = 0, 1, ...: the same bits.
      const float4* first = slots + tile * L * per_range + thread_idx;
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < Splits; ++r) {
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kAcc / 4; ++j) {
          const float4 p = __ldcg(first + r * per_range + j * kThreads);
          if (r == 0) {
            accumulators(4 * j) = p.x; accumulators(4 * j + 1) = p.y;
            accumulators(4 * j + 2) = p.z; accumulators(4 * j + 3) = p.w;
          } else {
            accumulators(4 * j) += p.x; accumulators(4 * j + 1) += p.y;
            accumulators(4 * j + 2) += p.z; accumulators(4 * j + 3) += p.w;
          }
        }
      }
    }
    // Store as DefaultEpilogue does (predicated at M, N), into C: D's L stride is 0; or (Staged) through shared memory.
    auto stride_d = params.dD;
    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
    auto shape_MN = make_shape(M, N);
    Tensor mD_crd = make_identity_tensor(shape_MN);
    Tensor cD_mn = local_tile(mD_crd, take<0, 2>(blk_shape_MNK), make_coord(m_coord, n_coord));
    Tensor tCcD_mn = thr_mma.partition_C(cD_mn);  // (m, n) of each accumulator
    if constexpr (Staged) {
      cutlass::half_t* tile = reinterpret_cast<SharedStorage*>(smem)->tile;
      const int m0 = int(m_coord) * TileM, n0 = int(n_coord) * TileN;
      cutlass::arch::NamedBarrier::sync(kThreads, 0);  // the previous tile's copy-out is done with the buffer
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accumulators); ++i) {
        tile[(int(get<0>(tCcD_mn(i))) - m0) * kPitch + int(get<1>(tCcD_mn(i))) - n0] = ElementD(accumulators(i));
      }
      cutlass::arch::NamedBarrier::sync(kThreads, 0);
      const int rows = min(TileM, int(M) - m0), cols = min(TileN, int(N) - n0);
      const long long ldc = get<0>(stride_d);  // C row-major: (ldc, 1, 0)
      ElementD* out = params.ptr_D + (long long)m0 * ldc + n0;
      const bool vec = ldc % 8 == 0 && reinterpret_cast<uintptr_t>(params.ptr_D) % 16 == 0;
      for (int q = thread_idx; q < TileM * (TileN / 8); q += kThreads) {  // 8 halves (16 bytes) of one row each
        const int r = q / (TileN / 8), c = q % (TileN / 8) * 8;
        if (r >= rows || c >= cols) continue;
        const cutlass::half_t* src = tile + r * kPitch + c;
        ElementD* dst = out + r * ldc + c;
        if (vec && c + 8 <= cols) {
          *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
        } else {
          for (int e = 0; e < 8 && c + e < cols; ++e) dst[e] = src[e];
        }
      }
    } else {
      Tensor mD_mnl = make_tensor(make_gmem_ptr(params.ptr_D), make_shape(M, N, L), stride_d);
      Tensor gD_mnl = local_tile(mD_mnl, blk_shape_MNK, make_coord(_, _, _), Step<_1, _1, X>{});
      Tensor tCgD = thr_mma.partition_C(gD_mnl(_, _, m_coord, n_coord, l_coord));
      Tensor tCcD = make_coord_tensor(tCcD_mn.layout());
      auto residue_tCcD = shape_MN - tCcD_mn(_0{});
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accumulators); ++i) {
        if (elem_less(tCcD(i), residue_tCcD)) tCgD(i) = ElementD(accumulators(i));
      }
    }
  }

 private:
  Params params;
};

using ElementA = cutlass::half_t;
using ElementB = cutlass::half_t;
using ElementD = cutlass::half_t;
using ElementAccumulator = float;
using ElementCompute = float;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlignAB = 8;
constexpr int SPLITS = ${s};

using TileShape = Shape<Int<${bm}>, Int<${bn}>, Int<${bk}>>;
using ClusterShape = Shape<Int<${cm}>, Int<${cn}>, _1>;

using ThreadOp = cutlass::epilogue::thread::LinearCombination<ElementD, 1, ElementAccumulator, ElementCompute,
                                                              cutlass::epilogue::thread::ScaleType::OnlyAlphaScaling>;
using CollectiveEpilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<
    TicketEpilogue<cutlass::detail::TagToStrideC_t<LayoutD>, ThreadOp, ${bm}, ${bn}, ${s}, ${staged}>>;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    ElementA, LayoutA, kAlignAB,
    ElementB, LayoutB, kAlignAB,
    ElementAccumulator, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cutlass::gemm::${kernel}>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
    Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

static typename Gemm::Arguments make_arguments(const half* A, const half* B, half* C, float* partials,
                                               int M, int N, int K) {
  int device = 0;
  cutlass::KernelHardwareInfo hw;
  if (cudaGetDevice(&device) == cudaSuccess) {
    hw.device_id = device;
    hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
  }
  typename GemmKernel::StrideA stride_a = make_stride(int64_t(K), _1{}, int64_t(K) / SPLITS);
  typename GemmKernel::StrideB stride_b = make_stride(int64_t(K), _1{}, int64_t(K) / SPLITS);
  typename GemmKernel::StrideD stride_d = make_stride(int64_t(N), _1{}, int64_t(0));  // every range's tile is C's
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kBatched,
      {M, N, K / SPLITS, SPLITS},
      {reinterpret_cast<const ElementA*>(A), stride_a, reinterpret_cast<const ElementB*>(B), stride_b},
      {{}, nullptr, stride_d, reinterpret_cast<ElementD*>(C), stride_d, partials},
      hw};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  args.scheduler.max_swizzle_size = 1;
  return args;
}

static long long tiles(int M, int N) {
  return (long long)((M + ${bm} - 1) / ${bm}) * ((N + ${bn} - 1) / ${bn});
}
static size_t partials_bytes(int M, int N) {
  return (size_t(SPLITS) * tiles(M, N) * ${bm} * ${bn} * sizeof(float) + 255) / 256 * 256;
}

}  // namespace cudal2_sm90

extern "C" size_t cudal2_workspace_bytes(int M, int N, int K) {
  using cudal2_sm90::Gemm;
  return cudal2_sm90::partials_bytes(M, N) +
         Gemm::get_workspace_size(cudal2_sm90::make_arguments(nullptr, nullptr, nullptr, nullptr, M, N, K));
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
  using cudal2_sm90::Gemm;
  if (K % (8 * cudal2_sm90::SPLITS) != 0 || cudal2_sm90::tiles(M, N) > cudal2_sm90::MAX_TICKETS) return 1;
  typename Gemm::Arguments args =
      cudal2_sm90::make_arguments(A, B, C, static_cast<float*>(workspace), M, N, K);
  if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return 1;
  if (cudal2_sm90::partials_bytes(M, N) + Gemm::get_workspace_size(args) > workspace_bytes) return 2;
  Gemm gemm;
  void* gemm_workspace = static_cast<uint8_t*>(workspace) + cudal2_sm90::partials_bytes(M, N);
  if (gemm.initialize(args, gemm_workspace, stream) != cutlass::Status::kSuccess) return 3;
  if (gemm.run(stream) != cutlass::Status::kSuccess) return 4;
  return 0;
}
""")

def fused_source(v: Variant) -> str:
    """The fused kernel's .cu (the candidate contract)."""
    if v.schedule not in KERNELS:
        raise ValueError(f"{v.label}: the epilogue's barrier spans all consumer threads on one tile: "
                         "cooperative or basic only")
    return SOURCE.substitute(max_tickets=cuda_parts.MAX_TICKETS, tickets_decl=cuda_parts.TICKETS_DECL,
                             last_arrival=cuda_parts.LAST_ARRIVAL, bm=v.bm, bn=v.bn, bk=v.bk, cm=v.cluster_m, cn=v.cluster_n, sched=v.schedule.value,
                             s=v.splits, kernel=KERNELS[v.schedule], staged="true" if v.staged else "false",
                             staged_note=", staged through shared memory" if v.staged else "")


def twin(v: Variant) -> Sm90Config:
    """The family's split-K as a batch on the same decomposition (staged or not): its no-smem epilogue stores the fp32
    partials and splitk_reduce (no PDL) sums them."""
    return Sm90Config(bm=v.bm, bn=v.bn, bk=v.bk, cluster_m=v.cluster_m, cluster_n=v.cluster_n, schedule=v.schedule,
                      scheduler=Scheduler.PERSISTENT, epilogue=Epilogue.NOSMEM, stages=0, swizzle=1, acc=Acc.FP32,
                      splits=v.splits)


def sources() -> dict[tuple[Variant, str], str]:
    """(variant, "fused" | "twin") -> source; a staged variant shares its unstaged sibling's twin (the same config)."""
    return {**{(v, "fused"): fused_source(v) for v in VARIANTS},
            **{(v, "twin"): FAMILY.render(twin(v)) for v in VARIANTS if not v.staged}}


def table(evals: dict[tuple[Variant, str, str], list[tuple[float, float]]]) -> str:
    """Markdown: per (variant, shape) the fused and twin medians (us, median over repeats), fused / twin speedup and
    cuBLAS's median over all their evaluations. `evals`: (variant, kind, shape) -> [(kernel us, cuBLAS us)]."""
    lines = ["| variant | shape | fused us | twin us | twin / fused | cuBLAS us |", "|---|---|---|---|---|---|"]
    for v in VARIANTS:
        for shape in dict.fromkeys(s for (_, _, s) in evals):
            fused, tw = evals.get((v, "fused", shape), []), evals.get((replace(v, staged=False), "twin", shape), [])
            if not fused or not tw:
                continue
            f, t = statistics.median(x for x, _ in fused), statistics.median(x for x, _ in tw)
            cublas = statistics.median(c for _, c in fused + tw)
            lines.append(f"| {v.label} | {shape} | {f:.2f} | {t:.2f} | {t / f:.3f}x | {cublas:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), help="M_N_K, fp32 accumulate")
    add_timing_flags(ap, what="kernel", repeats=2, target_ms=20.0)
    args = ap.parse_args(argv)
    try:
        tasks = tuple(Task(*map(int, s.split("_")), Acc.FP32) for s in args.shapes)
    except (TypeError, ValueError) as e:  # BadTask is a ValueError
        print(f"fused_splitk.py: --shapes takes M_N_K with positive integers, got {args.shapes} ({e})", file=sys.stderr)
        return 2
    if args.repeats < 1:
        print("fused_splitk.py: --repeats must be >= 1", file=sys.stderr)
        return 2
    evaluator = evaluator_for(args, baselines=True)
    ready = sort_prepared(prepare_all(evaluator, {k: (src, tasks) for k, src in sources().items()}),
                          what="kernels", compile_only=args.compile_only, name=lambda k: f"{k[0].label} {k[1]}")
    if args.compile_only:
        return 1 if ready.stopped else 0
    evals: dict[tuple[Variant, str, str], list[tuple[float, float]]] = {}
    failures: list[str] = []
    refusals: list[str] = []  # K not split into equal ranges of whole 16-byte rows: refused by design
    for repeat in range(args.repeats):
        for (v, kind), prepared in ready.runnable.items():
            for shape in evaluator.run(prepared).shapes:
                if shape.status is not Status.OK:
                    refused = shape.task.k % (8 * v.splits) != 0  # unequal K ranges: both kinds return 1, as they should
                    (refusals if refused else failures).append(
                        f"{v.label} {kind} {shape.task.mnk} repeat {repeat}: {shape.status.value}: {shape.reason[:120]}")
                    continue
                us, cublas = shape.timings["candidate"].median_us, shape.timings["cublas"].median_us
                evals.setdefault((v, kind, shape.task.mnk), []).append((us, cublas))
                print(f"{v.label} {kind} {shape.task.mnk} repeat {repeat}: {us:.2f} us (cuBLAS {cublas:.2f})",
                      flush=True)
    print(f"\n{len(VARIANTS)} variants and their twins on {evaluator.gpu_label}, offline, {args.repeats} repeats, "
          f"target_ms {args.target_ms:g}; {len(refusals)} refused (K % (8 x splits) != 0), {len(failures)} other "
          "evaluations not ok", *failures, sep="\n")
    print(table(evals))
    if args.json:
        args.json.write_text(json.dumps([{"variant": v.label, "kind": kind, "mnk": mnk, "us_cublas": runs}
                                         for (v, kind, mnk), runs in evals.items()], indent=1))
    return 0 if not ready.stopped and not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
