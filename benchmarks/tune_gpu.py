"""`cudal2 tune` on one GPU over a stratified sample of the CUDA-L2 grid; prints a markdown table.

    python3 benchmarks/tune_gpu.py [--budget-minutes 3] [--per-bucket 6] [--families all] [--target-ms 30]
                                   [--db PATH] [--seed 0] [--out tune_gpu.md]

The sample: `--per-bucket` shapes of the train split from each leaderboard size bucket (< 2^24, 2^24-2^30,
2^30-2^36, >= 2^36), the first by sha256 of "M_N_K" (fixed, so every run tunes the same shapes). The evolutionary
tuner runs for `--budget-minutes` (queued jobs are cancelled at the deadline, the one on the GPU finishes), then the
table lists per shape the best verified kernel in the store with its speedup over cuBLAS (torch.matmul's path) and
cuBLASLt autotuned, and per bucket the geometric means. On an H200 with 16 cores the default run takes under 5
minutes (3 minutes of search, the harness build and the last job). A re-run with the same --db resumes.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from pathlib import Path

from cudal2 import tune
from cudal2.data import BUCKETS, bucket, load_shapes
from cudal2.sandbox.types import Task
from cudal2.tune_search import Strategy

ROOT = Path(__file__).resolve().parent.parent


def stratified_sample(per_bucket: int) -> list[Task]:
    rows = load_shapes(ROOT / "data" / "grid.csv", "train")
    out: list[Task] = []
    for _, _, name in BUCKETS:
        members = sorted((r.task for r in rows if bucket(r.M, r.N, r.K) == name),
                         key=lambda t: hashlib.sha256(t.mnk.encode()).hexdigest())
        out += members[:per_bucket]
    return out


def geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def bucket_table(tasks: list[Task], best: list[tune.BestKernel]) -> str:
    lines = ["| bucket | shapes | with a verified kernel | geomean vs cublas | geomean vs cublaslt_autotuned |",
             "|---|---:|---:|---:|---:|"]
    by_task = {b.task: b for b in best}
    for _, _, name in BUCKETS:
        members = [t for t in tasks if bucket(t.m, t.n, t.k) == name]
        found = [by_task[t] for t in members if t in by_task]
        means = [geomean([b.speedups[k] for b in found if k in b.speedups]) for k in tune.BASELINES]
        cells = [f"{m:.3f}x" if m else "-" for m in means]
        lines.append(f"| {name} | {len(members)} | {len(found)} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget-minutes", type=float, default=3.0)
    ap.add_argument("--per-bucket", type=int, default=6, help="shapes per size bucket")
    ap.add_argument("--families", default="all", help="comma-separated family names, or all")
    ap.add_argument("--target-ms", type=float, default=30.0, help="timing budget per kernel per shape")
    ap.add_argument("--max-configs", type=int, default=1000)
    ap.add_argument("--db", default=None, help="result store (default: the user store)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="also write the markdown here")
    args = ap.parse_args()
    tasks = stratified_sample(args.per_bucket)
    options = tune.TuneOptions(families=tuple(args.families.split(",")), strategy=Strategy.EVOLUTIONARY,
                               budget_s=args.budget_minutes * 60, max_configs=args.max_configs, seed=args.seed,
                               db_path=args.db, target_ms=args.target_ms)
    try:
        summary = tune.run(options, tasks, out=lambda line: print(line, flush=True))
    except tune.TuneInputError as e:
        print(f"tune_gpu: error: {e}", file=sys.stderr)
        return 2
    report = "\n\n".join([
        f"tune_gpu: {len(tasks)} shapes ({args.per_bucket} per bucket), budget {args.budget_minutes:g} min, "
        f"families {args.families}, target {args.target_ms:g} ms",
        summary.render(), tune.best_table(tasks, summary.best), bucket_table(tasks, summary.best)])
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")
    return 0 if summary.best else 1


if __name__ == "__main__":
    sys.exit(main())
