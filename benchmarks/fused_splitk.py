"""Split-K summed in the GEMM's own epilogue (the sm90 family's reduction=last) against split-K with a reduction kernel,
on the same tiles (GPU).

    python3 benchmarks/fused_splitk.py [--shapes M_N_K ...] [--repeats 2] [--target-ms 20] [--json OUT] [--compile-only]

Why: where a shape has fewer output tiles than SMs and a long K (1024x1024x4096 has 64 tiles of 128x128 for 132 SMs),
the grid's winners run 64-row tiles or split K as a batch: fp32 partials to the workspace, then a second kernel sums
them (~3.5 us more than the best kernel at 1024^3 on the H200). With reduction=last (cudal2.kernels.sm90_last) each K
range writes its partial and takes the tile's ticket, and the range that draws the last ticket sums the tile in order
and stores it: one launch, deterministic. Each config here is timed beside two twins in the family with the same tile,
cluster, schedule and K ranges: `workspace`, the no-smem epilogue writing fp32 partials and splitk_reduce after it,
and `pdl`, the TMA epilogue writing them and splitk_reduce launched with PDL (the form of the grid's split-K
winners). `repeats` fresh evaluations each in offline mode, cuBLAS timed in every evaluation; nothing is stored.
Printed per (config, shape): the medians over the repeats, each twin's time over reduction=last's (> 1: last is
faster) and cuBLAS.

Measured (benchmarks/RESULTS.md, forty-sixth session, H100): the prototype of this epilogue (then a source of this
script's own) beat the `workspace` twin on 19 of 20 shapes by 1.02-1.35x once it stored C through shared memory in
16-byte rows and read the partials back with all of a range's loads in flight; with CUTLASS's element-wise store it
was within 0.78-1.20x of it, and its first cut, which also read the partials one load at a time, was 1.8-4x slower
than the grid's winners.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from cudal2.kernels.family import config_name
from cudal2.kernels.sm90 import FAMILY, Epilogue, Reduction, Schedule, Scheduler, Sm90Config
from cudal2.sandbox.types import Acc, Status, Task

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing_runs import add_timing_flags, evaluator_for, prepare_all, sort_prepared  # noqa: E402  (a sibling script)

# Fewer 128x128 tiles than SMs and a long K; 77x1000x336 for odd M and N (K % (8 x 2) == 0 only: 4 ranges refuse it).
SHAPES = ("77_1000_336", "1024_1024_4096", "512_1024_4096", "512_512_8192", "256_1024_8192", "1024_512_16384")


def _last(bm: int, bn: int, schedule: Schedule, splits: int, ctas_per_sm: int = 1) -> Sm90Config:
    return Sm90Config(bm=bm, bn=bn, bk=64, cluster_m=1, cluster_n=1, schedule=schedule,
                      scheduler=Scheduler.PERSISTENT, epilogue=Epilogue.NOSMEM, stages=0, swizzle=1, acc=Acc.FP32,
                      splits=splits, reduction=Reduction.LAST, ctas_per_sm=ctas_per_sm)


# The prototype's four decompositions (128x128 cooperative, 128x64 basic; 2 and 4 K ranges), then the tile of the H200
# grid's split-K winners on 512x512x8192 and 256x1024x8192 (64x128 basic, 4 ranges), also two CTAs per SM.
CONFIGS = (*(_last(bm, bn, schedule, s) for bm, bn, schedule in ((128, 128, Schedule.COOPERATIVE),
                                                                  (128, 64, Schedule.BASIC)) for s in (2, 4)),
           _last(64, 128, Schedule.BASIC, 4), _last(64, 128, Schedule.BASIC, 4, ctas_per_sm=2))
KINDS = ("last", "workspace", "pdl")  # the config itself, then its two twins with a reduction kernel


def variant(c: Sm90Config, kind: str) -> Sm90Config:
    """The config (`last`) or a twin with splitk_reduce after the GEMM: `workspace` (no-smem partials, a plain
    launch) or `pdl` (TMA partials, the reduction launched with PDL)."""
    if kind == "last":
        return c
    twin = replace(c, reduction=Reduction.ORDERED)
    return twin if kind == "workspace" else replace(twin, epilogue=Epilogue.TMA, pdl=True)


def label(c: Sm90Config) -> str:
    """The config's tile, schedule and split, short: 128x64-basic-s4 (-2cta: two CTAs per SM)."""
    return f"{c.bm}x{c.bn}-{c.schedule.value}-s{c.splits}" + (f"-{c.ctas_per_sm}cta" if c.ctas_per_sm > 1 else "")


def sources() -> dict[tuple[Sm90Config, str], str]:
    """(config, kind) -> source."""
    return {(c, kind): FAMILY.render(variant(c, kind)) for c in CONFIGS for kind in KINDS}


def table(evals: dict[tuple[Sm90Config, str, str], list[tuple[float, float]]]) -> str:
    """Markdown: per (config, shape) each kind's median (us, over repeats), each twin's time over last's, and cuBLAS's
    median over all the evaluations. `evals`: (config, kind, shape) -> [(kernel us, cuBLAS us)]; a row needs last's
    time and a twin's."""
    lines = ["| config | shape | last us | workspace us | pdl us | workspace / last | pdl / last | cuBLAS us |",
             "|---|---|---|---|---|---|---|---|"]
    for c in CONFIGS:
        for shape in dict.fromkeys(s for (_, _, s) in evals):
            runs = {kind: evals.get((c, kind, shape), []) for kind in KINDS}
            if not runs["last"] or not (runs["workspace"] or runs["pdl"]):
                continue
            us = {kind: statistics.median(x for x, _ in r) if r else None for kind, r in runs.items()}
            cublas = statistics.median(cb for r in runs.values() for _, cb in r)
            cells = [f"{us[k]:.2f}" if us[k] else "-" for k in KINDS]
            ratios = [f"{us[k] / us['last']:.3f}x" if us[k] else "-" for k in KINDS[1:]]
            lines.append(f"| {label(c)} | {shape} | {' | '.join(cells)} | {' | '.join(ratios)} | {cublas:.2f} |")
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
    # each source on the shapes its config supports (equal K ranges of 16-byte rows; the TMA twin: N % 8 == 0)
    jobs = {(c, kind): (src, [t for t in tasks if FAMILY.supports(variant(c, kind), t) is None])
            for (c, kind), src in sources().items()}
    ready = sort_prepared(prepare_all(evaluator, {k: job for k, job in jobs.items() if job[1]}), what="kernels",
                          compile_only=args.compile_only, name=lambda k: f"{label(k[0])} {k[1]}")
    if args.compile_only:
        return 1 if ready.stopped else 0
    evals: dict[tuple[Sm90Config, str, str], list[tuple[float, float]]] = {}
    failures: list[str] = []
    for repeat in range(args.repeats):
        for (c, kind), prepared in ready.runnable.items():
            for shape in evaluator.run(prepared).shapes:
                if shape.status is not Status.OK:
                    failures.append(f"{label(c)} {kind} {shape.task.mnk} repeat {repeat}: {shape.status.value}: "
                                    f"{shape.reason[:120]}")
                    continue
                us, cublas = shape.timings["candidate"].median_us, shape.timings["cublas"].median_us
                evals.setdefault((c, kind, shape.task.mnk), []).append((us, cublas))
                print(f"{label(c)} {kind} {shape.task.mnk} repeat {repeat}: {us:.2f} us (cuBLAS {cublas:.2f})",
                      flush=True)
    print(f"\n{len(CONFIGS)} reduction=last configs and their twins on {evaluator.gpu_label}, offline, {args.repeats} "
          f"repeats, target_ms {args.target_ms:g}; {len(failures)} evaluations not ok", *failures, sep="\n")
    print(table(evals))
    if args.json:
        args.json.write_text(json.dumps([{"config": config_name(FAMILY, variant(c, kind)), "kind": kind, "mnk": mnk,
                                          "us_cublas": runs} for (c, kind, mnk), runs in evals.items()], indent=1))
    return 0 if not ready.stopped and not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
