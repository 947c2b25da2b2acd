"""Pool throughput on a GPU machine: 64 distinct raw-CUDA candidates x 4 shapes through the local pool.

    python3 benchmarks/pool_gpu.py [--candidates 64] [--gpus 0 | 0,1 | all] [--json OUT.json]
Reports evaluations per minute including compile (target >= 60 on 16 cores + 1 H200) and the GPU busy fraction
(target >= 70%). Run once per GPU count (--gpus 0, then 0,1, ...) for the pool scaling figure of the multi-GPU issue:
efficiency = (evaluations/min on n GPUs) / (n x evaluations/min on 1 GPU). Candidates are the four seed kernels, each in distinct variants (a comment changes the source,
so every one is compiled and measured on its own, as policy samples would be).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cudal2.sandbox.evaluator import EvalOptions
from cudal2.sandbox.pool import PoolConfig, SandboxPool
from cudal2.sandbox.types import Task

ROOT = Path(__file__).resolve().parent.parent
SHAPES = (Task(128, 4096, 128), Task(1024, 1024, 1024), Task(2048, 2048, 512), Task(4096, 1024, 4096))


def candidates(n: int) -> list[str]:
    seeds = [p.read_text() for p in sorted((ROOT / "kernels" / "seed").glob("*.cu")) if p.stem != "naive"]
    return [f"// pool benchmark variant {i}\n" + seeds[i % len(seeds)] for i in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--candidates", type=int, default=64)
    ap.add_argument("--gpus", default="all", help="GPU indices for the pool, comma-separated, or all")
    ap.add_argument("--json", default="", help="also write the figures to this JSON file")
    args = ap.parse_args()
    srcs = candidates(args.candidates)
    gpus = None if args.gpus == "all" else tuple(int(g) for g in args.gpus.split(","))
    cfg = PoolConfig(db_path="", gpus=gpus, eval=EvalOptions(fresh=True, target_ms=50))
    t0 = time.monotonic()
    with SandboxPool(cfg) as pool:
        results = pool.map(srcs, SHAPES)
        stats = pool.stats()
    wall = time.monotonic() - t0
    evals = sum(len(r.shapes) for r in results)
    ok = sum(s.status.value == "ok" for r in results for s in r.shapes)
    print(stats.render())
    print("\n| candidates x shapes | ok | wall (s) | evaluations/min | GPU busy |")
    print("|---|---|---|---|---|")
    print(f"| {len(srcs)} x {len(SHAPES)} | {ok}/{evals} | {wall:.1f} | {60 * evals / wall:.1f} | "
          f"{', '.join(f'{b:.0%}' for b in stats.gpu_busy)} |")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "gpus": args.gpus, "n_gpus": len(stats.gpu_busy), "candidates": len(srcs), "shapes": len(SHAPES),
            "evaluations": evals, "ok": ok, "wall_s": wall, "evals_per_min": 60 * evals / wall,
            "gpu_busy": list(stats.gpu_busy)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
