"""sm80-style HGEMM family: mma.sync m16n8k16 + ldmatrix + cp.async multistage pipeline (the Ampere recipe).

Built from kernels/seed/mma_multistage.cu (verified on an H200) and generalised; every config renders one readable
.cu source (the candidate contract, README.md) that serves any M, N, K >= 1:

    block tile   BM x BN, K sliced by BK (32 or 64); warps WARPS_M x WARPS_N, each a (BM/WARPS_M) x (BN/WARPS_N)
                 warp tile of m16n8 accumulators
    pipeline     STAGES shared-memory stages filled by 16-byte cp.async (zero-fill outside the matrices), one
                 __syncthreads per K slice; fragments double-buffered in registers (ldmatrix of k-step s+1,
                 including the first k-step of the next slice, is issued before the mma of k-step s)
    smem         K-contiguous rows of BK halves, 16-byte chunks XOR-swizzled so ldmatrix is bank-conflict free
    launch order grouped rasterisation: GROUP_M tile-rows walked together for L2 reuse of B tiles
    split-K      SPLIT_K contiguous K ranges (grid z); fp32 partials in the workspace, then a reduction kernel that
                 sums them in split order (deterministic, no atomics); or, with reduce=cluster (sm_90 only), the
                 ranges of a tile launched as one thread-block cluster that sums them in the same order through
                 distributed shared memory: no workspace, no second kernel (up to 16 ranges; over 8 the kernel opts
                 in to non-portable cluster sizes); with reduce=push the same cluster sums in the push form: after a
                 cluster barrier every CTA stores its partial rows straight into the shared memory of the CTA that
                 sums them, and after a second one each CTA adds its rows from its own memory (no remote reads:
                 graph_gap priced a pulled 16-way cluster cut at 3.57 us, a pushed one at 1.99, on an H100); or,
                 with reduce=last (any arch), the CTA that arrives last at
                 its tile's ticket sums the tile's partials from the workspace in the same launch (no second kernel
                 up to MAX_TICKETS tiles); with pdl (sm_90 only) the workspace reduction is launched with
                 programmatic dependent launch: it starts while the GEMM finishes and waits for its partials in place
    any shape    the fast path needs K % 8 == 0 and 16-byte aligned A, B; otherwise the same kernel is instantiated
                 with a predicated scalar gather (each thread builds 16-byte chunks element by element)
    accumulate   fp32 (default) or fp16 (Acc.FP16: only for fp16-accuracy tasks)
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from cudal2.kernels import cuda_parts
from cudal2.kernels.cuda_parts import MAX_CLUSTER, MAX_PORTABLE_CLUSTER
from cudal2.kernels.family import ADDED_LATER, BadConfig, Tiling, build_config, config_name
from cudal2.sandbox.lt_algo import LtAlgo
from cudal2.sandbox.types import Acc, Task

# Shared memory, bytes: (opt-in maximum per block, per SM). sm_80: 163 KB / 164 KB; sm_86/89: 99 / 100 KB;
# sm_90: 227 / 228 KB (CUDA programming guide, "Compute capabilities", technical specifications table).
SMEM_LIMITS: dict[str, tuple[int, int]] = {
    "sm_80": (166912, 167936),
    "sm_86": (101376, 102400),
    "sm_89": (101376, 102400),
    "sm_90": (232448, 233472),
    "sm_90a": (232448, 233472),
}
MAX_THREADS = 1024
REGS_PER_SM = 65536
MAX_REGS_PER_THREAD = 255
# Registers beyond accumulators and fragments, least-squares fit to ptxas -v (nvcc 13.0, sm_90a, fast path) over
# 21 random unspilled configs of this family: ~2 per 16-byte chunk a thread copies per K slice plus ~40 (indices,
# pointers, loop state); within -21..+30 of ptxas. E.g. 128x256x32 with 2x4 warps: 128 + 64 + 2 x 6 + 40 = 244
# estimated, 245 used.
REGS_PER_CHUNK = 2
OVERHEAD_REGS = 40
# Split-K workspace ceiling (bytes): the split count is lowered until splits * M * N * 4 bytes fit.
WS_CAP_BYTES = 1 << 30
# The cluster reduction's fp32 padding of each parked tile row (floats; keeps rows 16-byte aligned, shifts banks).
RED_PAD = 4


class Reduce(str, Enum):
    """Where split-K partial tiles are summed."""

    WORKSPACE = "workspace"  # fp32 slabs in the workspace, then a second kernel (any arch)
    CLUSTER = "cluster"  # the K ranges of a tile form one thread-block cluster and sum through its shared memory (sm_90)
    PUSH = "push"  # the same cluster, each CTA storing its partial rows into the shared memory of the CTA that sums them
    LAST = "last"  # fp32 slabs in the workspace, summed per tile by its last CTA to arrive, in the same launch (any arch)


@dataclass(frozen=True)
class Sm80Config:
    """One kernel. Tiles in elements; split_k = K ranges at most (fewer when K is short)."""

    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int
    split_k: int
    group_m: int  # rasterisation: tile-rows walked together (1 = plain row-major launch order)
    min_blocks: int  # __launch_bounds__ minimum resident blocks per SM (caps registers at 64K / (threads * this))
    acc: Acc
    reduce: Reduce = field(default=Reduce.WORKSPACE, metadata=ADDED_LATER)  # where split-K partials are summed
    # The workspace reduction launched with programmatic dependent launch (sm_90): a second kernel node costs ~0.6 us
    # in graph replay (benchmarks/graph_gap.cu), which PDL overlaps with the GEMM's tail, as cuBLAS launches its own.
    pdl: bool = field(default=False, metadata=ADDED_LATER)

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def sums_in_cluster(self) -> bool:
        """Whether split-K's partials are summed in a thread-block cluster (reduce=cluster, or pushed: reduce=push)."""
        return self.reduce in (Reduce.CLUSTER, Reduce.PUSH)

    @property
    def warp_m(self) -> int:
        return self.bm // self.warps_m

    @property
    def warp_n(self) -> int:
        return self.bn // self.warps_n

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: STAGES x (A slice + B slice) halves; with the cluster reduction at least the
        parked fp32 tile (BM rows of BN + RED_PAD floats), which reuses the stages once the K loop is done; pushed,
        the inbox of every range's rows that a CTA sums (at most BM + split_k - 1 rows), over the stages too."""
        pipeline = self.stages * (self.bm + self.bn) * self.bk * 2
        if self.reduce is Reduce.CLUSTER:
            return max(pipeline, self.bm * (self.bn + RED_PAD) * 4)
        if self.reduce is Reduce.PUSH:
            return max(pipeline, (self.bm + self.split_k - 1) * (self.bn + RED_PAD) * 4)
        return pipeline

    @property
    def chunks_per_thread(self) -> int:
        """16-byte cp.async copies one thread issues per K slice (A and B)."""
        return (self.bm + self.bn) * (self.bk // 8) // self.threads

    @property
    def est_registers(self) -> int:
        """Per-thread estimate: accumulators + double-buffered A/B fragments + copy addressing + overhead."""
        mi, ni = self.warp_m // 16, self.warp_n // 8
        acc_words = mi * ni * (4 if self.acc is Acc.FP32 else 2)
        return acc_words + 2 * (mi * 4 + ni * 2) + REGS_PER_CHUNK * self.chunks_per_thread + OVERHEAD_REGS


SPACE: dict[str, tuple[Any, ...]] = {
    "bm": (16, 32, 64, 128, 256),
    "bn": (16, 32, 64, 128, 256),
    "bk": (32, 64),
    "warps_m": (1, 2, 4, 8),
    "warps_n": (1, 2, 4, 8),
    "stages": (2, 3, 4, 5, 6, 8),
    "split_k": (1, 2, 3, 4, 6, 8, 16),
    "group_m": (1, 4, 8, 16),
    "min_blocks": (1, 2),
    "acc": tuple(Acc),
    "reduce": tuple(Reduce),
    "pdl": (False, True),
}


class Sm80Family:
    """mma.sync / ldmatrix / cp.async kernels for sm_80 and later (see the module docstring)."""

    name = "sm80_mma"
    archs = ("sm_80", "sm_90a")
    # Only the K split and where it is summed: the tile sizes fix the warp tiling and the load loops (the body).
    decomposition = ("split_k", "reduce")

    def space(self) -> dict[str, tuple[Any, ...]]:
        return dict(SPACE)

    def default(self) -> Sm80Config:
        """The seed kernel's shape: 128x128x32, 2x4 warps (64x32 warp tiles), 4 stages, GROUP_M 8."""
        return Sm80Config(bm=128, bn=128, bk=32, warps_m=2, warps_n=4, stages=4, split_k=1, group_m=8,
                          min_blocks=1, acc=Acc.FP32)

    def make(self, params: dict[str, Any]) -> Sm80Config:
        return build_config(Sm80Config, SPACE, params)

    def prune(self, cfg: Sm80Config, arch: str) -> str | None:
        if arch not in SMEM_LIMITS:
            return f"no shared-memory model for {arch} (known: {', '.join(SMEM_LIMITS)})"
        block_smem, sm_smem = SMEM_LIMITS[arch]
        if cfg.threads > MAX_THREADS:
            return f"{cfg.warps_m}x{cfg.warps_n} warps = {cfg.threads} threads per block (> {MAX_THREADS})"
        if cfg.bm % cfg.warps_m or cfg.bn % cfg.warps_n or cfg.warp_m % 16 or cfg.warp_n % 16:
            return (f"warp tile {cfg.bm}/{cfg.warps_m} x {cfg.bn}/{cfg.warps_n} does not split into m16n8k16 "
                    "fragments (needs warp M and warp N multiples of 16: ldmatrix.x4 loads B in n16 pairs)")
        chunks = cfg.bk // 8
        if (cfg.bm * chunks) % cfg.threads or (cfg.bn * chunks) % cfg.threads:
            return (f"load chunks not evenly divisible among threads: {cfg.bm}x{cfg.bk} A and {cfg.bn}x{cfg.bk} B "
                    f"slices are {cfg.bm * chunks} and {cfg.bn * chunks} 16-byte chunks for {cfg.threads} threads")
        if cfg.reduce is Reduce.LAST and cfg.split_k == 1:
            return "the last-arrival reduction sums split-K partials: split_k=1 has none (use reduce=workspace)"
        if cfg.sums_in_cluster:
            if not arch.startswith("sm_90"):
                return f"the cluster reduction needs thread-block clusters and distributed shared memory (sm_90), not {arch}"
            if cfg.split_k == 1:
                return "the cluster reduction sums split-K partials: split_k=1 has none (use reduce=workspace)"
            if cfg.split_k > MAX_CLUSTER:
                return (f"split_k={cfg.split_k} CTAs per cluster: over the {MAX_CLUSTER} that sm_90 schedules "
                        "(with the non-portable opt-in)")
        if cfg.pdl:
            if not arch.startswith("sm_90"):
                return f"pdl (programmatic dependent launch, griddepcontrol) needs sm_90, not {arch}"
            if not _reduces_in_workspace(cfg):
                return "pdl starts split-K's reduction kernel early: only split_k > 1 with reduce=workspace has one"
        if cfg.smem_bytes > block_smem:
            parked = " or the parked fp32 tile" if cfg.sums_in_cluster else ""
            return (f"shared memory {cfg.smem_bytes} B ({cfg.stages} stages x ({cfg.bm}+{cfg.bn}) x {cfg.bk} halves"
                    f"{parked}) over the {block_smem} B per-block limit of {arch}")
        regs = cfg.est_registers
        if regs > MAX_REGS_PER_THREAD:
            return (f"accumulator + fragment registers estimate {regs}/thread over {MAX_REGS_PER_THREAD} "
                    f"(warp tile {cfg.warp_m}x{cfg.warp_n}, {cfg.acc.value} accumulate): it would spill")
        cap = min(MAX_REGS_PER_THREAD, REGS_PER_SM // (cfg.threads * cfg.min_blocks) // 8 * 8)
        if regs > cap:
            return (f"registers estimate {regs}/thread over the {cap} that {cfg.min_blocks} resident block(s) of "
                    f"{cfg.threads} threads allow: it would spill")
        if cfg.min_blocks * cfg.smem_bytes > sm_smem:
            return (f"{cfg.min_blocks} resident blocks need {cfg.min_blocks * cfg.smem_bytes} B of shared memory, "
                    f"over the {sm_smem} B per SM of {arch}")
        return None

    def supports(self, cfg: Sm80Config, task: Task) -> str | None:
        if cfg.acc is Acc.FP16 and task.acc is Acc.FP32:
            return "fp16 accumulation cannot meet an fp32-accuracy task"
        return None

    def tiling(self, cfg: Sm80Config) -> Tiling:
        return Tiling(cfg.bm, cfg.bn, cfg.bk, cfg.split_k, cluster_reduce=cfg.sums_in_cluster,
                      last_arrival=cfg.reduce is Reduce.LAST)

    def like_cublaslt(self, lt: LtAlgo) -> list[Sm80Config]:
        """No config: cuBLASLt's choices on sm_90 are wgmma kernels with TMA-multicast clusters, which mma.sync kernels
        have no counterpart for (their tile and split-K alone would mimic the wrong kernel)."""
        return []

    def settle(self, cfg: Sm80Config) -> Sm80Config:
        return cfg  # every field is used by every config

    def rerender_gain(self, cfg: Sm80Config) -> float:
        return 1.0  # no change of the code has sped a whole kernel up since configs were stored

    def render(self, cfg: Sm80Config) -> str:
        if not isinstance(cfg, Sm80Config):
            raise BadConfig(f"not an Sm80Config: {cfg!r}")
        return _TEMPLATE.substitute(_values(self, cfg))


def _reduces_in_workspace(cfg: Sm80Config) -> bool:
    """Whether splitk_reduce runs: split-K with the workspace reduction. Only these render its batched loads; the
    rest keep the one-by-one loop (never run), so their sources stay byte for byte the ones stored."""
    return cfg.split_k > 1 and cfg.reduce is Reduce.WORKSPACE


def _values(family: Sm80Family, cfg: Sm80Config) -> dict[str, str]:
    mi, ni = cfg.warp_m // 16, cfg.warp_n // 8
    chunks = cfg.bk // 8
    rows_per_key = 128 // (cfg.bk * 2)  # rows that share one XOR key: a 128-byte line holds 2 rows (BK 32) or 1 (64)
    design = f"""\
Config {config_name(family, cfg)}
{cuda_parts.config_lines(cfg)}

C[M,N] = A[M,K] * B[N,K]^T ("TN", torch.nn.functional.linear's layout), all row-major half in memory:
C[m][n] = sum_k A[m*K + k] * B[n*K + k]; {cfg.acc.value} accumulation.

Tiling
  Block tile {cfg.bm} (M) x {cfg.bn} (N), K sliced by {cfg.bk}; {cfg.threads} threads = {cfg.warps_m} x {cfg.warps_n} warps,
  warp tile {cfg.warp_m} x {cfg.warp_n} = {mi} m16 x {ni} n8 accumulator tiles; per K slice a warp issues
  {cfg.bk // 16} k16 steps x {mi * ni} mma.sync.
Shared memory ({cfg.stages} stages x {(cfg.bm + cfg.bn) * cfg.bk * 2} B = {cfg.smem_bytes} B, dynamic)
  A slice ({cfg.bm} rows) then B slice ({cfg.bn} rows) per stage, each row {cfg.bk} K-contiguous halves = {chunks}
  16-byte chunks. Chunk c of row r sits at chunk c ^ ((r / {rows_per_key}) % {chunks}): the 8 rows one ldmatrix
  8x8 matrix reads (same logical chunk, rows r0..r0+7) then land in 8 distinct 16-byte bank groups.
Pipeline
  Prologue: slices 0..STAGES-2 in flight (one cp.async group each, empty groups too). Iteration kt: refill
  the stage read in iteration kt-1 with slice kt+STAGES-1 (free: every warp passed the barrier that ended
  kt-1 after its last read of it); then k16 steps s = 0..{cfg.bk // 16 - 1}: before the last step,
  cp.async.wait_group(STAGES-2) + __syncthreads make slice kt+1 visible; each step first issues the ldmatrix
  of step s+1 (the next slice's step 0 at the last step) into the other register buffer, then the mma of s.
Launch order
  Blocks walk GROUP_M = {cfg.group_m} tile-rows column by column, so concurrently running blocks share B tiles in L2.
{_split_text(cfg)}
Shapes
  Any M, N, K >= 1. Fast path (K % 8 == 0, A and B 16-byte aligned): cp.async 16-byte copies, src-size 0 outside
  the matrices (zero fill). Otherwise the same kernel gathers each 16-byte chunk element by element with bounds
  checks and stores it with one 16-byte shared store (slower, synchronous loads). C: half2 stores when N is even
  and C is 4-byte aligned, element stores otherwise; rows/cols outside M x N are never written.

{cuda_parts.FRAGMENT_LAYOUTS}
ldmatrix.x4: A 16x16 tile: lane l addresses row l % 16, chunk l / 16 -> a0..a3. B: two n8 blocks per x4: lane l
  addresses n row (l / 16) * 8 + l % 8, chunk (l / 8) % 2 -> {{b0, b1}} of n-block 0, then of n-block 1."""
    constant_rows = [
            ("int", "BM", str(cfg.bm), "block tile rows (M)"),
            ("int", "BN", str(cfg.bn), "block tile columns (N)"),
            ("int", "BK", str(cfg.bk), "K slice per pipeline stage"),
            ("int", "WARPS_M", str(cfg.warps_m), "warps along M"),
            ("int", "WARPS_N", str(cfg.warps_n), "warps along N"),
            ("int", "STAGES", str(cfg.stages), "shared-memory pipeline depth"),
            ("int", "SPLIT_K", str(cfg.split_k), "K ranges at most (the plan may use fewer)"),
            ("int", "GROUP_M", str(cfg.group_m), "rasterisation group height, in tile-rows"),
            ("int", "MIN_BLOCKS", str(cfg.min_blocks), "__launch_bounds__ minimum resident blocks per SM"),
            ("size_t", "WS_CAP_BYTES", f"{WS_CAP_BYTES}ull", "split-K workspace ceiling, bytes"),
    ]
    values = {
        "header": cuda_parts.comment_block(design),
        "includes": cuda_parts.INCLUDES,
        "ptx": cuda_parts.ASYNC_COPY_PTX,
        "accumulator": cuda_parts.accumulator(cfg.acc),
        "store_pair": cuda_parts.STORE_PAIR,
        "smem_bytes": _PIPELINE_SMEM,
        **dict.fromkeys(_CLUSTER_PARTS, ""),  # the workspace reduction: not a byte of the cluster code
        **dict.fromkeys(("last_arrival", "load_partial"), ""),  # nor of the last-arrival code
        **(_PDL_PARTS if cfg.pdl else _PLAIN_PARTS),
    }
    if cfg.sums_in_cluster:
        constant_rows += [
            ("bool", "CLUSTER_REDUCE", "true", "split-K partials summed in the cluster's shared memory"),
            ("int", "RED_LD", str(cfg.bn + RED_PAD), "row stride (floats) of the fp32 tile parked for that sum"),
        ]
        tile = "(size_t)BM * RED_LD * sizeof(float)"  # the parked fp32 tile, over the stages
        ptx, parts = cuda_parts.ASYNC_COPY_PTX + cuda_parts.CLUSTER_PTX, _CLUSTER_PARTS
        if cfg.reduce is Reduce.PUSH:
            tile = "(size_t)(BM + SPLIT_K - 1) * RED_LD * sizeof(float)"  # the inbox: every range's rows it sums
            ptx, parts = ptx + cuda_parts.CLUSTER_PUSH_PTX, {**_CLUSTER_PARTS, **_PUSH_PARTS}
        values.update(parts, ptx=ptx, smem_bytes=f"({_PIPELINE_SMEM} > {tile} ? {_PIPELINE_SMEM} : {tile})")
        # Only configs over the portable size carry the opt-in: the others keep their stored sources byte for byte.
        opt_in = cuda_parts.non_portable_opt_in("sm80_hgemm_kernel<kAligned>", "grid.z") \
            if cfg.split_k > MAX_PORTABLE_CLUSTER else ""
        values["cluster_launch"] = string.Template(values["cluster_launch"]).substitute(cluster_opt_in=opt_in)
    if cfg.reduce is Reduce.LAST:
        constant_rows += [("int", "MAX_TICKETS", str(cuda_parts.MAX_TICKETS), "tiles with a ticket: more are summed by splitk_reduce")]
        values.update(_LAST_PARTS,
                      ptx=cuda_parts.ASYNC_COPY_PTX + cuda_parts.LAST_ARRIVAL + cuda_parts.LAST_ARRIVAL_SYNC + _TICKETS)
    reduce = cuda_parts.splitk_reduce(wait=cfg.pdl, batched=_reduces_in_workspace(cfg))
    return {**values, "constants": cuda_parts.constants(constant_rows), "splitk_reduce": reduce}


_TICKETS = f"""\
// One ticket per output tile: the library's own device memory, zero when it loads and reset to zero by each tile's
// last arrival, so zero between launches. Not shared between streams: two calls running at once would draw from the
// same tickets.
{cuda_parts.TICKETS_DECL}
"""

# The last-arrival reduction's code, by template slot (see Reduce.LAST and _split_text).
_LAST_PARTS = {
    "last_arrival": r"""    if (slab != nullptr && gridDim.x <= (unsigned)MAX_TICKETS) {
        // Every split's partial of this tile is in its slab once the tile's ticket is drawn gridDim.z times; the
        // block drawing the last one sums the tile over the splits in order z = 0, 1, ... (as splitk_reduce does).
        __shared__ int last;
        if (!last_arrival(&g_tickets[blockIdx.x], gridDim.z, &last)) return;
        const int splits = (int)gridDim.z;
        for (int i = tid; i < BM * (BN / 2); i += THREADS) {
            const int row = m0 + i / (BN / 2), col = n0 + 2 * (i % (BN / 2));
            if (row >= M || col >= N) continue;
            const float* p = ws + (size_t)row * (size_t)N + col;
            float2 part[SPLIT_K];  // every split's pair loaded before any is added: the loads overlap
#pragma unroll
            for (int z = 0; z < SPLIT_K; ++z)
                if (z < splits) part[z] = load_partial(p + (size_t)z * (size_t)M * (size_t)N, N, col);
            float2 sum = part[0];
#pragma unroll
            for (int z = 1; z < SPLIT_K; ++z)  // unrolled to SPLIT_K: part stays in registers
                if (z < splits) {
                    sum.x += part[z].x;
                    sum.y += part[z].y;
                }
            store_pair(C, M, N, vec, row, col, sum.x, sum.y);
        }
    }
""",
    "load_partial": r"""// The fp32 partial pair at p = W[row][col] of one split's slab, past L1 (written by other blocks); col + 1 < N or
// not, as store_partial wrote it.
__device__ __forceinline__ float2 load_partial(const float* p, int N, int col) {
    if ((N & 1) == 0) return load_l2_f2(reinterpret_cast<const float2*>(p));
    return make_float2(load_l2_f(p), col + 1 < N ? load_l2_f(p + 1) : 0.0f);
}

""",
    # More tiles than tickets: the kernel stores partials only, and splitk_reduce sums them as for reduce=workspace.
    "reduce_launch": """        if ((long long)((M + BM - 1) / BM) * ((N + BN - 1) / BN) > MAX_TICKETS)
            splitk_reduce<<<(unsigned)blocks, REDUCE_THREADS, 0, stream>>>(ws, C, MN, plan.splits, vec4);""",
}


_PIPELINE_SMEM = "(size_t)STAGES * STAGE_HALVES * sizeof(half)"

# The cluster reduction's code, by template slot (see Reduce.CLUSTER and _split_text).
_CLUSTER_PARTS = {
    "cluster_epilogue": r"""// Split-K summed inside the thread-block cluster: grid.z = the plan's K ranges = the cluster size, so the CTAs of
// one output tile form one cluster. Each parks its fp32 tile in its own shared memory (over the pipeline stages,
// which the K loop is done with); a cluster barrier makes them all visible; CTA r then sums tile rows r, r + splits,
// ... over the CTAs 0, 1, ... in that order (bitwise reproducible, the order splitk_reduce uses) and stores them; a
// second barrier keeps every CTA's shared memory alive until the others have read it. No workspace, one kernel.
__device__ __forceinline__ void cluster_reduce_store(const AccFrag (&acc)[MI][NI], half* __restrict__ C, int M, int N,
                                                     bool vec, int m0, int n0, int wm, int wn, int lane, float* red) {
    const int g = lane >> 2;
    const int t = lane & 3;
    __syncthreads();  // every warp has issued its last ldmatrix of the stages that `red` overlays
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
            const int r = wm * WARP_M + mi * 16 + g;
            const int c = wn * WARP_N + ni * 8 + 2 * t;
            float v[4];
            acc_to_float(acc[mi][ni], v);
            *reinterpret_cast<float2*>(red + r * RED_LD + c) = make_float2(v[0], v[1]);
            *reinterpret_cast<float2*>(red + (r + 8) * RED_LD + c) = make_float2(v[2], v[3]);
        }
    cluster_sync();
    const int splits = (int)gridDim.z;
    const int rank = (int)cluster_ctarank();
    const uint32_t base = smem_addr(red);
    const int rows = (BM - rank + splits - 1) / splits;  // rows rank, rank + splits, ... below BM
    for (int i = threadIdx.x; i < rows * (BN / 2); i += THREADS) {
        const int r = rank + (i / (BN / 2)) * splits;
        const int c = 2 * (i % (BN / 2));
        const uint32_t addr = base + (uint32_t)((r * RED_LD + c) * sizeof(float));
        float2 sum = ld_cluster_f2(addr, 0u);
        for (int z = 1; z < splits; ++z) {
            const float2 p = ld_cluster_f2(addr, (uint32_t)z);
            sum.x += p.x;
            sum.y += p.y;
        }
        store_pair(C, M, N, vec, m0 + r, n0 + c, sum.x, sum.y);
    }
    cluster_sync();
}

""",
    "cluster_call": r"""if (gridDim.z > 1) {  // split-K: summed in the cluster (cluster_reduce_store), never in the workspace
        cluster_reduce_store(acc, C, M, N, vec_store != 0, m0, n0, wm, wn, lane, reinterpret_cast<float*>(smem_raw));
        return;
    }
    """,
    "no_workspace": "if (CLUSTER_REDUCE) return 0;  // split-K partials stay in the cluster's shared memory\n    ",
    "cluster_launch": r"""// Split-K launch: one cluster of grid.z CTAs (the K ranges) per output tile, for cluster_reduce_store.
template <bool kAligned>
int launch_cluster(dim3 grid, const half* A, const half* B, half* C, int M, int N, int K, int slices_per_split,
                   int vec_store, cudaStream_t stream) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(THREADS, 1, 1);
    config.dynamicSmemBytes = SMEM_BYTES;
    config.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = grid.z;
    config.attrs = attr;
    config.numAttrs = 1;
    ${cluster_opt_in}const cudaError_t err = cudaLaunchKernelEx(&config, sm80_hgemm_kernel<kAligned>, A, B, C, (float*)nullptr, M, N,
                                               K, slices_per_split, vec_store);
    return err == cudaSuccess ? 0 : 1;
}

""",
    "cluster_dispatch": "if (plan.splits > 1)\n        return launch_cluster<kAligned>(grid, A, B, C, M, N, K, "
                        "plan.slices_per_split, vec_store, stream);\n    ",
    "workspace_guard": "!CLUSTER_REDUCE && ",
}

# reduce=push: the cluster's sum in the push form (the slots that differ from _CLUSTER_PARTS).
_PUSH_PARTS = {
    "cluster_epilogue": r"""// Split-K summed inside the thread-block cluster, pushed: grid.z = the plan's K ranges = the cluster size. After a
// cluster barrier (every CTA is past its K loop, so its stages are free) each CTA stores its fp32 rows into the
// shared memory of the CTA that sums them (row r: CTA r % ranges, in the inbox row of this CTA's rank); after a
// second barrier CTA r adds rows r, r + ranges, ... over the CTAs 0, 1, ... in that order (bitwise the pulled form's
// sums) from its own shared memory and stores them. No CTA reads another's memory. No workspace, one kernel.
__device__ __forceinline__ void cluster_push_store(const AccFrag (&acc)[MI][NI], half* __restrict__ C, int M, int N,
                                                   bool vec, int m0, int n0, int wm, int wn, int lane, float* inbox) {
    const int g = lane >> 2;
    const int t = lane & 3;
    const int splits = (int)gridDim.z;
    const int rank = (int)cluster_ctarank();
    const int rpc = (BM + splits - 1) / splits;  // inbox rows per range: [splits][rpc][RED_LD] floats
    const uint32_t base = smem_addr(inbox);
    cluster_sync();  // every CTA has left its K loop: its stages, which the inbox overlays, may be written
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
            float v[4];
            acc_to_float(acc[mi][ni], v);
            const int c = wn * WARP_N + ni * 8 + 2 * t;
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // rows g and g + 8 of the m16 tile
                const int r = wm * WARP_M + mi * 16 + g + 8 * h;
                const uint32_t addr = base + (uint32_t)(((rank * rpc + r / splits) * RED_LD + c) * sizeof(float));
                st_cluster_f2(addr, (uint32_t)(r % splits), make_float2(v[2 * h], v[2 * h + 1]));
            }
        }
    cluster_sync();  // every CTA's rows are in their owners' inboxes
    const int rows = (BM - rank + splits - 1) / splits;  // rows rank, rank + splits, ... below BM
    for (int i = threadIdx.x; i < rows * (BN / 2); i += THREADS) {
        const int lr = i / (BN / 2), c = 2 * (i % (BN / 2));
        float2 sum = *reinterpret_cast<const float2*>(inbox + lr * RED_LD + c);
        for (int z = 1; z < splits; ++z) {
            const float2 p = *reinterpret_cast<const float2*>(inbox + (z * rpc + lr) * RED_LD + c);
            sum.x += p.x;
            sum.y += p.y;
        }
        store_pair(C, M, N, vec, m0 + rank + lr * splits, n0 + c, sum.x, sum.y);
    }
}

""",
    "cluster_call": r"""if (gridDim.z > 1) {  // split-K: summed in the cluster (cluster_push_store), never in the workspace
        cluster_push_store(acc, C, M, N, vec_store != 0, m0, n0, wm, wn, lane, reinterpret_cast<float*>(smem_raw));
        return;
    }
    """,
}


# pdl=False renders as sources did before the field existed (their stored results stay theirs).
_PLAIN_PARTS = {
    "pdl_trigger": "",
    "reduce_launch": "        splitk_reduce<<<(unsigned)blocks, REDUCE_THREADS, 0, stream>>>(ws, C, MN, plan.splits, vec4);",
}
# Programmatic dependent launch: every block of the GEMM lets the reduction start once its K loop is done (the
# reduction's CTAs then get staged while the epilogues store the partials); splitk_reduce's griddepcontrol.wait holds
# its reads until the whole GEMM has finished and its writes are visible. Only the reduction, inside one call, is
# launched so: the GEMM of the next call waits for this call in stream order (the harness rejects PDL across calls).
_PDL_PARTS = {
    "pdl_trigger": cuda_parts.PDL_TRIGGER + "\n    ",
    "reduce_launch": cuda_parts.pdl_launch_config("(unsigned)blocks", "REDUCE_THREADS", " " * 8) + """\
        if (cudaLaunchKernelEx(&launch, splitk_reduce, static_cast<const float*>(ws), C, MN, plan.splits, vec4) !=
            cudaSuccess)
            return 1;""",
}


def _non_portable_text(cfg: Sm80Config) -> str:
    if cfg.split_k <= MAX_PORTABLE_CLUSTER:
        return ""
    return f";\n  over {MAX_PORTABLE_CLUSTER} ranges with the non-portable cluster-size opt-in, up to {MAX_CLUSTER} on sm_90"


def _split_text(cfg: Sm80Config) -> str:
    if cfg.split_k == 1:
        return ("Split-K: none (SPLIT_K = 1): one launch, no workspace; the split-K code below stays idle.")
    if cfg.reduce is Reduce.LAST:
        return f"""\
Split-K (at most {cfg.split_k} ranges), summed by each tile's last block to arrive
  Each grid.z index owns a contiguous range of K slices (the plan drops empty ranges and lowers the count until
  the workspace fits {WS_CAP_BYTES >> 20} MiB). With more than one range every block writes its fp32 partial tile
  to workspace[z][M][N], fences and takes its tile's ticket (the library's own device memory); the block that
  draws the last one resets it, fences and sums the tile over the ranges in order z = 0, 1, ... (deterministic)
  into C, in the same launch. Over MAX_TICKETS = {cuda_parts.MAX_TICKETS} tiles, splitk_reduce sums them afterwards instead."""
    if cfg.reduce is Reduce.PUSH:
        return f"""\
Split-K (at most {cfg.split_k} ranges), summed in a thread-block cluster, pushed (sm_90)
  Each grid.z index owns a contiguous range of K slices (the plan drops empty ranges); the ranges of one output
  tile are launched as one cluster (cudaLaunchKernelEx, cluster dims 1 x 1 x ranges{_non_portable_text(cfg)}). After a cluster
  barrier each CTA stores its fp32 rows into the shared memory of the CTA that sums them (row r: CTA r % ranges);
  after a second one CTA r adds rows r, r + ranges, ... over the CTAs in rank order (deterministic) from its own
  shared memory and writes them to C. No CTA reads another's memory; no workspace and no second kernel."""
    if cfg.reduce is Reduce.CLUSTER:
        return f"""\
Split-K (at most {cfg.split_k} ranges), summed in a thread-block cluster (sm_90)
  Each grid.z index owns a contiguous range of K slices (the plan drops empty ranges); the ranges of one output
  tile are launched as one cluster (cudaLaunchKernelEx, cluster dims 1 x 1 x ranges{_non_portable_text(cfg)}). Each CTA parks its fp32 tile
  in its shared memory; CTA r sums rows r, r + ranges, ... over the cluster's CTAs in rank order (deterministic,
  through distributed shared memory) and writes them to C. No workspace and no second kernel."""
    return f"""\
Split-K (at most {cfg.split_k} ranges)
  Each grid.z index owns a contiguous range of K slices (the plan drops empty ranges and lowers the count until
  the workspace fits {WS_CAP_BYTES >> 20} MiB). With more than one range every block writes its fp32 partial tile
  to workspace[z][M][N], then splitk_reduce sums the ranges in order z = 0, 1, ... (deterministic) into C.{_pdl_text(cfg)}"""


def _pdl_text(cfg: Sm80Config) -> str:
    if not cfg.pdl:
        return ""
    return ("""
  splitk_reduce is launched with programmatic dependent launch (sm_90): each GEMM block triggers it after its K
  loop, and it waits (griddepcontrol.wait) for the whole GEMM's partials before reading them.""")


_TEMPLATE = string.Template(r"""// Generated by cudal2.kernels.sm80 (family sm80_mma): mma.sync + ldmatrix + cp.async multistage HGEMM.
$header

$includes
namespace {

// ---- configuration ----------------------------------------------------------------------------------------
$constants

// ---- derived ----------------------------------------------------------------------------------------------
constexpr int THREADS = 32 * WARPS_M * WARPS_N;
constexpr int WARP_M = BM / WARPS_M;           // warp tile
constexpr int WARP_N = BN / WARPS_N;
constexpr int MI = WARP_M / 16;                // m16 accumulator tiles per warp
constexpr int NI = WARP_N / 8;                 // n8 accumulator tiles per warp
constexpr int KSTEPS = BK / 16;                // k16 mma steps per K slice
constexpr int CHUNKS = BK / 8;                 // 16-byte chunks per shared-memory row
constexpr int ROWS_PER_KEY = 128 / (BK * 2);   // rows per 128-byte line: they share one swizzle key
constexpr int ROWS_PER_PASS = THREADS / CHUNKS;  // tile rows one pass of all threads copies
constexpr int A_TILE = BM * BK;                // halves per A slice
constexpr int B_TILE = BN * BK;                // halves per B slice
constexpr int STAGE_HALVES = A_TILE + B_TILE;
constexpr size_t SMEM_BYTES = $smem_bytes;
constexpr int REDUCE_THREADS = 256;
constexpr int REDUCE_MAX_BLOCKS = 8192;

static_assert(WARP_M % 16 == 0 && WARP_N % 16 == 0, "warp tile must split into m16 x (2 x n8) fragments");
static_assert(KSTEPS % 2 == 0, "register double buffering alternates buffers by k-step parity");
static_assert(BM % ROWS_PER_PASS == 0 && BN % ROWS_PER_PASS == 0, "whole copy passes per tile");
static_assert(CHUNKS == 4 || CHUNKS == 8, "swizzle written for 64- or 128-byte rows");

$ptx
$accumulator
$store_pair
// Offset (halves) of 16-byte chunk `chunk` of row `row` inside one A or B slice (XOR swizzle, see header).
__device__ __forceinline__ int swz(int row, int chunk) {
    return row * BK + ((chunk ^ ((row / ROWS_PER_KEY) % CHUNKS)) << 3);
}

// Unaligned path: the 8 halves X[r][k..k+7] (zero outside rows x K) gathered one by one, one 16-byte store.
__device__ __forceinline__ void gather_chunk(half* dst, const half* __restrict__ X, bool row_ok, int r, int k,
                                             int K) {
    uint32_t w[4] = {0u, 0u, 0u, 0u};
    if (row_ok) {
        const half* src = X + (size_t)r * (size_t)K;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int kj = k + 2 * j;
            const uint32_t lo = kj < K ? __half_as_ushort(src[kj]) : 0u;
            const uint32_t hi = kj + 1 < K ? __half_as_ushort(src[kj + 1]) : 0u;
            w[j] = lo | (hi << 16);  // little endian: the lower address is the low half
        }
    }
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
}

// Copy slice [k0, k0 + BK) of rows [row0, row0 + ROWS) of X (a `rows` x K row-major matrix) into a swizzled
// tile. Thread tid copies chunk tid % CHUNKS of rows tid / CHUNKS + i * ROWS_PER_PASS (i < ROWS / ROWS_PER_PASS):
// CHUNKS consecutive threads read one row's contiguous bytes, and a thread's chunks share one column, so one
// base pointer, one row stride and one K test serve all of them (few registers, however many chunks).
template <int ROWS, bool kAligned>
__device__ __forceinline__ void load_tile(half* tile, const half* __restrict__ X, int rows, int K, int row0, int k0,
                                          int tid) {
    const int row = tid / CHUNKS;
    const int chunk = tid % CHUNKS;
    const int k = k0 + chunk * 8;
    const int rows_left = rows - row0 - row;  // chunk i is inside X when i * ROWS_PER_PASS < rows_left
    if constexpr (kAligned) {
        const bool k_ok = k < K;  // K % 8 == 0: a chunk is entirely inside K or entirely outside it
        const half* src = X + (size_t)(row0 + row) * (size_t)K + k;
        const size_t pass_stride = (size_t)ROWS_PER_PASS * (size_t)K;
#pragma unroll
        for (int i = 0; i < ROWS / ROWS_PER_PASS; ++i) {
            const bool valid = k_ok && i * ROWS_PER_PASS < rows_left;
            cp_async_16(smem_addr(tile + swz(row + i * ROWS_PER_PASS, chunk)), valid ? src + i * pass_stride : X,
                        valid);
        }
    } else {
        // The rare path stays rolled: fewer registers for this instantiation, which is never the fast one.
#pragma unroll 1
        for (int i = 0; i < ROWS / ROWS_PER_PASS; ++i) {
            const int r = row0 + row + i * ROWS_PER_PASS;
            gather_chunk(tile + swz(row + i * ROWS_PER_PASS, chunk), X, i * ROWS_PER_PASS < rows_left, r, k, K);
        }
    }
}

template <bool kAligned>
__device__ __forceinline__ void load_stage(half* stage, const half* __restrict__ A, const half* __restrict__ B,
                                           int M, int N, int K, int m0, int n0, int k0, int tid) {
    load_tile<BM, kAligned>(stage, A, M, K, m0, k0, tid);
    load_tile<BN, kAligned>(stage + A_TILE, B, N, K, n0, k0, tid);
}

// A and B fragments of k16 step `ks` of one stage, for this lane (ldmatrix coordinates in the header).
__device__ __forceinline__ void load_fragments(uint32_t (&af)[MI][4], uint32_t (&bf)[NI][2], const half* stage,
                                               int ks, int a_row, int a_chunk, int b_row, int b_chunk) {
    const half* sA = stage;
    const half* sB = stage + A_TILE;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) ldmatrix_x4(af[mi], smem_addr(sA + swz(a_row + mi * 16, a_chunk + 2 * ks)));
#pragma unroll
    for (int nj = 0; nj < NI / 2; ++nj) {
        uint32_t r[4];
        ldmatrix_x4(r, smem_addr(sB + swz(b_row + nj * 16, b_chunk + 2 * ks)));
        bf[2 * nj][0] = r[0];      // n 0-7 of the pair, k 0-7
        bf[2 * nj][1] = r[1];      // n 0-7,             k 8-15
        bf[2 * nj + 1][0] = r[2];  // n 8-15,            k 0-7
        bf[2 * nj + 1][1] = r[3];  // n 8-15,            k 8-15
    }
}

// Grouped rasterisation: block `pid` -> (tile_m, tile_n); GROUP_M tile-rows are walked column by column.
__device__ __forceinline__ void tile_coords(int M, int N, int pid, int& tile_m, int& tile_n) {
    const int tiles_m = (M + BM - 1) / BM;
    const int tiles_n = (N + BN - 1) / BN;
    const int per_group = GROUP_M * tiles_n;
    const int first_m = (pid / per_group) * GROUP_M;
    const int group_rows = min(tiles_m - first_m, GROUP_M);
    const int in_group = pid % per_group;
    tile_m = first_m + in_group % group_rows;
    tile_n = in_group / group_rows;
}

// fp32 partial sums (v0, v1) at W[row][col], W[row][col+1] of one split's M x N slab; N even: 8-byte stores.
__device__ __forceinline__ void store_partial(float* __restrict__ W, int M, int N, int row, int col, float v0,
                                              float v1) {
    if (row >= M) return;
    float* p = W + (size_t)row * (size_t)N + col;
    if ((N & 1) == 0) {
        if (col < N) *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
    } else {
        if (col < N) p[0] = v0;
        if (col + 1 < N) p[1] = v1;
    }
}

${load_partial}${cluster_epilogue}// One block computes one BM x BN tile over K slices [blockIdx.z * slices_per_split, ...) and writes it to C
// (ws == nullptr) or, as fp32 partials, to ws[blockIdx.z].
template <bool kAligned>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
sm80_hgemm_kernel(const half* __restrict__ A, const half* __restrict__ B, half* __restrict__ C,
                  float* __restrict__ ws, int M, int N, int K, int slices_per_split, int vec_store) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    half* smem = reinterpret_cast<half*>(smem_raw);

    int tile_m, tile_n;
    tile_coords(M, N, blockIdx.x, tile_m, tile_n);
    const int m0 = tile_m * BM;
    const int n0 = tile_n * BN;
    const int slices_total = (K + BK - 1) / BK;
    const int first_slice = blockIdx.z * slices_per_split;
    const int ktiles = min(slices_total - first_slice, slices_per_split);  // >= 1: the host plan has no empty range
    const int kbase = first_slice * BK;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wm = warp / WARPS_N;
    const int wn = warp % WARPS_N;

    AccFrag acc[MI][NI];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) acc_zero(acc[mi][ni]);

    // ---- prologue: slices 0 .. STAGES-2 in flight ----
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles) load_stage<kAligned>(smem + s * STAGE_HALVES, A, B, M, N, K, m0, n0, kbase + s * BK, tid);
        cp_async_commit();
    }

    // Per-lane ldmatrix coordinates.
    const int a_row = wm * WARP_M + (lane & 15);                      // + mi * 16
    const int a_chunk = lane >> 4;                                     // + 2 * ks
    const int b_row = wn * WARP_N + ((lane >> 4) << 3) + (lane & 7);  // + nj * 16
    const int b_chunk = (lane >> 3) & 1;                               // + 2 * ks

    // Register double buffer: buffer (ks & 1) holds k-step ks (KSTEPS is even, so parity carries across slices).
    uint32_t af[2][MI][4];
    uint32_t bf[2][NI][2];
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    load_fragments(af[0], bf[0], smem, 0, a_row, a_chunk, b_row, b_chunk);

    for (int kt = 0; kt < ktiles; ++kt) {
        {   // refill the stage of slice kt-1 with slice kt+STAGES-1
            const int fill = kt + STAGES - 1;
            if (fill < ktiles)
                load_stage<kAligned>(smem + (fill % STAGES) * STAGE_HALVES, A, B, M, N, K, m0, n0,
                                     kbase + fill * BK, tid);
            cp_async_commit();
        }
        const half* stage = smem + (kt % STAGES) * STAGE_HALVES;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
            if (ks == KSTEPS - 1) {
                // Slice kt+1 has landed for every thread, and every warp has issued its last read of slice kt.
                cp_async_wait<STAGES - 2>();
                __syncthreads();
                if (kt + 1 < ktiles)
                    load_fragments(af[(ks + 1) & 1], bf[(ks + 1) & 1], smem + ((kt + 1) % STAGES) * STAGE_HALVES,
                                   0, a_row, a_chunk, b_row, b_chunk);
            } else {
                load_fragments(af[(ks + 1) & 1], bf[(ks + 1) & 1], stage, ks + 1, a_row, a_chunk, b_row, b_chunk);
            }
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int ni = 0; ni < NI; ++ni) mma_16816(acc[mi][ni], af[ks & 1][mi], bf[ks & 1][ni]);
        }
    }
    cp_async_wait<0>();  // only empty groups remain; leave nothing in flight at exit

    ${pdl_trigger}${cluster_call}// ---- epilogue: registers -> C (rounded) or -> this split's fp32 slab, guarded ----
    const int g = lane >> 2;
    const int t = lane & 3;
    const bool vec = vec_store != 0;
    float* slab = ws != nullptr ? ws + (size_t)blockIdx.z * (size_t)M * (size_t)N : nullptr;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
        const int row = m0 + wm * WARP_M + mi * 16 + g;
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
            const int col = n0 + wn * WARP_N + ni * 8 + 2 * t;
            float v[4];
            acc_to_float(acc[mi][ni], v);
            if (slab != nullptr) {
                store_partial(slab, M, N, row, col, v[0], v[1]);
                store_partial(slab, M, N, row + 8, col, v[2], v[3]);
            } else {
                store_pair(C, M, N, vec, row, col, v[0], v[1]);
                store_pair(C, M, N, vec, row + 8, col, v[2], v[3]);
            }
        }
    }
${last_arrival}}

${splitk_reduce}
struct SplitPlan {
    int splits;            // K ranges actually used (>= 1), none empty
    int slices_per_split;  // BK slices per range
};

// The same plan in cudal2_workspace_bytes and cudal2_hgemm: at most SPLIT_K ranges, at least one slice each,
// and splits * M * N * 4 bytes of workspace at most WS_CAP_BYTES.
SplitPlan plan_split(int M, int N, int K) {
    const int slices = (K + BK - 1) / BK;
    long long splits = SPLIT_K < slices ? SPLIT_K : slices;
    const long long fit = (long long)(WS_CAP_BYTES / ((size_t)M * (size_t)N * sizeof(float)));
    if (splits > fit) splits = fit;
    if (splits < 1) splits = 1;
    const int per = (int)((slices + splits - 1) / splits);
    return SplitPlan{(slices + per - 1) / per, per};
}

size_t workspace_needed(int M, int N, int K) {
    ${no_workspace}const SplitPlan plan = plan_split(M, N, K);
    return plan.splits > 1 ? (size_t)plan.splits * (size_t)M * (size_t)N * sizeof(float) : 0;
}

${cluster_launch}// Raise the dynamic shared-memory limit of one instantiation, once per process.
template <bool kAligned>
bool smem_opt_in() {
    static bool done = false;
    if (!done)
        done = cudaFuncSetAttribute(sm80_hgemm_kernel<kAligned>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)SMEM_BYTES) == cudaSuccess;
    return done;
}

template <bool kAligned>
int launch(const half* A, const half* B, half* C, float* ws, int M, int N, int K, SplitPlan plan,
           cudaStream_t stream) {
    if (!smem_opt_in<kAligned>()) return 1;
    const long long tiles = (long long)((M + BM - 1) / BM) * (long long)((N + BN - 1) / BN);
    if (tiles > 0x7fffffffLL) return 1;
    const int vec_store = (N % 2 == 0 && reinterpret_cast<uintptr_t>(C) % 4 == 0) ? 1 : 0;
    const dim3 grid((unsigned)tiles, 1, (unsigned)plan.splits);
    ${cluster_dispatch}sm80_hgemm_kernel<kAligned><<<grid, THREADS, SMEM_BYTES, stream>>>(A, B, C, ws, M, N, K, plan.slices_per_split,
                                                                       vec_store);
    return 0;
}

}  // namespace

extern "C" size_t cudal2_workspace_bytes(int M, int N, int K) {
    if (M < 1 || N < 1 || K < 1) return 0;
    return workspace_needed(M, N, K);
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    if (M < 1 || N < 1 || K < 1) return 1;
    const SplitPlan plan = plan_split(M, N, K);
    float* ws = nullptr;
    if (${workspace_guard}plan.splits > 1) {
        if (workspace == nullptr || workspace_bytes < workspace_needed(M, N, K) ||
            reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
            return 1;
        ws = static_cast<float*>(workspace);
    }
    const bool aligned = K % 8 == 0 && (reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B)) % 16 == 0;
    const int err = aligned ? launch<true>(A, B, C, ws, M, N, K, plan, stream)
                            : launch<false>(A, B, C, ws, M, N, K, plan, stream);
    if (err) return err;
    if (ws != nullptr) {
        const long long MN = (long long)M * N;
        const int vec4 = (MN % 4 == 0 && reinterpret_cast<uintptr_t>(C) % 4 == 0) ? 1 : 0;
        const long long work = vec4 ? MN / 4 : MN;
        long long blocks = (work + REDUCE_THREADS - 1) / REDUCE_THREADS;
        if (blocks > REDUCE_MAX_BLOCKS) blocks = REDUCE_MAX_BLOCKS;
${reduce_launch}
    }
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
""")
