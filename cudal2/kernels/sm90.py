"""sm90 (Hopper, the H200) HGEMM family: wgmma + TMA, warp-specialised, built from CUTLASS 3.x collectives.

Every config renders one self-contained .cu (the candidate contract, README.md) whose `cudal2_hgemm` instantiates
CUTLASS's verified Hopper pieces from the pinned nvidia-cutlass headers instead of hand-written wgmma:

    mainloop  cutlass::gemm::collective::CollectiveBuilder<arch::Sm90, OpClassTensorOp, ...>
              TMA loads (multicast across a cluster of up to 4 x 2 or 2 x 4 CTAs) into 128B-swizzled shared memory,
              an mbarrier pipeline of `stages` K-blocks, wgmma (SS: both operands from shared memory) in fp32 or
              fp16 accumulators, one m64nBNk16 per warpgroup and K step (CuTe's extended wgmma shapes where BN is
              48, 80, 112, 144, 160 or 176: its standard ones alone split such a tile into several narrow wgmmas)
    kernel    KernelTmaWarpSpecializedCooperative: one producer warpgroup, two consumer warpgroups on one
              BM x BN tile (BM split 2 ways), or KernelTmaWarpSpecializedPingpong: two consumer warpgroups on two
              different tiles, alternating mainloop and epilogue, or KernelTmaWarpSpecialized (`basic`): one
              consumer warpgroup, one tile per CTA, a grid of all the tiles (not persistent), or KernelTma
              (`unspecialized`): one tile per CTA as basic, but no producer warp: one warpgroup both issues the TMA
              loads (one thread) and runs the wgmmas, with the no-smem epilogue only. A one-tile-per-CTA kernel
              with `ctas_per_sm` = k > 1 takes as many stages as fit k CTAs in an SM's shared memory, so that k
              tiles run on an SM at once and one's epilogue overlaps another's mainloop (registers permitting)
    schedule  PersistentScheduler (one CTA per SM walks the tiles, swizzled rasterisation) or StreamKScheduler
              (cooperative only: K-splits of the tail tiles across SMs, reduced in the workspace in order, or with
              atomics under reduction=atomic);
              with `splits` > 1 the stream-K scheduler runs plain split-K instead: every output tile's K loop in
              `splits` equal ranges on different CTAs, for skinny long-K shapes that have fewer tiles than SMs;
              stream-K sources zero their barrier flags with a kernel of their own, not CUTLASS's memset (a memset
              node costs ~2.3 us per call in graph replay, a kernel node ~0.6 us: benchmarks/graph_gap.cu);
              either scheduler walks the tiles along M or along N as `raster` forces, or as CUTLASS's heuristic picks
    split-K   `splits` > 1 under the persistent scheduler runs split-K as a batch instead, for either kernel (so also
              64-row pingpong tiles, which the stream-K scheduler lacks; cuBLASLt splits 32- and 64-row tiles on the
              skinny long-K shapes): batch l of the GEMM is K range l (an L stride of K/splits elements), its fp32
              partial goes to slice l of the workspace, and a second kernel of the source sums the slices in order
              into C (deterministic). Needs K % (8 * splits) == 0: equal, 16-byte aligned K ranges. With `pdl`
              that kernel is launched with programmatic dependent launch, as cuBLAS launches its own split-K
              reduction: it starts while the GEMM's last tiles finish (CUTLASS's grid dependency control lets it
              launch after each CTA's last mainloop) and waits for their partials in place (griddepcontrol.wait).
              With `reduction=last` (cooperative and basic kernels) there is no second kernel: the GEMM's epilogue
              (cudal2.kernels.sm90_last) writes the partial, takes the tile's ticket, and the K range that draws the
              last one sums the tile in order and stores C through shared memory
    epilogue  TMA store through shared memory (needs 16-byte aligned rows of C: N % 8 == 0), or CUTLASS's no-smem
              epilogue (predicated element stores from registers, any N). The TMA epilogue stores the tile in
              subtiles of 128 (cooperative) or 64 (pingpong) rows by `epi_n` columns, one shared-memory round trip
              and barrier each: CUTLASS's EpilogueTileAuto (epi_n = 0) takes gcd(32, BN) columns, so 16 for the
              N tiles 48-176 that are odd multiples of 16 (eleven rounds for BN = 176, against four for 128)
    operands  `swap_ab` computes C^T[N,M] = B[N,K] * A[M,K]^T instead: both operands stay K-major, and C^T column-major
              is C row-major, so only the layouts, D's strides and the argument order change. wgmma's M is 64 per
              warpgroup, so C's rows get tiles of 64-256 unswapped, and of 16-256 (the N tiles) swapped.

Layout: C[M,N] = A[M,K] * B[N,K]^T, all row-major half. In CUTLASS terms A is RowMajor MxK (K-major), B is
ColumnMajor KxN (K-major, i.e. B's rows are the N index), D is RowMajor MxN; C (the beta source) is void, so C is
never read (the harness poisons it with NaN before each call).

Shapes: TMA descriptors need 16-byte aligned row strides, so A and B need K % 8 == 0 (and the TMA epilogue
N % 8 == 0); `supports` refuses other shapes with that reason and the tuner picks another family. Any M >= 1 works
(TMA zero-fills out-of-bounds loads and clips stores).
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from cudal2.kernels import cuda_parts, sm90_last
from cudal2.kernels.family import ADDED_LATER, BadConfig, Tiling, build_config, config_name
from cudal2.sandbox.lt_algo import LtAlgo
from cudal2.sandbox.types import MAX_WORKSPACE_BYTES, Acc, Task

ARCH = "sm_90a"

# Shared memory one CTA may use on sm_90 (227 KiB): cutlass::gemm::collective::detail::sm90_smem_capacity_bytes.
SMEM_CAPACITY = 232448
# Shared memory of one SM (228 KiB), shared by its resident CTAs, and what the system reserves per resident CTA
# (CUDA programming guide, compute capability 9.0): one CTA gets SM_SMEM_BYTES - CTA_RESERVED_SMEM = SMEM_CAPACITY.
SM_SMEM_BYTES = 233472
CTA_RESERVED_SMEM = 1024
# Per-stage mainloop overhead: PipelineTmaAsync's full and empty mbarriers (2 x 8 bytes), as CUTLASS counts it.
STAGE_BARRIER_BYTES = 16
# The TMA epilogue's shared storage beyond its D buffers (their alignment to the swizzle pattern, its barriers):
# this many times the swizzle width, the largest power of two (at most 128 bytes) dividing the bytes of the epilogue
# tile's contiguous dimension. Measured with probe_source() (half and fp32 D, row- and column-major, epilogue tiles
# 8-32 columns wide): 1024 bytes for a half row-major D of 32 columns (64 bytes), 2048 for 128-byte ones.
EPILOGUE_SMEM_PAD_PER_SWIZZLE_BYTE = 16
# Kernel shared storage besides the mainloop stages and the epilogue (pipeline, scheduler and order barriers),
# rounded up. Both constants are measured with probe_source() (sizeof(GemmKernel::SharedStorage), nvcc 13.0 +
# CUTLASS 4.2), and tests/kernels/test_sm90.py checks that the model never underestimates CUTLASS.
KERNEL_SMEM_OVERHEAD = 512
# The one-tile-per-CTA kernels' SharedStorage (the tensors' union, then the pipelines' barriers) is sized to a multiple
# of its alignment, up to 1024 bytes (a 128-byte-swizzled TMA epilogue buffer's): CUTLASS 66560 bytes for a basic
# 128x128 tile with 2 stages and 128-column epilogue subtiles, where tensors and barriers take ~65600 (probe_source).
ONE_TILE_SMEM_ALIGN = 1024
# Accumulator registers per consumer thread (32-bit words) above which the tile spills: the consumer warpgroups get
# 232-240 registers (setmaxnreg) and need ~60-90 for addresses, descriptors and the epilogue. Measured (nvcc 13.0):
# 128 compile clean; 256 (cooperative 256x256, pingpong 128x256, fp32) spill ~4.7 KB and serialise wgmma (C7511).
MAX_ACC_REGS = 128
# CTAs per cluster: 8 is the portable maximum (CUDA programming guide, "Thread Block Clusters"); CUTLASS's launcher
# does not opt in to more.
MAX_CLUSTER_CTAS = 8
THREADS_PER_WARPGROUP = 128


class Schedule(str, Enum):
    COOPERATIVE = "cooperative"  # 2 consumer warpgroups share one tile (BM split), needs BM >= 128
    PINGPONG = "pingpong"  # 2 consumer warpgroups on alternate tiles, one's epilogue hides under the other's MMAs
    # 1 consumer warpgroup, one tile per CTA, grid = the tiles (CUTLASS's KernelTmaWarpSpecialized): no persistent
    # loop, tile scheduler or register hand-over. On one-tile-per-CTA shapes CUTLASS's persistent kernels issue
    # 20-40% more instructions than cuBLAS's kernel of the same tile and grid (Nsight Compute, RESULTS sixteenth
    # session); this is the leanest CUTLASS kernel for them. Its `scheduler` stays persistent: the tag CUTLASS takes.
    BASIC = "basic"
    # One tile per CTA as basic, but not warp-specialised (CUTLASS's KernelTma): one warpgroup of 128 threads, one of
    # which issues the TMA loads `stages` K-blocks ahead while all run the wgmmas; no producer warp, no register
    # hand-over, and a plain epilogue from registers (CUTLASS's TMA epilogue needs the warp-specialised kernels).
    UNSPECIALIZED = "unspecialized"


# Schedules with one tile per CTA, a grid of all the tiles: no persistent loop, so no swizzle, raster order or stream-K.
ONE_TILE_PER_CTA = (Schedule.BASIC, Schedule.UNSPECIALIZED)


class Scheduler(str, Enum):
    PERSISTENT = "persistent"
    STREAMK = "streamk"


class Reduction(str, Enum):
    """How the partials (accumulator type) of one output tile's K ranges are summed.

    Under the stream-K scheduler, in its workspace (CUTLASS ReductionMode):
    ordered: each K range waits for the one before it and adds its partial in turn (Deterministic: bitwise
             reproducible, but a tile's `splits` ranges finish one after another).
    atomic:  after the first range has stored its partial, the middle ranges add theirs with atomics at the same
             time, and the last one waits for all (Nondeterministic: the order of the sums varies per call).
    Split-K as a batch (the persistent scheduler):
    ordered: splitk_reduce, a second kernel, sums the slices in order.
    last:    in the GEMM's own epilogue: the K range that arrives last at its tile's ticket sums the tile's partials in
             order and stores it (cudal2.kernels.sm90_last); one launch, deterministic. Added later.
    """

    ORDERED = "ordered"
    ATOMIC = "atomic"
    LAST = "last"


class Raster(str, Enum):
    """The order the tile scheduler walks output tiles in (CUTLASS RasterOrderOptions): which of A's row-panels or
    B's column-panels concurrently running CTAs share in L2.

    heuristic: CUTLASS's choice, along M when there are more tile columns than tile rows, else along N.
    along_m:   down a column of tiles first (consecutive CTAs share B's panel).
    along_n:   across a row of tiles first (consecutive CTAs share A's panel).
    """

    HEURISTIC = "heuristic"
    ALONG_M = "along_m"
    ALONG_N = "along_n"


class Epilogue(str, Enum):
    TMA = "tma"  # registers -> swizzled smem -> TMA store; N % 8 == 0
    NOSMEM = "nosmem"  # predicated stores straight from the accumulators; any N, no smem taken from the mainloop


@dataclass(frozen=True)
class Sm90Config:
    """One kernel. Tile sizes in elements; stages = K-blocks in flight in shared memory (0: as many as fit)."""

    bm: int
    bn: int
    bk: int
    cluster_m: int  # CTAs per cluster along M: they share (multicast) each B tile
    cluster_n: int  # CTAs per cluster along N: they share each A tile
    schedule: Schedule
    scheduler: Scheduler
    epilogue: Epilogue
    stages: int
    swizzle: int  # tile rasterisation swizzle (CUTLASS max_swizzle_size): neighbouring CTAs share L2 tiles
    acc: Acc
    splits: int = 1  # > 1: split-K into this many K ranges per tile (stream-K scheduler in SplitK mode)
    # How K ranges' partials are summed (stream-K scheduler only); added after the first stored configs.
    reduction: Reduction = field(default=Reduction.ORDERED, metadata=ADDED_LATER)
    raster: Raster = field(default=Raster.HEURISTIC, metadata=ADDED_LATER)  # tile order; added after stored configs
    # The kernel computes C^T[N,M] = B[N,K] * A[M,K]^T instead: A and B trade places (both stay K-major) and C^T
    # column-major is C row-major, so BM, cluster_m and raster's M run along C's N, and BN and cluster_n along C's M.
    # Output tiles of 16 to 256 rows (wgmma's M is 64 per warpgroup), as cuBLASLt runs on skinny-M shapes (its 32x64
    # and 96x128 tiles). Added after stored configs.
    swap_ab: bool = field(default=False, metadata=ADDED_LATER)
    # Columns of the TMA epilogue's subtile (rows: 128 cooperative, 64 pingpong); 0: CUTLASS's EpilogueTileAuto,
    # gcd(32, BN). Wider subtiles mean fewer store rounds per tile but more shared memory. Added after stored configs.
    epi_n: int = field(default=0, metadata=ADDED_LATER)
    # Split-K as a batch only: its reduction kernel starts with programmatic dependent launch (PDL), while the GEMM's
    # last tiles finish, and waits on the GEMM's results in place (griddepcontrol.wait), as cuBLAS's own split-K
    # launches its reduction (benchmarks/cublas_graph.cu). Evaluator 0.3.0 allows PDL within one call. Added later.
    pdl: bool = field(default=False, metadata=ADDED_LATER)
    # One-tile-per-CTA schedules with stages = 0 only: as many stages as let this many CTAs share an SM's shared
    # memory (1: as many as fit one CTA). The auto stage count fills the SM with one CTA, so a basic kernel's epilogue
    # leaves its SM's tensor cores idle; with 2-4 resident CTAs another tile's mainloop can run meanwhile, as pingpong's
    # does within one CTA (not profiled yet). Explicit 2-CTA basic configs beat every other kernel on 10 grid shapes by 1.01-1.14x
    # (RESULTS, nineteenth session); this names that cut for every tile. ptxas may still give a CTA more registers
    # than k of them can share (256 threads x registers <= 65536 / k): the compile record shows them. Added later.
    ctas_per_sm: int = field(default=1, metadata=ADDED_LATER)
    # The entry point keeps the kernel's parameters (CUTLASS's Params: the TMA descriptors, the tile scheduler's setup)
    # from a thread's last call, rebuilt only when the pointers, shape, workspace or device change, and sets the shared
    # memory limit once per thread and device; without it CUTLASS's initialize() does both on every call. Host time: a
    # CUDA graph (offline timing) replays the launch without it, but server-mode and eager callers pay it on every
    # call (sm90 winners ~13 us over their offline time against ~10 us for sm80 and small ones: RESULTS, twenty-fifth
    # session). Added later.
    host_cache: bool = field(default=False, metadata=ADDED_LATER)


SPACE: dict[str, tuple[Any, ...]] = {
    "bm": (64, 128, 256),
    # 32, 96 and 192 after the first stored configs: cuBLASLt's autotuned kernels on the grid's skinny long-K shapes
    # use N tiles of 32-96 with clusters of up to 4 CTAs along M or N (benchmarks/lt_algos.py, benchmarks/RESULTS.md);
    # 16, 48, 80, 160 and 176 later, as cuBLASLt's tiles on the grid's small and middle shapes (64x176, 128x80; 16-,
    # 48- and 160-row ones, which are N tiles with the operands swapped); 112 and 144 in the twelfth session, its
    # 128x112 and 128x144 on 28 grid shapes where we had never run that tile (correct on the H200, but slower than
    # cuBLAS there, like our 128x176: benchmarks/RESULTS.md). Multiples of 16 only: an N tile that is an odd
    # multiple of 8 (its 24, 40, 56, 168) fails CuTe's "Stride Divisibility Condition" (nvcc 13.0, CUTLASS 4.2).
    "bn": (16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 256),
    "bk": (64, 128),
    "cluster_m": (1, 2, 4),
    "cluster_n": (1, 2, 4),
    "schedule": tuple(Schedule),
    "scheduler": tuple(Scheduler),
    "epilogue": tuple(Epilogue),
    "stages": (0, 2, 3, 4, 5, 6, 7, 8),
    "swizzle": (1, 2, 4, 8),
    "acc": tuple(Acc),
    # 32 and 64 (thirty-eighth session): split-K as a batch only (prune), for long K on a few output tiles: 64x64x16384
    # has 2 tiles of 64x32, so 16 ranges leave 100 of the 132 SMs idle. On the H200 they lost on all 38 small-bucket
    # shapes with K >= 1024 (32 ranges: 1.4-1.5x the 8-16-range winners' time at K >= 8192; benchmarks/RESULTS.md).
    "splits": (1, 2, 3, 4, 5, 6, 8, 12, 16, 32, 64),
    "reduction": tuple(Reduction),
    "raster": tuple(Raster),
    "swap_ab": (False, True),
    # 0 (CUTLASS's choice) or a multiple of 16 (CUTLASS's static_assert) that divides BN: prune() says which.
    "epi_n": (0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 256),
    "pdl": (False, True),
    "ctas_per_sm": (1, 2, 3, 4),
    "host_cache": (False, True),
}
MAX_STREAMK_SPLITS = 16  # K ranges per tile in the stream-K scheduler's split mode (the space's values before 32)
# Valid, but not searched: host_cache changes no offline (graph replay) time, so a search would spend evaluations on
# twins of configs it measured already (a cost model ranks the twin of its best prediction as high as the original).
NOT_SEARCHED = ("host_cache",)



# wgmma's N is any multiple of 8 up to 256, but CuTe's instruction selector (ss_op_selector, cute/arch/mma_sm90.hpp)
# offers only these unless CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED is defined, and takes the largest one that divides
# the tile's N. Without the define a 64x80 tile issued five m64n16k16 wgmmas per K step (PTX) instead of one m64n80k16,
# re-reading A from shared memory five times: N tiles 48, 80 and 160 measured ~1.3x slower per unit of work than the
# same config at N = 64 or 128, and 176 (eleven m64n16k16) ~1.8x (benchmarks/RESULTS.md, eleventh session).
STANDARD_GMMA_N = (8, 16, 32, 64, 96, 128, 192, 256)
EXTENDED_GMMA_GAIN = 1.8  # the narrow wgmmas' cost per unit of work over one wide one, the most measured (N = 176)
EXTENDED_GMMA_DEFINE = (
    "// wgmma N = BN needs CuTe's extended shapes (otherwise: several narrower wgmmas per K step)\n"
    "#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED\n"
)


GDC_DEFINE = (
    "// CUTLASS's grid dependency control: the GEMM lets splitk_reduce launch once its last tiles' mainloops are done\n"
    "#define CUTLASS_ENABLE_GDC_FOR_SM90\n"
)


def extended_gmma(cfg: Sm90Config) -> bool:
    """Whether the tile's N needs CuTe's extended wgmma shapes to run as one instruction. Only those sources carry
    the define, so every other config renders byte for byte as it was measured."""
    return cfg.bn not in STANDARD_GMMA_N


# ------------------------------------------------------------------------------------------------ smem model


def _round_up(x: int, to: int) -> int:
    return (x + to - 1) // to * to


def stage_bytes(cfg: Sm90Config) -> int:
    """One pipeline stage: a BM x BK tile of A and a BN x BK tile of B (half), 128-byte aligned, plus barriers."""
    return _round_up((cfg.bm + cfg.bn) * cfg.bk * 2, 128) + STAGE_BARRIER_BYTES


def batched_split_k(cfg: Sm90Config) -> bool:
    """Split-K as a batch of K ranges with fp32 partials in the workspace (the persistent scheduler with splits > 1),
    not the stream-K scheduler's split-K."""
    return cfg.splits > 1 and cfg.scheduler is Scheduler.PERSISTENT


def output_tile(cfg: Sm90Config) -> tuple[int, int]:
    """The CTA tile in C's terms, (rows along M, columns along N): BM x BN, or BN x BM with the operands swapped."""
    return (cfg.bn, cfg.bm) if cfg.swap_ab else (cfg.bm, cfg.bn)


def d_bytes(cfg: Sm90Config) -> int:
    """Bytes per element the epilogue stores: half C, or fp32 partials for batched split-K."""
    return 4 if batched_split_k(cfg) else 2


def epilogue_rows(cfg: Sm90Config) -> int:
    """Rows of the TMA epilogue's subtile: cooperative min(BM, 128), pingpong min(BM, 64) (CUTLASS's choice, and
    the only row count it takes for an explicit epilogue tile)."""
    return min(cfg.bm, 128 if cfg.schedule is Schedule.COOPERATIVE else 64)


def auto_epilogue_columns(cfg: Sm90Config) -> int:
    """Columns of CUTLASS's EpilogueTileAuto subtile: gcd(min(32, BN), BN)."""
    return math.gcd(min(32, cfg.bn), cfg.bn)


def epilogue_smem_bytes(cfg: Sm90Config) -> int:
    """sizeof(CollectiveEpilogue::SharedStorage): the TMA epilogue's D staging buffers (epilogue_rows x epi_n or
    CUTLASS's auto columns, D's type) plus their alignment pad; 0 for the no-smem epilogue. min(2, subtiles per CTA
    tile) buffers. reduction=last: its own epilogue's (sm90_last), a BM x (BN + 8) half staging tile.
    """
    if cfg.reduction is Reduction.LAST:  # TicketEpilogue's SharedStorage: the ticket's verdict, the staged half tile
        return 16 + cfg.bm * (cfg.bn + 8) * 2
    if cfg.epilogue is Epilogue.NOSMEM:
        return 0
    epi_m = epilogue_rows(cfg)
    epi_n = cfg.epi_n or auto_epilogue_columns(cfg)
    stages_d = min(2, (cfg.bm // epi_m) * (cfg.bn // epi_n))
    # D is stored along C's N: the epilogue tile's columns, or with the operands swapped (D column-major) its rows
    contiguous = (epi_m if cfg.swap_ab else epi_n) * d_bytes(cfg)
    swizzle_width = min(128, contiguous & -contiguous)
    return stages_d * epi_m * epi_n * d_bytes(cfg) + EPILOGUE_SMEM_PAD_PER_SWIZZLE_BYTE * swizzle_width


def smem_budget(cfg: Sm90Config) -> int:
    """Shared memory one CTA may take, bytes: SMEM_CAPACITY, or with `ctas_per_sm` = k its share of the SM."""
    return min(SMEM_CAPACITY, SM_SMEM_BYTES // cfg.ctas_per_sm - CTA_RESERVED_SMEM)


def pipeline_stages(cfg: Sm90Config) -> int:
    """The stage count CUTLASS will use: cfg.stages, or for 0 what StageCountAutoCarveout computes, or with
    `ctas_per_sm` > 1 the most whose one-tile kernel (mainloop and epilogue in one union) fits smem_budget()."""
    if cfg.stages:
        return cfg.stages
    if cfg.ctas_per_sm > 1:  # smem_bytes() of the one-tile kernels: the union, barriers, rounded up to the alignment
        return (smem_budget(cfg) // ONE_TILE_SMEM_ALIGN * ONE_TILE_SMEM_ALIGN - KERNEL_SMEM_OVERHEAD) // stage_bytes(cfg)
    carveout = _round_up(epilogue_smem_bytes(cfg), 128)
    return (SMEM_CAPACITY // 128 * 128 - carveout) // stage_bytes(cfg)


def smem_bytes(cfg: Sm90Config) -> int:
    """Estimated dynamic shared memory of the kernel, bytes (the model prune() decides on). The one-tile-per-CTA
    kernels keep the mainloop's and the epilogue's buffers in one union (their one tile's epilogue runs after its
    mainloop), the persistent ones side by side."""
    unaligned = _unaligned_smem_bytes(cfg)
    return _round_up(unaligned, ONE_TILE_SMEM_ALIGN) if cfg.schedule in ONE_TILE_PER_CTA else unaligned


def _unaligned_smem_bytes(cfg: Sm90Config) -> int:
    """smem_bytes() before the one-tile kernels' rounding to ONE_TILE_SMEM_ALIGN: tensors plus the overhead."""
    mainloop, epilogue = pipeline_stages(cfg) * stage_bytes(cfg), epilogue_smem_bytes(cfg)
    tensors = max(mainloop, epilogue) if cfg.schedule in ONE_TILE_PER_CTA else mainloop + epilogue
    return tensors + KERNEL_SMEM_OVERHEAD


def acc_regs(cfg: Sm90Config) -> int:
    """Accumulator registers per consumer thread: the tile's share of one thread (fp16 packs 2 per register)."""
    threads = THREADS_PER_WARPGROUP * (2 if cfg.schedule is Schedule.COOPERATIVE else 1)
    per_thread = cfg.bm * cfg.bn // threads
    return per_thread if cfg.acc is Acc.FP32 else per_thread // 2


def _one_tile_problem(cfg: Sm90Config) -> str | None:
    """Why a one-tile-per-CTA (`basic`, `unspecialized`) config is not one: it has no tile scheduler to swizzle,
    force a raster order or run stream-K (the persistent tag is what CUTLASS's kernel takes), so those fields must stay
    at their defaults rather than name configs that render the same kernel; the unspecialized kernel's epilogue is
    the no-smem one (CUTLASS's TMA epilogue has no entry point for a kernel without warp specialisation)."""
    kind = cfg.schedule.value
    if cfg.scheduler is not Scheduler.PERSISTENT:
        return f"the {kind} kernel takes no stream-K scheduler (static_assert): one CTA per tile, scheduler=persistent"
    if cfg.swizzle != 1 or cfg.raster is not Raster.HEURISTIC:
        return f"the {kind} kernel launches one CTA per tile in grid order: no swizzle or raster order to choose"
    if cfg.schedule is Schedule.UNSPECIALIZED and cfg.epilogue is not Epilogue.NOSMEM:
        return "the unspecialized kernel (KernelTma) takes the no-smem epilogue only (use epilogue=nosmem)"
    if cfg.ctas_per_sm > 1 and cfg.stages:
        return (f"ctas_per_sm={cfg.ctas_per_sm} sets the stage count (as many as fit): stages must be 0, got "
                f"{cfg.stages} (an explicit count is its own config)")
    return None


def _last_problem(cfg: Sm90Config) -> str | None:
    """Why a config cannot sum its split-K partials in its own epilogue (reduction=last, cudal2.kernels.sm90_last)."""
    if not batched_split_k(cfg):
        return ("reduction=last sums split-K-as-a-batch partials in the GEMM's epilogue: needs the persistent "
                "scheduler and splits > 1")
    if cfg.schedule not in (Schedule.COOPERATIVE, Schedule.BASIC):
        return (f"reduction=last: its epilogue's barriers span the consumer threads of one tile, which the "
                f"{cfg.schedule.value} kernel does not have together (cooperative or basic only)")
    if cfg.epilogue is not Epilogue.NOSMEM:
        return "reduction=last brings its own epilogue (CUTLASS's no-smem one with the sum in it): epilogue=nosmem"
    if cfg.pdl:
        return "reduction=last has no reduction kernel for pdl to launch early"
    if cfg.swap_ab:
        return "reduction=last stores the kernel's tile as rows of C: not with the operands swapped"
    if cfg.acc is not Acc.FP32:
        return "reduction=last keeps fp32 partials of fp32 accumulators: acc=fp32"
    return None


def _batch_problem(cfg: Sm90Config, task: Task) -> str | None:
    """Why split-K as a batch cannot keep this shape's partials: with reduction=last more tiles than tickets; the
    workspace over the harness's cap (splits slices of C, or with reduction=last splits whole tiles per tile)."""
    last = cfg.reduction is Reduction.LAST
    tiles = math.ceil(task.m / cfg.bm) * math.ceil(task.n / cfg.bn)
    if last and tiles > cuda_parts.MAX_TICKETS:
        return (f"reduction=last keeps one ticket per output tile, at most {cuda_parts.MAX_TICKETS}: "
                f"{task.m}x{task.n} has {tiles} tiles of {cfg.bm}x{cfg.bn}")
    partials = cfg.splits * (tiles * cfg.bm * cfg.bn if last else task.m * task.n) * 4
    if partials > MAX_WORKSPACE_BYTES:
        return (f"split-K as a batch keeps {cfg.splits} fp32 partials of C: {partials / 2**30:.1f} GiB of "
                f"workspace, over the harness's {MAX_WORKSPACE_BYTES >> 30} GiB")
    return None


def _nearest(values: tuple[int, ...], x: float) -> int:
    """The value of `values` closest to x in log2 (ties: the smaller)."""
    return min(values, key=lambda v: (abs(math.log2(v / x)), v))


def _epilogue_tile_problem(cfg: Sm90Config) -> str | None:
    """Why `epi_n` cannot be this config's epilogue subtile width, or None."""
    if not cfg.epi_n:
        return None
    if cfg.epilogue is not Epilogue.TMA:
        return "epi_n is the TMA epilogue's subtile width: the no-smem epilogue stores from registers (use 0)"
    if cfg.bn % cfg.epi_n:
        return f"epi_n={cfg.epi_n} does not divide BN={cfg.bn}: the epilogue subtiles must tile the CTA tile"
    if cfg.epi_n == auto_epilogue_columns(cfg):
        return f"epi_n={cfg.epi_n} is what CUTLASS picks for BN={cfg.bn} anyway (use 0: same kernel)"
    return None


# -------------------------------------------------------------------------------------------------- family


class Sm90Family:
    """CUTLASS 3.x warp-specialised wgmma/TMA kernels for sm_90a (see the module docstring)."""

    name = "sm90_wgmma"
    archs = (ARCH,)
    # The CTA tile, the scheduler and the K split: one kernel body, cut differently (prune() still has the last
    # word: accumulator registers and shared memory grow with the tile, split-K needs the stream-K scheduler).
    decomposition = ("bm", "bn", "scheduler", "splits", "reduction")

    def space(self) -> dict[str, tuple[Any, ...]]:
        """The searched parameters (make() also takes NOT_SEARCHED ones)."""
        return {name: values for name, values in SPACE.items() if name not in NOT_SEARCHED}

    def default(self) -> Sm90Config:
        """128x256x64 cooperative, 1x2 cluster, persistent, TMA epilogue, auto stages: a common choice for large
        fp16 GEMMs on Hopper (128 accumulator registers per thread, 4 stages)."""
        return Sm90Config(
            bm=128, bn=256, bk=64, cluster_m=1, cluster_n=2, schedule=Schedule.COOPERATIVE,
            scheduler=Scheduler.PERSISTENT, epilogue=Epilogue.TMA, stages=0, swizzle=1, acc=Acc.FP32,
        )

    def make(self, params: dict[str, Any]) -> Sm90Config:
        return build_config(Sm90Config, SPACE, params)

    def prune(self, cfg: Sm90Config, arch: str) -> str | None:
        if arch != ARCH:
            return f"wgmma and TMA need {ARCH}; cannot build for {arch}"
        if cfg.schedule is Schedule.COOPERATIVE and cfg.bm < 128:
            return f"cooperative splits BM across 2 consumer warpgroups of 64 rows: needs BM >= 128, got {cfg.bm}"
        if cfg.schedule is Schedule.PINGPONG and cfg.scheduler is Scheduler.STREAMK:
            return "CUTLASS's pingpong kernel does not support the stream-K scheduler (static_assert)"
        if cfg.schedule in ONE_TILE_PER_CTA and (why := _one_tile_problem(cfg)) is not None:
            return why
        if cfg.ctas_per_sm > 1 and cfg.schedule not in ONE_TILE_PER_CTA:
            return (f"ctas_per_sm: the {cfg.schedule.value} kernel is persistent (one CTA per SM walks the tiles); "
                    "only the one-tile-per-CTA schedules (basic, unspecialized) put several CTAs on an SM")
        if cfg.cluster_m * cfg.cluster_n > MAX_CLUSTER_CTAS:
            return (f"a {cfg.cluster_m}x{cfg.cluster_n} cluster is {cfg.cluster_m * cfg.cluster_n} CTAs, over the "
                    f"portable {MAX_CLUSTER_CTAS}")
        if cfg.splits > MAX_STREAMK_SPLITS and not batched_split_k(cfg):
            return (f"splits={cfg.splits}: over {MAX_STREAMK_SPLITS} K ranges split-K runs as a batch only (the "
                    "persistent scheduler); the stream-K scheduler's split mode was measured up to 16")
        if cfg.pdl and not batched_split_k(cfg):
            return "pdl starts split-K's reduction kernel early: only split-K as a batch (persistent, splits > 1) has one"
        if cfg.reduction is Reduction.ATOMIC and cfg.scheduler is not Scheduler.STREAMK:
            return "reduction=atomic sums K-range partials: only the stream-K scheduler has any (use ordered)"
        if cfg.reduction is Reduction.LAST and (why := _last_problem(cfg)) is not None:
            return why
        if (why := _epilogue_tile_problem(cfg)) is not None:
            return why
        if (regs := acc_regs(cfg)) > MAX_ACC_REGS:
            return (f"{regs} accumulator registers per consumer thread (> {MAX_ACC_REGS}) for a {cfg.bm}x{cfg.bn} "
                    f"{cfg.acc.value} tile under {cfg.schedule.value}: it would spill")
        stages = pipeline_stages(cfg)
        if stages < 2:
            return (f"only {stages} stage(s) of {stage_bytes(cfg)} bytes fit in {smem_budget(cfg)} bytes of shared "
                    "memory; CUTLASS's mainloop needs >= 2")
        if cfg.schedule is Schedule.UNSPECIALIZED and stages < 3:
            # MainloopSm90TmaGmma keeps one stage for the wgmmas in flight and asserts K_PIPE_MMAS < stages - 1:
            # with 2 the TMA would have no stage to load ahead into (a compile error on the H200, nineteenth session).
            return (f"the unspecialized mainloop (KernelTma) needs >= 3 stages: one for the wgmmas in flight, the rest "
                    f"for TMA loads ahead (static_assert); got {stages}")
        if (smem := smem_bytes(cfg)) > smem_budget(cfg):
            share = f"{cfg.ctas_per_sm} CTAs per SM leave one" if cfg.ctas_per_sm > 1 else "an sm_90 CTA has"
            return f"needs ~{smem} bytes of shared memory ({stages} stages); {share} {smem_budget(cfg)}"
        return None

    def like_cublaslt(self, lt: LtAlgo) -> list[Sm90Config]:
        """The valid configs nearest to cuBLASLt's tile, cluster and split-K, most faithful first. The split count
        rounds to the space's nearest value (log2); the tile is the nearest (BM, BN) pair, by summed log2 distance,
        that makes a valid config (256x192 would spill, say). The cluster keeps cuBLASLt's cluster footprint
        (cluster x tile, in output elements) rather than its CTA counts: where the tile grows, the cluster shrinks,
        instead of overhanging the shape (over the store, an overhanging cluster ran a median 1.36x slower than the
        same config clipped, RESULTS ninth session). With split-K: as a batch (also at the nearest power-of-two
        split; each with its reduction launched by PDL, then without), then the stream-K scheduler's atomic and
        ordered reductions (BM >= 128 only); each with the TMA,
        then the no-smem epilogue (shapes with N % 8 != 0 take only the latter); for an N tile that is an odd
        multiple of 16, then the TMA ones with a whole-tile epilogue subtile (epi_n = BN); last all of these that
        are persistent again as `basic` (one tile per CTA) where that is valid. [] when cuBLASLt left the
        tile open. Tiles in C's terms: a swapped config's BN x BM counts as rows x columns (the unswapped one first on a
        tie), so cuBLASLt's 32- and 96-row tiles are followed with the operands swapped."""
        if not (lt.tile_m and lt.tile_n):
            return []
        splits = _nearest(SPACE["splits"], lt.splits)
        # Split-K as a batch needs K % (8 * splits) == 0, and this has no shape: the nearest power of two too, which
        # divides every K of the grid (cuBLASLt splits 16384 in 12, 4096 in 3).
        batch_splits = dict.fromkeys((splits, _nearest(tuple(v for v in SPACE["splits"] if v & (v - 1) == 0),
                                                       lt.splits)))
        # (rows, columns of C, swapped): the kernel's tile is (rows, columns), or (columns, rows) when swapped.
        kernel_tiles = [(bm, bn) for bm in SPACE["bm"] for bn in SPACE["bn"]]
        tiles = sorted([(bm, bn, False) for bm, bn in kernel_tiles] + [(bn, bm, True) for bm, bn in kernel_tiles],
                       key=lambda t: (abs(math.log2(t[0] / lt.tile_m)) + abs(math.log2(t[1] / lt.tile_n)), t[2], t))
        for rows, cols, swap in tiles:
            # cuBLASLt's cluster footprint in C, in CTAs of this tile along C's M and N
            along_m = _nearest(SPACE["cluster_m"], max(lt.cluster_m, 1) * lt.tile_m / rows)
            along_n = _nearest(SPACE["cluster_n"], max(lt.cluster_n, 1) * lt.tile_n / cols)
            bm, bn, cluster_m, cluster_n = (cols, rows, along_n, along_m) if swap else (rows, cols, along_m, along_n)
            base = Sm90Config(
                bm=bm, bn=bn, bk=64, cluster_m=cluster_m, cluster_n=cluster_n,
                schedule=Schedule.COOPERATIVE if bm >= 128 else Schedule.PINGPONG,
                scheduler=Scheduler.PERSISTENT, epilogue=Epilogue.TMA, stages=0, swizzle=1, acc=Acc.FP32,
                swap_ab=swap,
            )
            # cuBLASLt's split-K sums fp32 partials from a workspace: split-K as a batch first (its reduction launched
            # with PDL, as cuBLAS launches its own, then without), then the stream-K scheduler's atomic and ordered
            # reductions. Not reduction=last: on like tiles it lost to the batch with PDL on all 32 pairs measured
            # (0.68-0.98x, H100, RESULTS forty-sixth session), so a cuBLASLt-guided round would spend its evaluations.
            decompositions = [replace(base, splits=s, pdl=p) for s in batch_splits for p in (True, False)] + [
                replace(base, scheduler=Scheduler.STREAMK, splits=splits, reduction=r)
                for r in (Reduction.ATOMIC, Reduction.ORDERED)] if splits > 1 else [base]
            out = [replace(c, epilogue=e) for c in decompositions for e in Epilogue]
            # An odd multiple of 16 columns (48-176) is stored in CUTLASS's 16-column subtiles: eleven rounds for
            # 176, each a trip through shared memory, a barrier and a TMA commit, in boxes of 32-byte rows.
            # cuBLASLt's own tiles of those widths need not store that way, so last the TMA configs again with the
            # whole tile width as one subtile (epi_n = BN; prune() refuses it for BN = 16, CUTLASS's own subtile).
            out += [replace(c, epi_n=c.bn) for c in out if c.epilogue is Epilogue.TMA and auto_epilogue_columns(c) == 16]
            # Last, the same with one tile per CTA (`basic`): cuBLAS's nvjet kernels launch a grid of the tiles, not
            # one persistent CTA per SM (benchmarks/cublas_kernels_h200.txt); the stream-K ones have no such twin.
            out += [replace(c, schedule=Schedule.BASIC) for c in out if c.scheduler is Scheduler.PERSISTENT]
            if valid := [c for c in out if self.prune(c, ARCH) is None]:
                return valid
        return []

    def supports(self, cfg: Sm90Config, task: Task) -> str | None:
        if task.acc is Acc.FP32 and cfg.acc is Acc.FP16:
            return "fp16 accumulation cannot meet an fp32-accuracy task"
        if task.k % 8:
            return f"TMA needs 16-byte aligned rows of A and B: K % 8 == 0, got K={task.k}"
        if cfg.epilogue is Epilogue.TMA and task.n % 8:
            return f"the TMA epilogue needs 16-byte aligned rows of C: N % 8 == 0, got N={task.n}"
        if batched_split_k(cfg) and task.k % (8 * cfg.splits):
            return (f"split-K as a batch needs {cfg.splits} equal K ranges of whole 16-byte rows: "
                    f"K % {8 * cfg.splits} == 0, got K={task.k}")
        if batched_split_k(cfg):
            return _batch_problem(cfg, task)
        return None

    def tiling(self, cfg: Sm90Config) -> Tiling:
        rows, cols = output_tile(cfg)
        return Tiling(rows, cols, cfg.bk, cfg.splits,
                      stream_k=cfg.scheduler is Scheduler.STREAMK and cfg.splits == 1,
                      serial_reduce=cfg.scheduler is Scheduler.STREAMK and cfg.reduction is Reduction.ORDERED,
                      last_arrival=cfg.reduction is Reduction.LAST)

    def settle(self, cfg: Sm90Config) -> Sm90Config:
        """A one-tile-per-CTA config with the persistent scheduler tag, no swizzle and the heuristic raster order, an
        unspecialized one also with the no-smem epilogue (no epilogue subtile): the one kernel its tile, cluster and
        the rest render to (`_one_tile_problem` names the others). `ctas_per_sm` back to 1 where it means nothing:
        under a persistent schedule, and beside an explicit stage count (a parent with ctas_per_sm 2 that steps to 4
        stages gets 4 stages)."""
        if cfg.schedule not in ONE_TILE_PER_CTA:
            return replace(cfg, ctas_per_sm=1)
        cfg = replace(cfg, scheduler=Scheduler.PERSISTENT, swizzle=1, raster=Raster.HEURISTIC,
                      ctas_per_sm=1 if cfg.stages else cfg.ctas_per_sm)
        return replace(cfg, epilogue=Epilogue.NOSMEM, epi_n=0) if cfg.schedule is Schedule.UNSPECIALIZED else cfg

    def rerender_gain(self, cfg: Sm90Config) -> float:
        """Tiles that now run one extended-shape wgmma per K step (`extended_gmma`) measured up to EXTENDED_GMMA_GAIN
        times slower per unit of work before; the stream-K flag change (b946c64) saves only ~1.2 us a call."""
        return EXTENDED_GMMA_GAIN if extended_gmma(cfg) else 1.0

    def render(self, cfg: Sm90Config) -> str:
        if not isinstance(cfg, Sm90Config):
            raise BadConfig(f"not an Sm90Config: {cfg!r}")
        values = _template_values(self, cfg)
        last = cfg.reduction is Reduction.LAST  # its own epilogue (sm90_last) before the kernel's types
        return "".join((
            _HEADER.substitute(values), EXTENDED_GMMA_DEFINE if extended_gmma(cfg) else "",
            GDC_DEFINE if cfg.pdl else "", _INCLUDES, sm90_last.INCLUDES if last else "",
            "\nnamespace cudal2_sm90 {\n\nusing namespace cute;\n\n",
            sm90_last.TICKET_EPILOGUE if last else "", _TYPES.substitute(values),
            _CACHED_ENTRY.substitute({**values, **_cached_launch_values(cfg, values)}) if cfg.host_cache
            else _ENTRY.substitute(values),
        ))


FAMILY = Sm90Family()


# ----------------------------------------------------------------------------------------------- rendering


def _shown_smem_bytes(cfg: Sm90Config) -> int:
    """The shared memory estimate a source's header shows: smem_bytes() without ONE_TILE_SMEM_ALIGN's rounding where
    ctas_per_sm is 1, as every one-tile source stored before that rounding showed it (so they keep their hashes)."""
    return _unaligned_smem_bytes(cfg) if cfg.ctas_per_sm == 1 else smem_bytes(cfg)


def _stages_desc(cfg: Sm90Config) -> str:
    if cfg.stages:
        return str(cfg.stages)
    if cfg.ctas_per_sm > 1:
        return (f"as many as fit {cfg.ctas_per_sm} CTAs per SM ({smem_budget(cfg)} bytes of shared memory each): "
                f"{pipeline_stages(cfg)}")
    return "auto (as many as fit beside the epilogue)"


def _template_values(family: Sm90Family, cfg: Sm90Config) -> dict[str, str]:
    coop = cfg.schedule is Schedule.COOPERATIVE
    kernel = {Schedule.COOPERATIVE: "KernelTmaWarpSpecializedCooperative",
              Schedule.PINGPONG: "KernelTmaWarpSpecializedPingpong",
              Schedule.BASIC: "KernelTmaWarpSpecialized", Schedule.UNSPECIALIZED: "KernelTma"}[cfg.schedule]
    if cfg.epilogue is Epilogue.TMA:
        epilogue = "TmaWarpSpecializedCooperative" if coop else "TmaWarpSpecialized"
    else:
        epilogue = "NoSmemWarpSpecialized"
    stages = (
        "cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename "
        "CollectiveEpilogue::SharedStorage))>"
        if cfg.stages == 0 and cfg.ctas_per_sm == 1 else f"cutlass::gemm::collective::StageCount<{pipeline_stages(cfg)}>"
    )
    scheduler = "StreamKScheduler" if cfg.scheduler is Scheduler.STREAMK else "PersistentScheduler"
    # Split-K through the stream-K scheduler: `splits` K ranges per tile, partials reduced in the workspace in a
    # fixed order (ReductionMode::Deterministic, CUTLASS's default) or with atomics (reduction=atomic). Only the
    # stream-K arguments have these fields. The ordered default adds no line, so older configs render unchanged.
    batched = batched_split_k(cfg)
    scheduler_args = ("" if cfg.splits == 1 or batched else
               f"\n  args.scheduler.splits = {cfg.splits};  // K ranges per output tile\n"
               "  args.scheduler.decomposition_mode =\n"
               "      cutlass::gemm::kernel::detail::DecompositionMode::SplitK;  // not stream-K's own heuristic")
    atomic = cfg.reduction is Reduction.ATOMIC
    if atomic:
        scheduler_args += ("\n  args.scheduler.reduction_mode =  // middle K ranges add their partials at the same time\n"
                    "      cutlass::gemm::kernel::detail::ReductionMode::Nondeterministic;")
    # A forced raster order (both schedulers' arguments have the field); CUTLASS's heuristic, the default, adds no
    # line, so older configs render unchanged.
    if cfg.raster is not Raster.HEURISTIC:
        order = "AlongM" if cfg.raster is Raster.ALONG_M else "AlongN"
        scheduler_args += ("\n  args.scheduler.raster_order =  // forced, not CUTLASS's heuristic\n"
                           f"      cutlass::gemm::kernel::detail::RasterOrderOptions::{order};")
    n_align = "N % 8 == 0 (TMA store)" if cfg.epilogue is Epilogue.TMA else "any N"
    if batched:
        n_align += f"; K % {8 * cfg.splits} == 0 (equal K ranges of whole 16-byte rows)"
    last = cfg.reduction is Reduction.LAST
    d_type = "float" if batched and not last else "cutlass::half_t"
    align_d = "1" if cfg.epilogue is Epilogue.NOSMEM else str(16 // d_bytes(cfg))
    values = {
        **_launch_values(cfg),
        **_operand_values(cfg),
        **_orientation_values(cfg),
        "name": config_name(family, cfg),
        "bm": str(cfg.bm), "bn": str(cfg.bn), "bk": str(cfg.bk),
        "cm": str(cfg.cluster_m), "cn": str(cfg.cluster_n),
        "schedule": cfg.schedule.value, "scheduler_name": cfg.scheduler.value, "epilogue_name": cfg.epilogue.value,
        "stages_desc": _stages_desc(cfg),
        "stages_est": str(pipeline_stages(cfg)), "smem_est": str(_shown_smem_bytes(cfg)),
        "swizzle": str(cfg.swizzle), "acc": cfg.acc.value,
        "acc_type": "float" if cfg.acc is Acc.FP32 else "cutlass::half_t",
        "kernel": kernel, "epilogue": epilogue, "stage_count": stages,
        "tile_scheduler": scheduler,
        "scheduler_tag_note": ": only the tag, one CTA per tile" if cfg.schedule in ONE_TILE_PER_CTA else "",
        "producer_design": _PRODUCER_DESIGN[cfg.schedule is Schedule.UNSPECIALIZED],
        "n_align": n_align, "schedule_design": _SCHEDULE_DESIGN[cfg.schedule], "scheduler_design": _tile_walk_design(cfg),
        "epilogue_design": _epilogue_design(cfg), "epilogue_tile": _epilogue_tile(cfg),
        "align_d": align_d, "element_d": d_type,
        "splits": str(cfg.splits), "scheduler_args": scheduler_args,
        "reduction_note": ", atomic (nondeterministic) reduction" if atomic else
                          " as a batch, summed by its last K range in the epilogue (reduction=last)" if last else
                          " as a batch, summed by splitk_reduce" + (" (launched with PDL)" if cfg.pdl else "")
                          if batched else "",
        "raster_note": {Raster.HEURISTIC: "", Raster.ALONG_M: " along M", Raster.ALONG_N: " along N"}[cfg.raster],
    }
    if last:
        values["epilogue"] = "TicketEpilogue, cudal2.kernels.sm90_last"
    epilogue_text = string.Template(sm90_last.COLLECTIVE_EPILOGUE) if last else _BUILT_EPILOGUE
    return {**values, "collective_epilogue": epilogue_text.substitute(values)}


# The generated source's design lines (part of stored sources, their hash: keep the wording as measured).
_SCHEDULE_DESIGN = {
    Schedule.COOPERATIVE: "Two consumer warpgroups run wgmma (operands from shared memory) on one tile, each on "
                          "BM/2 rows,\n//     into register accumulators; the producer warpgroup gives its "
                          "registers to them (setmaxnreg).",
    Schedule.PINGPONG: "Two consumer warpgroups run wgmma (operands from shared memory) on alternate tiles: "
                       "while one\n//     stores its tile (epilogue), the other computes the next one.",
    Schedule.BASIC: "One consumer warpgroup runs wgmma (operands from shared memory) on the CTA's one tile, then "
                    "stores it;\n//     the producer warp's TMA loads run ahead of it through the stage pipeline.",
    Schedule.UNSPECIALIZED: "Not warp-specialised: the same 128 threads run wgmma (operands from shared memory) "
                            "on the CTA's one tile,\n//     then store it.",
}
_ONE_TILE_WALK = "Not persistent: one CTA per output tile (grid = the tiles, in launch order), no tile scheduler loop."


def _tile_walk_design(cfg: Sm90Config) -> str:
    """The design line of how CTAs walk the tiles (the scheduler's, or one CTA per tile) and of split-K's form."""
    one_tile = cfg.schedule in ONE_TILE_PER_CTA  # the persistent tag, but no persistent loop
    if cfg.scheduler is Scheduler.STREAMK:
        # "fp32" even for fp16 accumulators: the wording as measured.
        reduced = ("reduced with fp32 atomics (the first range stores,\n//     the middle ones add at once, the last "
                   "waits for all: the summation order varies per call)." if cfg.reduction is Reduction.ATOMIC else
                   "reduced in a fixed order (deterministic).")
        if cfg.splits == 1:
            return ("Persistent stream-K: tail tiles' K loops are split across SMs so all SMs stay busy; "
                    f"partial sums\n//     meet in the workspace and are {reduced}")
        return (f"Split-K through the stream-K scheduler: each output tile's K loop in {cfg.splits} equal ranges "
                "on\n//     different CTAs (more CTAs than tiles for skinny long-K shapes); partial sums meet in "
                f"the\n//     workspace and are {reduced}")
    if not batched_split_k(cfg):
        return _ONE_TILE_WALK if one_tile else ("Persistent: one CTA per SM (clusters kept together) walks the "
                                                "output tiles in swizzled order.")
    if cfg.reduction is Reduction.LAST:  # the batch's partials summed in the GEMM's own epilogue (sm90_last)
        return (_ONE_TILE_WALK + "\n//     " if one_tile else "") + (
            f"Split-K as a batch: batch l of {cfg.splits} is K range l of every tile; each writes its fp32 partial to "
            "the\n//     workspace and takes the tile's ticket; the range drawing the last ticket sums all the "
            "tile's partials in\n//     order (deterministic) in the same epilogue: one launch, no reduction kernel.")
    if one_tile:
        return (_ONE_TILE_WALK + f"\n//     Split-K as a batch: grid.z is the K range l of {cfg.splits}; each tile "
                "writes its fp32 partial to slice l of the\n//     workspace; splitk_reduce sums the slices in order "
                "into C (deterministic).")
    return (f"Split-K as a batch: the GEMM is {cfg.splits} batches, batch l over K range l of every tile; "
            "persistent CTAs\n//     (one per SM) walk the tiles of all batches. Each tile writes its fp32 partial "
            "to slice l of the\n//     workspace; splitk_reduce sums the slices in order into C (deterministic).")


def _epilogue_design(cfg: Sm90Config) -> str:
    """The design line of the epilogue: half C, or split-K's fp32 partials, or reduction=last's ticket and sum."""
    if cfg.reduction is Reduction.LAST:
        return ("Epilogue: TicketEpilogue: fp32 partial -> the workspace -> ticket; the last range: the sum -> half -> "
                "shared memory\n//     -> 16-byte row stores into C (clipped at M, N). C (beta * C) is void: never "
                "read.")
    batched = batched_split_k(cfg)  # fp32 partials into the workspace, not half C
    kind = "fp32" if batched else "half"
    if cfg.epilogue is Epilogue.TMA:
        flow = (f"{kind} -> swizzled shared memory -> TMA store" + (" into the workspace" if batched else "")
                + " (clipped at M, N)")
    else:
        flow = f"{kind} -> predicated stores straight to " + ("the workspace" if batched else "global memory")
    return f"Epilogue: accumulators -> {flow}. C (beta * C) is void: never read."


def _epilogue_tile(cfg: Sm90Config) -> str:
    """The epilogue tile type: CUTLASS's auto choice (as every config stored before epi_n rendered) or rows x epi_n."""
    if not cfg.epi_n:
        return "cutlass::epilogue::collective::EpilogueTileAuto"
    return f"Shape<_{epilogue_rows(cfg)}, Int<{cfg.epi_n}>>  /* epilogue subtile: rows x epi_n columns */"


def _indent(text: str) -> str:
    """Two more spaces before each line of `text`: a piece of the entry point moved into host_cache's setup block."""
    return "".join("  " + line if line.strip() else line for line in text.splitlines(keepends=True))


_GEMM_RUN = "  if (gemm.run(stream) != cutlass::Status::kSuccess) return 4;\n"  # the launch, from a Gemm's Params
_STATIC_RUN = "  if (Gemm::run(params, stream) != cutlass::Status::kSuccess) return 4;\n"  # the launch, from own Params
_PERSISTENT_INIT = "  if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return 3;\n"
# The kernel's shared memory limit, set as Gemm::initialize() sets it: by the stream-K launch on every call, and
# by host_cache's once per thread and device.
_SMEM_ATTRIBUTE = """  int smem = GemmKernel::SharedStorageSize;
  if (smem >= (48 << 10) && cudaFuncSetAttribute(cutlass::device_kernel<GemmKernel>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
    return 3;
  }
"""

# How the call starts the kernel. Persistent: CUTLASS's initialize() and run(), as first measured (these sources must
# render unchanged). Stream-K: the flags are cleared by a kernel of the source, not initialize()'s memset (the
# generated comment above clear_flags says why).
_PERSISTENT_LAUNCH = {
    "workspace_note": "Gemm::get_workspace_size (stream-K partials and flags; 0 for persistent), zeroed on `stream` "
                      "by\n// CUTLASS's initialize() where it must be.",
    "flag_clearing": "",
    "init_step": "initialize",
    "launch": "  Gemm gemm;\n" + _PERSISTENT_INIT + _GEMM_RUN + "  return 0;\n",
}
_STREAMK_LAUNCH = {
    "workspace_note": "Gemm::get_workspace_size: the stream-K partials, then the barrier flags, which a kernel of\n"
                      "// this source zeroes on `stream` before each GEMM (not CUTLASS's initialize(): see clear_flags).",
    "flag_clearing": r"""
// Stream-K (and split-K) peers of an output tile meet at barrier flags in the workspace, which must read zero when the
// GEMM starts. CUTLASS's Gemm::initialize() clears them with cudaMemsetAsync; a CUDA graph (the offline timing, and
// any caller that captures) runs that as a memset node, ~2.3 us per call on an H200, where one more kernel node costs
// ~0.6 us (benchmarks/graph_gap.cu). So this kernel clears them, and initialize() is not called.
__global__ void clear_flags(uint32_t* flags, size_t words) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x) {
    flags[i] = 0u;
  }
}

// The flags follow the partials to the end of the workspace. The partials' size is computed as the kernel computes it
// (PersistentTileSchedulerSm90StreamK::fixup): split-K keeps one partial per output tile, stream-K one per stream-K
// tile. Returns the launch error, if any; nothing to clear when the scheduler chose plain data-parallel tiles.
static cudaError_t clear_stream_k_flags(typename GemmKernel::Params const& params, void* workspace,
                                        size_t workspace_bytes, cudaStream_t stream) {
  using SchedulerParams = typename GemmKernel::TileScheduler::Params;
  SchedulerParams const& p = params.scheduler;
  uint64_t partial_tiles = p.divmod_splits_.divisor > 1   ? p.units_per_problem_
                           : p.requires_separate_reduction() ? p.sk_tiles_ * SchedulerParams::max_peers_per_tile(
                                                                               p.sk_units_, p.sk_tiles_)
                                                             : p.sk_tiles_;
  size_t partial_bytes = SchedulerParams::get_reduction_workspace_size(
      partial_tiles, cutlass::gemm::GemmCoord(size<0>(TileShape{}), size<1>(TileShape{}), size<2>(TileShape{})),
      cutlass::sizeof_bits<ElementAccumulator>::value);
  if (workspace_bytes == 0 || p.reduction_workspace_ == nullptr) return cudaSuccess;
  uint8_t* begin = static_cast<uint8_t*>(p.reduction_workspace_) + partial_bytes;
  uint8_t* end = static_cast<uint8_t*>(workspace) + workspace_bytes;
  if (begin >= end) return cudaSuccess;
  size_t words = size_t(end - begin) / sizeof(uint32_t);
  unsigned blocks = unsigned(words < 256 * 1024 ? (words + 255) / 256 : 1024);
  clear_flags<<<blocks, 256, 0, stream>>>(reinterpret_cast<uint32_t*>(begin), words);
  return cudaGetLastError();
}
""",
    "init_step": "clearing the stream-K flags",
    "launch": """  // initialize() without its workspace memset: the kernel's parameters, its shared memory limit, then the flags.
  using cudal2_sm90::GemmKernel;
  typename GemmKernel::Params params = GemmKernel::to_underlying_arguments(args, workspace);
""" + _SMEM_ATTRIBUTE + """  if (cudal2_sm90::clear_stream_k_flags(params, workspace, Gemm::get_workspace_size(args), stream) != cudaSuccess) {
    return 3;
  }
""" + _STATIC_RUN + "  return 0;\n",
}


_BATCHED_CHECKS = r"""  // Split-K as a batch: equal K ranges of whole 16-byte rows, the partials first in the workspace, then the GEMM's.
  if (K % (8 * $splits) != 0) return 1;
  if (cudal2_sm90::partials_bytes(M, N) + Gemm::get_workspace_size(args) > workspace_bytes) return 2;
"""
_GEMM_WORKSPACE = "  void* gemm_workspace = static_cast<uint8_t*>(workspace) + cudal2_sm90::partials_bytes(M, N);\n"
_BATCHED_REDUCE = r"""  const long long MN = (long long)M * N;
  const int vec4 = (MN % 4 == 0 && reinterpret_cast<uintptr_t>(C) % 4 == 0) ? 1 : 0;  // workspace: 256-byte aligned
  const long long work = vec4 ? MN / 4 : MN;
  const unsigned blocks = unsigned(work < 1024LL * cudal2_sm90::REDUCE_THREADS
                                       ? (work + cudal2_sm90::REDUCE_THREADS - 1) / cudal2_sm90::REDUCE_THREADS : 1024);
$reduce_launch"""
_BATCHED_INIT = "  if (gemm.initialize(args, gemm_workspace, stream) != cutlass::Status::kSuccess) return 3;\n"

_REDUCE_LAUNCH = string.Template("""  cudal2_sm90::splitk_reduce<<<blocks, cudal2_sm90::REDUCE_THREADS, 0, stream>>>(
      static_cast<const float*>(workspace), C, MN, $splits, vec4);
  return cudaGetLastError() == cudaSuccess ? 0 : 4;
""")
# Programmatic dependent launch: splitk_reduce may start before the GEMM before it on `stream` has finished (its
# griddepcontrol.wait holds its reads until the GEMM's writes are visible), which hides one kernel launch per call.
_REDUCE_LAUNCH_PDL = string.Template(cuda_parts.pdl_launch_config("blocks", "cudal2_sm90::REDUCE_THREADS", "  ") + """\
  const cudaError_t e = cudaLaunchKernelEx(&launch, cudal2_sm90::splitk_reduce, static_cast<const float*>(workspace),
                                           C, MN, int($splits), vec4);
  return e == cudaSuccess ? 0 : 4;
""")

_BATCHED_HELPERS = string.Template(r"""
// Split-K as a batch: the GEMM leaves $splits fp32 partials of C in the workspace, slice l (M x N, row-major) from K
// range l, which splitk_reduce sums in the order l = 0, 1, ... (deterministic) into C.
constexpr int REDUCE_THREADS = 256;

$splitk_reduce
// The partials' bytes, rounded up to 256 so that the GEMM's own workspace after them stays aligned.
static size_t partials_bytes(int M, int N) { return (size_t($splits) * M * N * sizeof(float) + 255) / 256 * 256; }

static size_t split_workspace_bytes(int M, int N, int K) {
  return partials_bytes(M, N) + Gemm::get_workspace_size(make_arguments(nullptr, nullptr, nullptr, M, N, K));
}
""")


def _reduce_launch(cfg: Sm90Config) -> str:
    return (_REDUCE_LAUNCH_PDL if cfg.pdl else _REDUCE_LAUNCH).substitute(splits=cfg.splits)


def _batch_checks(cfg: Sm90Config) -> str:
    """Split-K as a batch: the entry point's checks after the arguments (equal K ranges, the workspace; with
    reduction=last a ticket per tile)."""
    return string.Template(sm90_last.CHECKS if cfg.reduction is Reduction.LAST else _BATCHED_CHECKS).substitute(
        splits=cfg.splits)


def _after_batch(cfg: Sm90Config) -> str:
    """Split-K as a batch: what the entry point does after the GEMM's launch: splitk_reduce, or with reduction=last
    nothing (the epilogue summed the partials)."""
    if cfg.reduction is Reduction.LAST:
        return "  return 0;\n"
    return string.Template(_BATCHED_REDUCE).substitute(splits=cfg.splits, reduce_launch=_reduce_launch(cfg))


# host_cache's pieces of _CACHED_ENTRY. Every launch kind keeps GemmKernel::to_underlying_arguments() as `params` and
# launches with Gemm::run(params): initialize() without its workspace step, which the persistent scheduler does not
# need (no workspace) and the stream-K flags need on every call (clear_stream_k_flags, as without the cache).
_PARAMS = "  params = GemmKernel::to_underlying_arguments(args, {});\n"


def _cached_launch_values(cfg: Sm90Config, values: dict[str, str]) -> dict[str, str]:
    """host_cache's pieces of the entry point: what a thread keeps besides `params` (`state`), the argument checks
    and the setup that build it (`checks`, `setup`: in the block a changed call runs), the shared memory limit set
    once per thread and device, and the launch every call makes (`call`)."""
    common = {"checks": _indent(string.Template(_ARGUMENT_CHECKS).substitute(values)),
              "smem_attribute": _indent(_SMEM_ATTRIBUTE),
              "init_step": "the device query or the shared memory limit" + (
                  ", or clearing the stream-K flags" if cfg.scheduler is Scheduler.STREAMK else "")}
    if batched_split_k(cfg):
        return {**common, "state": "",
                "setup": _indent(_batch_checks(cfg) + _GEMM_WORKSPACE + _PARAMS.format("gemm_workspace")),
                "call": _STATIC_RUN + _after_batch(cfg)}
    if cfg.scheduler is Scheduler.STREAMK:
        return {**common,
                "state": "  static thread_local size_t gemm_workspace_bytes = 0;  // Gemm::get_workspace_size of `built`\n",
                "setup": _indent(_PARAMS.format("workspace") + "  gemm_workspace_bytes = Gemm::get_workspace_size(args);\n"),
                "call": "  // The flags on every call: the GEMM before left them set.\n"
                        "  if (cudal2_sm90::clear_stream_k_flags(params, workspace, gemm_workspace_bytes, stream) != "
                        "cudaSuccess) return 3;\n" + _STATIC_RUN + "  return 0;\n"}
    return {**common, "state": "", "setup": _indent(_PARAMS.format("workspace")), "call": _STATIC_RUN + "  return 0;\n"}


def _launch_values(cfg: Sm90Config) -> dict[str, str]:
    if batched_split_k(cfg):
        last = cfg.reduction is Reduction.LAST  # partials kept per tile and summed in the epilogue (sm90_last)
        return {
            "workspace_note": f"the {cfg.splits} fp32 partials of " + ("every output tile" if last else "C (M x N each)")
                              + ", then Gemm::get_workspace_size (0 for persistent).",
            "flag_clearing": string.Template(sm90_last.HELPERS).substitute(splits=cfg.splits, bm=cfg.bm, bn=cfg.bn)
                             if last else _BATCHED_HELPERS.substitute(
                                 splits=cfg.splits, splitk_reduce=cuda_parts.splitk_reduce(wait=cfg.pdl, batched=True)),
            "init_step": "initialize",
            "launch": _batch_checks(cfg) + "  Gemm gemm;\n" + _GEMM_WORKSPACE + _BATCHED_INIT + _GEMM_RUN
                      + _after_batch(cfg),
            "workspace_bytes": f"cudal2_sm90::split_workspace_bytes({_mn(cfg)}, K)",
        }
    launch = _STREAMK_LAUNCH if cfg.scheduler is Scheduler.STREAMK else _PERSISTENT_LAUNCH
    return {**launch, "workspace_bytes": "cudal2_sm90::Gemm::get_workspace_size("
                                         f"cudal2_sm90::make_arguments(nullptr, nullptr, nullptr, {_mn(cfg)}, K))"}


_LAYOUTS = """using LayoutA = cutlass::layout::RowMajor;     // A[M,K], K contiguous
using LayoutB = cutlass::layout::ColumnMajor;  // B[N,K] viewed as K x N, K contiguous
using LayoutD = cutlass::layout::RowMajor;     // C[M,N], N contiguous
"""
_SWAPPED_LAYOUTS = """// Operands swapped: the kernel's M x N is C's N x M.
using LayoutA = cutlass::layout::RowMajor;     // the kernel's A is B[N,K], K contiguous
using LayoutB = cutlass::layout::ColumnMajor;  // its B is A[M,K] viewed as K x M, K contiguous
using LayoutD = cutlass::layout::ColumnMajor;  // its D is C^T[N,M] stored column-major: C[M,N] row-major
"""


def _mn(cfg: Sm90Config) -> str:
    """C's M and N as the kernel's M and N."""
    return "N, M" if cfg.swap_ab else "M, N"


def _orientation_values(cfg: Sm90Config) -> dict[str, str]:
    """What swapping the operands changes in the source: the layouts, D's strides and the call's argument order.
    Unswapped, the text is what every stored source was measured with."""
    if not cfg.swap_ab:
        return {"swap_note": "", "layouts": _LAYOUTS, "stride_d": "make_stride(int64_t(N), _1{}, int64_t(M) * N)",
                "call_note": "", "ab": "A, B", "mn": _mn(cfg)}
    return {"swap_note": "\n//   Operands swapped: the kernel computes C^T[N,M] = B[N,K] * A[M,K]^T (C^T column-major "
                         "is C row-major),\n//   so below its M (BM, cluster along M, raster along M) runs along C's N "
                         "and its N along C's M.",
            "layouts": _SWAPPED_LAYOUTS, "stride_d": "make_stride(_1{}, int64_t(M), int64_t(M) * N)",
            "call_note": "  // Operands swapped: the kernel's A is B, its B is A, its M x N is C's N x M.\n",
            "ab": "B, A", "mn": _mn(cfg)}


def _operand_values(cfg: Sm90Config) -> dict[str, str]:
    """make_arguments' D and batch: C itself with L = 1, or for split-K as a batch the workspace's fp32 partials with
    L = splits, batch l starting K/splits elements further along A's and B's rows."""
    if not batched_split_k(cfg):
        return {"operand_note": "", "mode": "kGemm", "problem_note": "M, N, K, L (L = 1 batch)",
                "problem": "{M, N, K, 1}", "a_batch": "int64_t(M) * K", "b_batch": "int64_t(N) * K",
                "d_param": "half* C", "d_pointer": "reinterpret_cast<ElementD*>(C)", "d_arg": "C",
                "epilogue_partials": ""}
    s = cfg.splits
    batch = {"mode": "kBatched", "problem_note": f"M, N, K / {s}, L = {s} K ranges",
             "problem": f"{{M, N, K / {s}, {s}}}", "a_batch": f"int64_t(K) / {s}", "b_batch": f"int64_t(K) / {s}"}
    if cfg.reduction is Reduction.LAST:  # D is C (every range's tile is C's); the partials go to TicketEpilogue
        return {**batch, "operand_note": f"\n  // Split-K as a batch: batch l is K range [l * K/{s}, (l + 1) * K/{s}) "
                                         "of A's and B's rows; its partial goes to\n  // the workspace, and the "
                                         "range that arrives last stores C.",
                "d_param": "half* C, float* partials", "d_pointer": "reinterpret_cast<ElementD*>(C)",
                "d_arg": "C, static_cast<float*>(workspace)", "epilogue_partials": ", partials"}
    return {**batch, "operand_note": f"\n  // Split-K as a batch: batch l is K range [l * K/{s}, (l + 1) * K/{s}) of "
                                     "A's and B's rows, and\n  // writes slice l of the fp32 partials.",
            "d_param": "float* partials", "d_pointer": "partials", "d_arg": "static_cast<float*>(workspace)",
            "epilogue_partials": ""}


_HEADER = string.Template(r"""// $name
//
// HGEMM for sm_90a (H100/H200), generated by cudal2.kernels.sm90 from CUTLASS 3.x collectives.
//   C[M,N] = A[M,K] * B[N,K]^T, all row-major half; accumulate $acc.$swap_note
//
// Config
//   tile BM x BN x BK  = $bm x $bn x $bk        cluster = ${cm}x${cn}x1 (CTAs along M x N)
//   kernel schedule    = $schedule ($kernel)
//   tile scheduler     = $scheduler_name ($tile_scheduler$scheduler_tag_note), rasterisation swizzle $swizzle$raster_note, split-K $splits$reduction_note
//   epilogue           = $epilogue_name ($epilogue)
//   stages             = $stages_desc; model: $stages_est stages, ~$smem_est bytes of shared memory
//
// Design
//   - $producer_design
//   - $schedule_design
//   - $scheduler_design
//   - $epilogue_design
// Shapes: any M >= 1; K % 8 == 0 (16-byte TMA row strides of A and B); $n_align.
// Workspace: $workspace_note

""")

# Who issues the TMA loads (the warp-specialised text is part of every stored source's hash: keep it as it is).
_PRODUCER_DESIGN = {
    False: "One producer warp issues TMA loads of A (BM x BK) and B (BN x BK) tiles into 128B-swizzled shared memory,"
           "\n//     multicast to the CTAs of a cluster that need the same tile, through an mbarrier pipeline of stages.",
    True: "One thread of the warpgroup issues TMA loads of A (BM x BK) and B (BN x BK) tiles into 128B-swizzled "
          "shared\n//     memory, multicast to the CTAs of a cluster that need the same tile, through an mbarrier "
          "pipeline of stages.",
}

_INCLUDES = """#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/kernel_hardware_info.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>

// A named namespace below: CuTe opens anonymous namespaces inside namespace cute, and `using namespace cute;`
// inside an anonymous namespace of ours makes nvcc's generated launch stub ambiguous.
"""

# CUTLASS's own epilogue (TMA or no-smem), as every config before reduction=last rendered it.
_BUILT_EPILOGUE = string.Template("""using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    $epilogue_tile, ElementAccumulator, ElementCompute,
    void, LayoutD, kAlignD,  // no C source
    ElementD, LayoutD, kAlignD,
    cutlass::epilogue::$epilogue>::CollectiveOp;""")

# The kernel's types, inside a namespace that has `using namespace cute;` (shared by render and probe_source).
_TYPES = string.Template(r"""using ElementA = cutlass::half_t;
using ElementB = cutlass::half_t;
using ElementD = $element_d;
using ElementAccumulator = $acc_type;
using ElementCompute = float;                 // alpha = 1, beta = 0: exact in either precision
${layouts}constexpr int kAlignAB = 8;                    // elements per 16-byte TMA access
constexpr int kAlignD = $align_d;

using TileShape = Shape<Int<$bm>, Int<$bn>, Int<$bk>>;
using ClusterShape = Shape<Int<$cm>, Int<$cn>, _1>;

$collective_epilogue

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    ElementA, LayoutA, kAlignAB,
    ElementB, LayoutB, kAlignAB,
    ElementAccumulator, TileShape, ClusterShape,
    $stage_count,
    cutlass::gemm::$kernel>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
    Shape<int, int, int, int>,  // $problem_note
    CollectiveMainloop, CollectiveEpilogue, cutlass::gemm::$tile_scheduler>;

using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
""")

_ENTRY_HEAD = r"""
// The same arguments for the workspace query and the call: the workspace size depends on them (SM count, shape).
static typename Gemm::Arguments make_arguments(const half* A, const half* B, $d_param, int M, int N, int K) {
  int device = 0;
  cutlass::KernelHardwareInfo hw;
  if (cudaGetDevice(&device) == cudaSuccess) {
    hw.device_id = device;
    hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
  }
  // Packed strides (M, K, L), (N, K, L), (M, N, L); 64-bit so M * K past 2^31 elements stays exact.$operand_note
  typename GemmKernel::StrideA stride_a = make_stride(int64_t(K), _1{}, $a_batch);
  typename GemmKernel::StrideB stride_b = make_stride(int64_t(K), _1{}, $b_batch);
  typename GemmKernel::StrideD stride_d = $stride_d;
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::$mode,
      $problem,
      {reinterpret_cast<const ElementA*>(A), stride_a, reinterpret_cast<const ElementB*>(B), stride_b},
      {{}, nullptr, stride_d, $d_pointer, stride_d$epilogue_partials},
      hw};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  args.scheduler.max_swizzle_size = $swizzle;$scheduler_args
  return args;
}
$flag_clearing
}  // namespace cudal2_sm90

extern "C" size_t cudal2_workspace_bytes(int M, int N, int K) {
  return $workspace_bytes;
}
"""
_RETURNS = """
// Returns 0 on success; 1 shape not implementable (alignment), 2 workspace too small, 3 $init_step, 4 launch.
extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
  using cudal2_sm90::Gemm;
"""
_ARGUMENT_CHECKS = """$call_note  typename Gemm::Arguments args = cudal2_sm90::make_arguments($ab, $d_arg, $mn, K);
  if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return 1;
  if (Gemm::get_workspace_size(args) > workspace_bytes) return 2;
"""
_ENTRY = string.Template(_ENTRY_HEAD + _RETURNS + _ARGUMENT_CHECKS + "$launch}\n")

# host_cache: the arguments, their checks (`$checks`: _ARGUMENT_CHECKS as rendered) and the launch's setup run only
# when the call differs from the thread's last one in what the parameters were built from; `$state` declares what is
# kept, `$setup` builds it, `$call` launches.
_CACHED_ENTRY = string.Template(_ENTRY_HEAD + r"""
// Host cache (host_cache): the kernel's parameters (CUTLASS's Params: the TMA descriptors of A, B and C, the tile
// scheduler's setup) and the shared memory attribute are built on a thread's first call, and again only when the
// pointers, shape, workspace or device differ from its last call's; otherwise a call only launches. CUTLASS's
// initialize() rebuilds them on every call: host time that a CUDA graph replays without, but that a caller outside
// a graph pays on every call. A call's data may change freely: only the pointers are kept, never what they hold.
namespace cudal2_sm90 {
struct CallKey {  // what the kept parameters were built from
  const void* a;
  const void* b;
  const void* c;
  int m, n, k;
  const void* workspace;
  size_t workspace_bytes;
  int device;
  bool operator==(CallKey const& o) const {
    return a == o.a && b == o.b && c == o.c && m == o.m && n == o.n && k == o.k && workspace == o.workspace &&
           workspace_bytes == o.workspace_bytes && device == o.device;
  }
};
}  // namespace cudal2_sm90
""" + _RETURNS + r"""  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 3;
  const cudal2_sm90::CallKey key{A, B, C, M, N, K, workspace, workspace_bytes, device};
  using cudal2_sm90::GemmKernel;
  static thread_local cudal2_sm90::CallKey built{};        // all zero (M = 0): matches no call
  static thread_local typename GemmKernel::Params params;  // GemmKernel::to_underlying_arguments() for `built`
  static thread_local int attribute_device = -1;           // the device this thread set the shared memory limit on
$state  if (!(key == built)) {
    built = cudal2_sm90::CallKey{};  // a failed setup keeps nothing
$checks$setup    built = key;
  }
  if (device != attribute_device) {  // once per thread and device, not on every call as initialize() sets it
$smem_attribute    attribute_device = device;
  }
$call}
""")


def probe_source(family: Sm90Family, cfgs: list[Sm90Config]) -> str:
    """A host program printing, per config, `index stages smem_bytes epilogue_smem_bytes` as CUTLASS computes them
    (no kernel is instantiated, so it compiles fast and runs without a GPU); it calibrates and tests the smem model."""
    blocks = [
        f"namespace probe{i} {{\nusing namespace cute;\n"
        f"{sm90_last.TICKET_EPILOGUE if c.reduction is Reduction.LAST else ''}"
        f"{_TYPES.substitute(_template_values(family, c))}}}\n"
        for i, c in enumerate(cfgs)
    ]
    prints = [
        f'  printf("{i} %d %d %d\\n", probe{i}::CollectiveMainloop::DispatchPolicy::Stages, '
        f"probe{i}::GemmKernel::SharedStorageSize, int(sizeof(probe{i}::CollectiveEpilogue::SharedStorage)));"
        for i in range(len(cfgs))
    ]
    define = EXTENDED_GMMA_DEFINE if any(map(extended_gmma, cfgs)) else ""
    last = sm90_last.INCLUDES if any(c.reduction is Reduction.LAST for c in cfgs) else ""
    return "".join((define, _INCLUDES, last, "#include <cstdio>\n\n", *blocks, "\nint main() {\n", "\n".join(prints), "\n}\n"))
