"""Is the paired speedup steadier than the ratio of medians? The same kernels timed again and again, on the GPU.

    python3 benchmarks/paired_noise.py [--db benchmarks/stores/h200_grid.sqlite.gz] [--shapes data/grid.csv]
        [--gpu h200] [--min-log2-mnk 36] [--count 24] [--repeats 3] [--target-ms 20] [--json OUT] [--compile-only]

Picks `count` shapes of the set with MNK >= 2^min-log2-mnk, evenly spread over them in MNK order, and on each the
kernel the offline search chose (the one `cudal2 report` shows). Then times each (kernel, shape) `repeats` times, each
time in a fresh evaluation (its own harness process, offline mode, the grid runs' target_ms; the store is only read,
nothing is written to it). The repeats go round the shapes, so one shape's repeats are minutes apart, not adjacent.

Each evaluation gives two estimates of the candidate's speedup over a baseline: the ratio of the two medians (what
every leaderboard so far reports) and the paired speedup, the median over repetitions of baseline_r / candidate_r
(harness.cu `paired_json`). The steadier estimator varies less between repeats of one (kernel, shape). Printed per
baseline and estimator, over the shapes: the median and p90 of log(max/min) across that shape's repeats, in percent,
and the geomean over all evaluations of paired / ratio of medians (does pairing move the figure on average?).

--compile-only compiles the chosen kernels on this machine for sm_90a (to carry precompiled to a GPU call: the same
store picks the same kernels) and times nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from cudal2.sandbox.evaluator import Evaluator, Prepared
from cudal2.sandbox.store import GpuLabelError, ResultStore, StoreError, resolve_gpu_label
from cudal2.sandbox.types import ShapeResult, Status, Task
from cudal2.tune import TuneInputError, load_tasks

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing_runs import add_timing_flags, evaluator_for, prepare_all, sort_prepared  # noqa: E402  (a sibling script)
from wave_model_check import open_db, store_arguments  # noqa: E402  (a sibling script)

BASELINES = ("cublas", "cublaslt_autotuned")


@dataclass(frozen=True)
class Estimate:
    """One evaluation of one (kernel, shape): both estimators per baseline (dimensionless speedups)."""

    mnk: str
    repeat: int
    ratio: dict[str, float]  # baseline median / candidate median
    paired: dict[str, float]  # median over repetitions of baseline_r / candidate_r
    reps: int


def spread_evenly(tasks: list[Task], count: int) -> list[Task]:
    """`count` tasks evenly spaced over `tasks` in MNK order (all of them when there are fewer)."""
    ordered = sorted(tasks, key=lambda t: (t.m * t.n * t.k, t.mnk))
    if count >= len(ordered):
        return ordered
    step = (len(ordered) - 1) / max(1, count - 1)
    return [ordered[round(i * step)] for i in range(count)]


def chosen_kernels(store: ResultStore, tasks: list[Task], gpu: str) -> list[tuple[Task, str]]:
    """(task, source) of each task's chosen offline kernel; tasks without one are skipped."""
    out = []
    for task in tasks:
        best = store.chosen(task, gpu)
        if best:
            out.append((task, store.get_source(best[0][0])))
    return out


def estimate(result: ShapeResult, repeat: int) -> Estimate | None:
    if result.status is not Status.OK:
        return None
    ratio = {b: s for b in BASELINES if (s := result.speedup(b)) is not None}
    paired = {b: s for b in BASELINES if (s := result.paired_speedup(b)) is not None}
    return Estimate(result.task.mnk, repeat, ratio, paired, result.timings["candidate"].reps)


def spread_pct(values: list[float]) -> float:
    """log(max/min) of one shape's repeats, in percent."""
    return 100 * math.log(max(values) / min(values))


def quantile(values: list[float], f: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(f * (len(ordered) - 1) + 0.5))]


def summary(estimates: list[Estimate]) -> str:
    lines = ["| baseline | estimator | shapes | median spread % | p90 spread % | max spread % |", "|---|---|---|---|---|---|"]
    by_shape: dict[str, list[Estimate]] = {}
    for e in estimates:
        by_shape.setdefault(e.mnk, []).append(e)
    for b in BASELINES:
        for name in ("ratio", "paired"):
            spreads = [spread_pct(vals) for group in by_shape.values()
                       if len(vals := [getattr(e, name)[b] for e in group if b in getattr(e, name)]) >= 2]
            if spreads:
                lines.append(f"| {b} | {'ratio of medians' if name == 'ratio' else 'paired median'} | {len(spreads)} | "
                             f"{statistics.median(spreads):.2f} | {quantile(spreads, 0.9):.2f} | {max(spreads):.2f} |")
    for b in BASELINES:
        logs = [math.log(e.paired[b] / e.ratio[b]) for e in estimates if b in e.paired and b in e.ratio]
        if logs:
            lines.append(f"\n{b}: paired / ratio of medians, geomean over {len(logs)} evaluations: "
                         f"{math.exp(statistics.fmean(logs)):.4f} (min {math.exp(min(logs)):.4f}, "
                         f"max {math.exp(max(logs)):.4f})")
    return "\n".join(lines)


def measure(evaluator: Evaluator, prepared: list[Prepared], repeats: int) -> tuple[list[Estimate], list[str]]:
    estimates, failures = [], []
    for repeat in range(repeats):
        for p in prepared:
            result = evaluator.run(p).shapes[0]
            e = estimate(result, repeat)
            if e is None:
                failures.append(f"{result.task.mnk} repeat {repeat}: {result.status.value}: {result.reason[:120]}")
            else:
                estimates.append(e)
                print(f"{e.mnk:<18} repeat {repeat}  cublas: ratio {e.ratio.get('cublas', 0):.4f} "
                      f"paired {e.paired.get('cublas', 0):.4f}  ({e.reps} reps)", flush=True)
    return estimates, failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    store_arguments(ap)
    ap.add_argument("--min-log2-mnk", type=int, default=36, help="shapes with MNK >= 2^this (36: the large bucket)")
    ap.add_argument("--count", type=int, default=24, help="shapes to time")
    add_timing_flags(ap, what="(kernel, shape)", repeats=3, target_ms=20.0)
    args = ap.parse_args(argv)
    if args.count < 1 or args.repeats < 2:
        print("paired_noise.py: --count must be >= 1 and --repeats >= 2", file=sys.stderr)
        return 2
    try:
        tasks = [t for t in load_tasks(args.shapes, [], "fp32") if t.m * t.n * t.k >= 2**args.min_log2_mnk]
        with tempfile.TemporaryDirectory() as tmp, ResultStore(open_db(Path(args.db), Path(tmp), args.until)) as store:
            gpu = resolve_gpu_label(store.ok_gpus(), args.gpu, None)
            picks = chosen_kernels(store, spread_evenly(tasks, args.count), gpu)
    except (TuneInputError, StoreError, GpuLabelError, OSError) as e:
        print(f"paired_noise.py: {e}", file=sys.stderr)
        return 2
    if not picks:
        print("paired_noise.py: no shape in range has a chosen kernel in the store", file=sys.stderr)
        return 2
    evaluator = evaluator_for(args, baselines=True)
    ready = sort_prepared(prepare_all(evaluator, {i: (source, [task]) for i, (task, source) in enumerate(picks)}),
                          what="kernels", compile_only=args.compile_only, name=lambda i: picks[i][0].mnk)
    if args.compile_only:
        return 1 if ready.stopped else 0
    runnable = list(ready.runnable.values())
    estimates, failures = measure(evaluator, runnable, args.repeats)
    print(f"\n{len(runnable)} (kernel, shape) pairs x {args.repeats} repeats on {evaluator.gpu_label}, "
          f"target_ms {args.target_ms:g}; {len(failures)} evaluations not ok")
    print("\n".join(failures))
    print(summary(estimates))
    if args.json:
        args.json.write_text(json.dumps([asdict(e) for e in estimates], indent=1))
    return 0 if estimates and not failures and not ready.stopped else 1


if __name__ == "__main__":
    raise SystemExit(main())
