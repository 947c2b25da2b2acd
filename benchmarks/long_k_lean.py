"""How fast can a long K on a small output go? The grid's winners there against lean kernels that stream K through
shared memory (GPU).

    python3 benchmarks/long_k_lean.py [--shapes M_N_K ...] [--repeats 2] [--target-ms 20] [--json OUT] [--compile-only]

Why: the shapes with the most room under the roofline (`cudal2 report`'s Headroom) are all of this kind: 64x64x8192
takes 4.78 us on the H200 where cuBLAS takes 6.71 and moving its 2 MiB takes ~0.5 us. The small family loads its
fragments straight into registers, so a CTA keeps only ~48 KB of loads in flight, and a cut over K costs a serial
round trip through the workspace (thirty-eighth session); the sm90 winners run split-K as a batch with a reduction
kernel after the GEMM. The lean kernel here does what neither does, to price it before any family gets it:

    tile        one 64x64 tile of C per CTA (four warps, 32x32 each, ldmatrix + mma.sync m16n8k16, fp32 accumulate)
    K           CL x G CTAs per tile, each on its own run of 64-wide K chunks, streamed through STAGES cp.async
                stages of shared memory (16 KiB a stage: 64 rows of A and 64 of B), so ~(STAGES - 1) x 16 KiB of
                loads are in flight per CTA with no registers held for them
    cluster     (sm_90) the CL CTAs of a tile's K cut form a thread-block cluster and sum the tile in the push form:
                each stores its fp32 partial's rows straight into the shared memory of the CTA that owns those rows
                (64 / CL rows each), one cluster barrier, each owner adds the CL partials of its rows in rank order
    groups      G clusters per tile sum through the workspace: each owner writes its rows' cluster sum, takes its rows'
                ticket, and the owner that draws the last adds the G sums in group order and stores the rows to C:
                deterministic, one launch
    lean        M and N multiples of 64, K of 64, 16-byte aligned pointers; anything else is refused (returns 1)

Measured (benchmarks/RESULTS.md, forty-ninth session, H100): no variant beats any shape's winner (0.49-0.89x at best);
16 or 8 CTAs per tile reach ~30 GB/s each however deep the stages, and cutting K past 64 CTAs per tile costs more than
it saves. The winners' small output tiles give more CTAs without a sum, their re-reads of A and B coming from L2.

Every candidate is verified as any other (the evaluator's checks, determinism included), offline mode, `repeats`
fresh evaluations each over all the shapes it runs, in an order rotated each repeat; cuBLAS is timed in each
evaluation as always; nothing is stored. Printed per shape: each candidate's median over the repeats of its median
time (us), its speedup over the cuBLAS of the same evaluation, and its time against the H200 winner's on this GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import string
import sys
from pathlib import Path

from cudal2.kernels import cuda_parts
from cudal2.sandbox.types import Acc, Status, Task
from cudal2.tune import FAMILIES, candidate_named

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing_runs import add_timing_flags, evaluator_for, prepare_all, rotated_runs, sort_prepared  # noqa: E402  (a sibling script)

# Long-K small-output grid shapes and their H200 offline winners (benchmarks/leaderboard/h200_grid_offline.md).
WINNERS = {
    (64, 64, 4096): "small-bm16-bn16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32-cluster_k8-push1",
    (64, 64, 8192): "small-bm16-bn16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32-grid_k16",
    (64, 64, 16384): "sm90_wgmma-bm64-bn32-bk128-cluster_m2-cluster_n2-schedulebasic-schedulerpersistent-epiloguetma-"
                     "stages8-swizzle1-accfp32-splits16-pdl1",
    (64, 128, 8192): "sm90_wgmma-bm64-bn32-bk128-cluster_m2-cluster_n4-schedulebasic-schedulerpersistent-epiloguetma-"
                     "stages0-swizzle1-accfp32-splits8-swap_ab1-pdl1",
    (128, 128, 16384): "sm90_wgmma-bm64-bn64-bk64-cluster_m1-cluster_n1-schedulebasic-schedulerpersistent-"
                       "epiloguetma-stages0-swizzle1-accfp32-splits16-pdl1",
    (256, 256, 4096): "sm90_wgmma-bm64-bn64-bk128-cluster_m1-cluster_n1-schedulebasic-schedulerpersistent-epiloguetma-"
                      "stages0-swizzle1-accfp32-splits8-pdl1",
    (64, 512, 16384): "sm90_wgmma-bm64-bn64-bk64-cluster_m1-cluster_n4-schedulebasic-schedulerpersistent-epiloguetma-"
                      "stages0-swizzle1-accfp32-splits8-pdl1",
}
# (CL, G, STAGES): clusters alone (16 or 8 CTAs per tile, deep pipelines), then clusters times workspace groups
# (64-128 CTAs per tile, 2-4 chunks each at K = 8192-16384: nearly everything in flight at once).
VARIANTS = ((16, 1, 8), (8, 1, 8), (16, 4, 4), (16, 8, 3), (8, 8, 4), (8, 16, 3), (4, 16, 4), (4, 32, 2))
CUBLAS = "cuBLAS"
WINNER = "H200 winner"

LEAN = string.Template(r"""// Lean long-K HGEMM (benchmarks/long_k_lean.py): C[M,N] = A[M,K] * B[N,K]^T, half in, fp32 accumulate.
// One 64x64 tile of C per CTA; CL x G CTAs per tile, each on its own run of 64-wide K chunks (cp.async, STAGES
// stages); the CL CTAs of a cluster sum the tile through distributed shared memory (push form), the G clusters
// through the workspace (last arrival per row block). M, N, K multiples of 64 and 16-byte aligned pointers only.
$includes
namespace {
constexpr int CL = $cl;          // CTAs per cluster (one K run each), summed through shared memory
constexpr int G = $groups;       // clusters per tile (one K run each), summed through the workspace
constexpr int STAGES = $stages;  // cp.async stages
constexpr int BM = 64, BN = 64, KC = 64;  // the CTA's tile of C, and K columns per stage
constexpr int PITCH = KC + 8;    // halves per shared row: 144 B, so ldmatrix's 8 row addresses hit 8 bank groups
constexpr int THREADS = 128;     // 4 warps, 2 x 2, each a 32x32 piece of the tile
constexpr int STAGE_HALVES = (BM + BN) * PITCH;
constexpr int RPR = BM / CL;     // tile rows each cluster rank owns in the sums
constexpr int SHARE = RPR * BN;  // floats a rank owns
constexpr size_t STAGE_BYTES = size_t(STAGES) * STAGE_HALVES * 2;
constexpr size_t SMEM_BYTES = STAGE_BYTES + size_t(CL) * SHARE * 4 + 16;  // stages, inbox [CL][RPR][BN], flag
constexpr int MAX_TICKETS = $max_tickets;
static_assert(BM % CL == 0, "the 64 rows split evenly over the cluster");

$tickets
$async_copy
$cluster
$push
$last_arrival
$last_arrival_sync
$accumulator
__global__ void __launch_bounds__(THREADS, 1) lean_kernel(const half* __restrict__ A, const half* __restrict__ B,
                                                          half* __restrict__ C, int M, int N, int K,
                                                          float* __restrict__ ws) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    half* stages = reinterpret_cast<half*>(smem_raw);
    float* inbox = reinterpret_cast<float*>(smem_raw + STAGE_BYTES);  // [source rank][owned row][col]
    volatile int* flag = reinterpret_cast<volatile int*>(inbox + CL * SHARE);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t rank = CL > 1 ? cluster_ctarank() : 0;
    if (CL > 1) cluster_arrive_relaxed();  // phase 1: this CTA runs (waited on before the first remote store)
    const int split = blockIdx.x, group = split / CL;  // a cluster is CL consecutive blockIdx.x
    const int tile = blockIdx.z * gridDim.y + blockIdx.y, m0 = blockIdx.z * BM, n0 = blockIdx.y * BN;
    const int chunks = K / KC, runs = CL * G;
    const int c_begin = int((long long)split * chunks / runs), n_my = int((long long)(split + 1) * chunks / runs) - c_begin;

    // Stage `slot` <- K chunk `chunk`: 64 rows of A then 64 of B, 8 16-byte pieces a row, 8 pieces a thread.
    auto load_stage = [&](int slot, int chunk) {
        half* s = stages + slot * STAGE_HALVES;
        const int k0 = chunk * KC;
#pragma unroll
        for (int i = 0; i < (BM + BN) * KC / 8 / THREADS; ++i) {
            const int p = tid + i * THREADS, row = p >> 3, piece = p & 7;
            const half* src = row < BM ? A + size_t(m0 + row) * K + k0 + piece * 8
                                       : B + size_t(n0 + row - BM) * K + k0 + piece * 8;
            cp_async_16(smem_addr(s + row * PITCH + piece * 8), src, true);
        }
    };
    AccFrag acc[2][4];  // [m16 block][n8 block] of this warp's 32x32
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc_zero(acc[i][j]);
    auto compute = [&](int slot) {
        const half* sa = stages + slot * STAGE_HALVES;
        const half* sb = sa + BM * PITCH;
#pragma unroll
        for (int kk = 0; kk < KC; kk += 16) {
            uint32_t a[2][4], b[2][4];
#pragma unroll
            for (int i = 0; i < 2; ++i)  // matrices: rows 0-7 / 8-15 at k 0-7, then at k 8-15 (a0..a3)
                ldmatrix_x4(a[i], smem_addr(sa + (wm * 32 + i * 16 + (lane & 15)) * PITCH + kk + (lane >> 4) * 8));
#pragma unroll
            for (int j = 0; j < 2; ++j)  // matrices: n 0-7 at k 0-7, k 8-15, then n 8-15 (b0, b1 of two n8 blocks)
                ldmatrix_x4(b[j], smem_addr(sb + (wn * 32 + j * 16 + (lane & 7) + ((lane >> 4) << 3)) * PITCH + kk +
                                            ((lane >> 3) & 1) * 8));
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const uint32_t bf[2] = {b[j >> 1][(j & 1) * 2], b[j >> 1][(j & 1) * 2 + 1]};
                    mma_16816(acc[i][j], a[i], bf);
                }
        }
    };
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n_my) load_stage(s, c_begin + s);
        cp_async_commit();
    }
    for (int c = 0; c < n_my; ++c) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // chunk c landed for every thread; every thread is done with chunk c - 1's slot
        if (c + STAGES - 1 < n_my) load_stage((c + STAGES - 1) % STAGES, c_begin + c + STAGES - 1);
        cp_async_commit();
        compute(c % STAGES);
    }
    cp_async_wait<0>();

    // The partial's rows go to their owners' inboxes, slot [this rank]: remote stores (push form), or local ones.
    if (CL > 1) cluster_wait();  // every CTA of the cluster runs: its shared memory is there to store into
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = wm * 32 + i * 16 + g + 8 * h, col = wn * 32 + j * 8 + 2 * t;
                const float2 v = make_float2(acc[i][j].c[2 * h], acc[i][j].c[2 * h + 1]);
                float* slot = inbox + (int(rank) * RPR + row % RPR) * BN + col;
                if (CL > 1)
                    st_cluster_f2(smem_addr(slot), uint32_t(row / RPR), v);
                else
                    *reinterpret_cast<float2*>(slot) = v;
            }
    if (CL > 1)
        cluster_sync();  // phase 2: every push landed; no CTA touches another's memory after this
    else
        __syncthreads();

    // This rank's rows: the CL partials in rank order, 2 floats a step; with groups, through the workspace.
    const float2* in2 = reinterpret_cast<const float2*>(inbox);
    float2* ws2 = reinterpret_cast<float2*>(ws) + (size_t(tile) * CL + rank) * G * (SHARE / 2);  // [group][SHARE]
    auto store_c = [&](int e, float2 v) {
        const int row = int(rank) * RPR + (2 * e) / BN, col = (2 * e) % BN;
        *reinterpret_cast<half2*>(C + size_t(m0 + row) * N + n0 + col) = __floats2half2_rn(v.x, v.y);
    };
    for (int e = tid; e < SHARE / 2; e += THREADS) {
        float2 s = in2[e];
        for (int r = 1; r < CL; ++r) {
            const float2 v = in2[r * (SHARE / 2) + e];
            s.x += v.x, s.y += v.y;
        }
        if (G == 1)
            store_c(e, s);
        else
            store_l2_f2(ws2 + size_t(group) * (SHARE / 2) + e, s);
    }
    if (G > 1 && last_arrival(g_tickets + tile * CL + rank, G, flag)) {
        for (int e = tid; e < SHARE / 2; e += THREADS) {
            float2 s = load_l2_f2(ws2 + e);
            for (int q = 1; q < G; ++q) {
                const float2 v = load_l2_f2(ws2 + size_t(q) * (SHARE / 2) + e);
                s.x += v.x, s.y += v.y;
            }
            store_c(e, s);
        }
    }
}

size_t workspace_needed(int M, int N) { return G > 1 ? size_t(M / BM) * (N / BN) * G * BM * BN * sizeof(float) : 0; }
}  // namespace

extern "C" size_t cudal2_workspace_bytes(int M, int N, int K) {
    (void)K;
    return M > 0 && N > 0 ? workspace_needed(M, N) : 0;
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    const uintptr_t any = reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B) |
                          reinterpret_cast<uintptr_t>(C) | reinterpret_cast<uintptr_t>(workspace);
    if (M <= 0 || N <= 0 || K <= 0 || M % BM || N % BN || K % KC || any % 16 != 0) return 1;
    if ((long long)(M / BM) * (N / BN) * CL > MAX_TICKETS || N / BN > 65535 || M / BM > 65535) return 1;
    if (workspace_bytes < workspace_needed(M, N)) return 1;
    static const bool smem_ok = cudaFuncSetAttribute(lean_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     int(SMEM_BYTES)) == cudaSuccess;
    if (!smem_ok) return 1;
    $opt_in
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(CL * G, N / BN, M / BM);
    config.blockDim = dim3(THREADS, 1, 1);
    config.dynamicSmemBytes = SMEM_BYTES;
    config.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = CL;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.attrs = attr;
    config.numAttrs = CL > 1 ? 1 : 0;
    return cudaLaunchKernelEx(&config, lean_kernel, A, B, C, M, N, K, static_cast<float*>(workspace)) == cudaSuccess
               ? 0 : 1;
}
""")


def lean_label(cl: int, groups: int, stages: int) -> str:
    return f"lean {cl} x {groups}, {stages} stages"


def lean_source(cl: int, groups: int, stages: int) -> str:
    """The lean kernel with `cl` CTAs per cluster, `groups` clusters per tile and `stages` cp.async stages."""
    return LEAN.substitute(
        includes=cuda_parts.INCLUDES, cl=cl, groups=groups, stages=stages, max_tickets=cuda_parts.MAX_TICKETS,
        tickets=cuda_parts.TICKETS_DECL, async_copy=cuda_parts.ASYNC_COPY_PTX, cluster=cuda_parts.CLUSTER_PTX,
        push=cuda_parts.CLUSTER_PUSH_PTX, last_arrival=cuda_parts.LAST_ARRIVAL,
        last_arrival_sync=cuda_parts.LAST_ARRIVAL_SYNC, accumulator=cuda_parts.accumulator(Acc.FP32),
        opt_in=cuda_parts.non_portable_opt_in("lean_kernel", "CL") if cl > cuda_parts.MAX_PORTABLE_CLUSTER else "")


def parse_shapes(texts: list[str]) -> list[tuple[int, int, int]] | str:
    """'M_N_K' strings -> shapes of WINNERS, or the one-line reason one is not."""
    shapes = []
    for text in texts:
        try:
            shape = tuple(int(x) for x in text.split("_"))
        except ValueError:
            shape = ()
        if shape not in WINNERS:
            return f"--shapes: {text!r} is not one of {' '.join('_'.join(map(str, s)) for s in WINNERS)}"
        shapes.append(shape)
    return shapes  # type: ignore[return-value]


def candidates(shapes: list[tuple[int, int, int]]) -> dict[str, tuple[str, tuple[Task, ...]]]:
    """Label -> (source, tasks): each lean variant over every shape, each shape's H200 winner over its own shape."""
    tasks = tuple(Task(m, n, k, Acc.FP32) for m, n, k in shapes)
    out = {lean_label(*v): (lean_source(*v), tasks) for v in VARIANTS}
    for m, n, k in shapes:
        c = candidate_named(FAMILIES, WINNERS[(m, n, k)])
        out[f"{WINNER} {m}x{n}x{k}"] = (c.family.render(c.cfg), (Task(m, n, k, Acc.FP32),))
    return out


def table(evals: list[tuple[str, tuple[int, int, int], float, float]]) -> str:
    """Markdown from (candidate, shape, its median us, cuBLAS's median us) per evaluation: per shape and candidate the
    median time over the evaluations, the median speedup over the same evaluation's cuBLAS, and time against the
    shape's winner (> 1: faster than the winner)."""
    by: dict[tuple[int, int, int], dict[str, list[tuple[float, float]]]] = {}
    for label, shape, us, cublas in evals:
        by.setdefault(shape, {}).setdefault(WINNER if label.startswith(WINNER) else label, []).append((us, cublas))
    lines = ["| shape | candidate | median us | vs cuBLAS | winner / candidate |", "|---|---|---|---|---|"]
    for (m, n, k), cands in sorted(by.items()):
        win = statistics.median(u for u, _ in cands[WINNER]) if WINNER in cands else None
        for label, pairs in sorted(cands.items(), key=lambda kv: statistics.median(u for u, _ in kv[1])):
            us = statistics.median(u for u, _ in pairs)
            lines.append(f"| {m}x{n}x{k} | {label} | {us:.2f} | {statistics.median(b / u for u, b in pairs):.3f}x | "
                         f"{'-' if win is None else f'{win / us:.3f}x'} |")
        lines.append(f"| {m}x{n}x{k} | {CUBLAS} | {statistics.median(b for p in cands.values() for _, b in p):.2f} | "
                     "| |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["_".join(map(str, s)) for s in WINNERS],
                    help="M_N_K, shapes of WINNERS (default: all)")
    add_timing_flags(ap, what="candidate", repeats=2, target_ms=20.0)
    args = ap.parse_args(argv)
    shapes = parse_shapes(args.shapes)
    if isinstance(shapes, str) or args.repeats < 1:
        print(f"long_k_lean.py: {shapes if isinstance(shapes, str) else '--repeats must be >= 1'}", file=sys.stderr)
        return 2
    evaluator = evaluator_for(args, baselines=True)
    cands = candidates(shapes)
    ready = sort_prepared(prepare_all(evaluator, cands), what="candidates", compile_only=args.compile_only)
    if args.compile_only or ready.stopped:
        return 1 if ready.stopped else 0
    evals: list[tuple[str, tuple[int, int, int], float, float]] = []
    failures = []
    for label, repeat, shape in rotated_runs(evaluator, ready.runnable, args.repeats):
        mnk = (shape.task.m, shape.task.n, shape.task.k)
        if shape.status is not Status.OK:
            failures.append(f"{label} {mnk} repeat {repeat}: {shape.status.value}: {shape.reason[:200]}")
            continue
        evals.append((label, mnk, shape.timings["candidate"].median_us, shape.timings["cublas"].median_us))
        print(f"{label} {mnk} repeat {repeat}: {evals[-1][2]:.2f} us (cuBLAS {evals[-1][3]:.2f})", flush=True)
    print(f"\non {evaluator.gpu_label}, offline, {args.repeats} repeats, target_ms {args.target_ms:g}; "
          f"{len(failures)} evaluations not ok", *failures, sep="\n")
    print(table(evals))
    if args.json:
        args.json.write_text(json.dumps(evals, indent=1))
    return 0 if not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
