"""What does the small family's generality cost at 64^3? Its winner against lean kernels that can do only that shape.

    python3 benchmarks/tiny_floor.py [--repeats 5] [--target-ms 40] [--json OUT] [--compile-only]

The small bucket's target (2x over cuBLAS) needs 64x64x64 in ~1.09 us on the H200, where cuBLAS takes 2.17 and the
family's winner 1.43; moving the call's bytes alone (graph_gap.cu) takes 0.98. This prices the rest: the winner
(`small-bm16-bn32-warps_m1-warps_n4-warps_k1-k_unroll2-accfp32`: 8 CTAs of 4 warps, each warp a 16x8 tile of C from
fragments loaded straight from global memory, two 32-wide K steps) is timed beside hand-written candidates that do the
same work with everything general stripped: no bounds checks or load-width dispatch, no K loop, M = N = K = 64 fixed at
compile time (any other shape or a misaligned pointer is refused); and beside the winner's `exact` twin, which runs
an unchecked instantiation of the same source where every tile fits (64^3 does). The lean kernels differ only in how
the 32 warp tiles are spread over CTAs: 4 warps x 8 CTAs (the winner's), 1 warp x 32 CTAs, 32 warps x 1 CTA. Then the
4 x 8 lean kernel gets the family's generality back one step at a time, to say which step costs what: M, N, K as
kernel arguments (runtime index arithmetic), then a loop over K, then bounds checks on every load and store. Every
candidate is verified as any other (the evaluator's checks), in offline mode, `repeats` fresh evaluations each, their
order rotated each repeat, cuBLAS timed in each as always; nothing is stored. Printed: each candidate's median over the
repeats of its median time (us) and of its speedup over the cuBLAS timed in the same evaluation, and cuBLAS's times.

Measured (benchmarks/RESULTS.md): the 4 x 8 lean kernel is 1.11-1.14x faster than the winner on an H100 and on an H200
(still 1.27 us there, short of the 2x), and `exact` recovers 1.4% of it (forty-third session). Putting the generality
back on an H100 (forty-fourth): runtime M, N, K cost 3.5%, the K loop 5%, the bounds checks nothing measurable.
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

WINNER = "small-bm16-bn32-warps_m1-warps_n4-warps_k1-k_unroll2-accfp32"  # 64^3's H200 leaderboard kernel
LEAN_WARPS = (4, 1, 32)  # warps per CTA of the lean kernels (32 warp tiles in all)
TASK = Task(64, 64, 64, Acc.FP32)
CUBLAS = "cuBLAS (in every evaluation)"

LEAN = string.Template(r"""// Lean 64x64x64 HGEMM (benchmarks/tiny_floor.py): C[64,64] = A[64,64] * B[64,64]^T, half in, fp32 accumulate.
// 32 warps, each a 16x8 tile of C: warp tile w = blockIdx.x * WARPS + warp is rows 16 (w / 8) .., cols 8 (w % 8) ...
// Lane (g, t) loads 16 bytes of A rows g, g + 8 and of B row g at k = 8t and 32 + 8t and runs four m16n8k16 mma.sync
// (k permuted identically in A and B, as the small family does). Only this shape: anything else is refused.
// GENERALITY puts back, one step at a time, what the small family's kernels carry: 1 M, N, K as kernel arguments
// (runtime index arithmetic), 2 and a loop over K in 64-wide steps, 3 and bounds checks on every load and store.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace {
constexpr int WARPS = $warps;      // warps per CTA
constexpr int GENERALITY = $generality;  // 0: M = N = K = 64 at compile time, no loop, no checks
constexpr int S = 64;              // M = N = K

$accumulator
// 16 bytes at p, or zero where `inside` is false (GENERALITY 3 only: below, every load is inside).
__device__ __forceinline__ uint4 load16(const half* p, bool inside) {
    return GENERALITY < 3 || inside ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0u, 0u, 0u, 0u);
}

__global__ void __launch_bounds__(32 * WARPS) lean_kernel(const half* __restrict__ A, const half* __restrict__ B,
                                                          half* __restrict__ C, int m, int n, int k) {
    const int M = GENERALITY >= 1 ? m : S, N = GENERALITY >= 1 ? n : S, K = GENERALITY >= 1 ? k : S;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int w = blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int row = (w / 8) * 16 + g, n0 = (w % 8) * 8;
    const half* a_lo = A + (size_t)row * (size_t)K + 8 * t;
    const half* a_hi = A + (size_t)(row + 8) * (size_t)K + 8 * t;
    const half* b = B + (size_t)(n0 + g) * (size_t)K + 8 * t;
    AccFrag acc;
    acc_zero(acc);
    for (int kc = 0; kc < (GENERALITY >= 2 ? K : S); kc += 64) {  // one step unless GENERALITY >= 2
        const bool k0_in = kc + 8 * t < K, k1_in = kc + 32 + 8 * t < K;
        const uint4 l0 = load16(a_lo + kc, row < M && k0_in), l1 = load16(a_lo + kc + 32, row < M && k1_in);
        const uint4 h0 = load16(a_hi + kc, row + 8 < M && k0_in), h1 = load16(a_hi + kc + 32, row + 8 < M && k1_in);
        const uint4 b0 = load16(b + kc, n0 + g < N && k0_in), b1 = load16(b + kc + 32, n0 + g < N && k1_in);
        const uint32_t a0[4] = {l0.x, h0.x, l0.y, h0.y}, a1[4] = {l0.z, h0.z, l0.w, h0.w};  // k 0..31
        const uint32_t a2[4] = {l1.x, h1.x, l1.y, h1.y}, a3[4] = {l1.z, h1.z, l1.w, h1.w};  // k 32..63
        const uint32_t k0[2] = {b0.x, b0.y}, k1[2] = {b0.z, b0.w}, k2[2] = {b1.x, b1.y}, k3[2] = {b1.z, b1.w};
        mma_16816(acc, a0, k0);
        mma_16816(acc, a1, k1);
        mma_16816(acc, a2, k2);
        mma_16816(acc, a3, k3);
    }
    float v[4];
    acc_to_float(acc, v);
    const int col = n0 + 2 * t;
    half* c = C + (size_t)row * (size_t)N + col;
    if (GENERALITY < 3 || (row < M && col < N)) *reinterpret_cast<half2*>(c) = __floats2half2_rn(v[0], v[1]);
    if (GENERALITY < 3 || (row + 8 < M && col < N))
        *reinterpret_cast<half2*>(c + 8 * (size_t)N) = __floats2half2_rn(v[2], v[3]);
}
}  // namespace

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace;
    (void)workspace_bytes;
    const uintptr_t any = reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B) |
                          reinterpret_cast<uintptr_t>(C);
    if (M != S || N != S || K != S || any % 16 != 0) return 1;
    lean_kernel<<<32 / WARPS, 32 * WARPS, 0, stream>>>(A, B, C, M, N, K);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
""")
GENERALITY = ("+ runtime M, N, K", "+ a K loop", "+ bounds checks")  # what steps 1, 2, 3 put back, in turn


def lean_source(warps: int, generality: int = 0) -> str:
    """The lean 64^3 candidate with `warps` warps per CTA (a divisor of 32) and the first `generality` steps of
    GENERALITY put back."""
    return LEAN.substitute(warps=warps, generality=generality, accumulator=cuda_parts.accumulator(Acc.FP32))


def sources() -> dict[str, str]:
    """Candidate label -> source: the family's winner as rendered and its exact twin, the lean kernels, then the 4x8 lean
    kernel with the steps of GENERALITY put back one after another."""
    winner, exact = candidate_named(FAMILIES, WINNER), candidate_named(FAMILIES, WINNER + "-exact1")
    out = {"winner (small family)": winner.family.render(winner.cfg),
           "winner with exact": exact.family.render(exact.cfg)}
    out.update({f"lean, {w} warp(s) x {32 // w} CTA(s)": lean_source(w) for w in LEAN_WARPS})
    out.update({f"lean 4x8 {' '.join(GENERALITY[:step])}": lean_source(4, step) for step in range(1, len(GENERALITY) + 1)})
    return out


def table(evals: list[tuple[str, float, float]]) -> str:
    """Markdown from (candidate, its median us, cuBLAS's median us) per evaluation: each candidate's median, min and max
    time over its evaluations, its speedup over the cuBLAS of the same evaluation (median over the evaluations: the GPU
    drifts between evaluations and both sides drift together), and cuBLAS's times over every evaluation."""
    by: dict[str, list[tuple[float, float]]] = {}
    for label, cand_us, cublas_us in evals:
        by.setdefault(label, []).append((cand_us, cublas_us))
    lines = ["| candidate | median us | min | max | speedup vs cuBLAS, same evaluation |", "|---|---|---|---|---|"]
    for label, pairs in by.items():
        times = [c for c, _ in pairs]
        speedup = statistics.median(b / c for c, b in pairs)
        lines.append(f"| {label} | {statistics.median(times):.3f} | {min(times):.3f} | {max(times):.3f} | "
                     f"{speedup:.3f}x |")
    cublas = [b for _, _, b in evals]
    if cublas:
        lines.append(f"| {CUBLAS} | {statistics.median(cublas):.3f} | {min(cublas):.3f} | {max(cublas):.3f} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_timing_flags(ap, what="candidate", repeats=5, target_ms=40.0)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        print("tiny_floor.py: --repeats must be >= 1", file=sys.stderr)
        return 2
    evaluator = evaluator_for(args, baselines=True)
    cands = sources()
    ready = sort_prepared(prepare_all(evaluator, {label: (source, (TASK,)) for label, source in cands.items()}),
                          what="candidates", compile_only=args.compile_only)
    if args.compile_only or ready.stopped:
        return 1 if ready.stopped else 0
    evals: list[tuple[str, float, float]] = []  # (candidate, its median us, cuBLAS's median us) per evaluation
    failures = []
    width = max(map(len, cands))
    for label, repeat, shape in rotated_runs(evaluator, ready.runnable, args.repeats):
        if shape.status is not Status.OK:
            failures.append(f"{label} repeat {repeat}: {shape.status.value}: {shape.reason[:160]}")
            continue
        evals.append((label, shape.timings["candidate"].median_us, shape.timings["cublas"].median_us))
        print(f"{label:<{width}} repeat {repeat} {evals[-1][1]:.3f} us (cuBLAS {evals[-1][2]:.3f})", flush=True)
    print(f"\n64x64x64 on {evaluator.gpu_label}, offline, {args.repeats} repeats, target_ms {args.target_ms:g}; "
          f"{len(failures)} evaluations not ok", *failures, sep="\n")
    print(table(evals))
    if args.json:
        args.json.write_text(json.dumps(evals, indent=1))
    return 0 if not failures and {label for label, _, _ in evals} == set(cands) else 1


if __name__ == "__main__":
    raise SystemExit(main())
