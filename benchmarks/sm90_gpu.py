"""The sm90 family (CUTLASS wgmma/TMA kernels) on large shapes, against cuBLAS and cuBLASLt autotuned (one H200).

    python3 benchmarks/sm90_gpu.py [--json OUT.json]

Six configs x six large shapes through the sandbox pool: every config compiles at once (one nvcc each, ~60-90 s on
16 cores), then the GPU evaluates them one after another (offline mode: CUDA-graph replay, rotating inputs, all
baselines in the same process). Prints one markdown table per baseline (speedup = baseline time / kernel time,
> 1 means the kernel is faster), the kernel's TFLOP/s, the best config per shape and each config's compile time.
Target: under 4 minutes in all.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from cudal2.kernels.family import config_name
from cudal2.kernels.sm90 import FAMILY, Epilogue, Schedule, Scheduler, Sm90Config
from cudal2.sandbox.evaluator import EvalOptions
from cudal2.sandbox.pool import PoolConfig, SandboxPool
from cudal2.sandbox.types import EvalResult, Status, Task

BASELINES = ("cublas", "cublaslt_autotuned")
SHAPES = (
    Task(4096, 4096, 4096),
    Task(8192, 8192, 8192),
    Task(4096, 11008, 4096),  # Llama-2-7B MLP up/gate at 4096 tokens
    Task(8192, 4096, 14336),  # Llama-3-8B MLP down at 8192 tokens
    Task(2048, 14336, 4096),  # Llama-3-8B MLP up/gate at 2048 tokens
    Task(16384, 16384, 4096),
)
_D = FAMILY.default()  # cooperative 128x256x64, cluster 1x2, persistent, TMA epilogue, auto stages
CONFIGS: tuple[Sm90Config, ...] = (
    _D,
    replace(_D, bm=256, bn=128, cluster_m=2, cluster_n=1),
    replace(_D, scheduler=Scheduler.STREAMK),
    replace(_D, cluster_m=2, cluster_n=1, swizzle=8),
    replace(_D, bm=128, bn=128, schedule=Schedule.PINGPONG),
    replace(_D, bm=64, bn=256, schedule=Schedule.PINGPONG, cluster_m=2, cluster_n=1, epilogue=Epilogue.NOSMEM),
)


def short(cfg: Sm90Config) -> str:
    """`coop 128x256x64 c1x2 persistent tma s0 z1`: the fields that tell the six apart."""
    return (f"{cfg.schedule.value[:4]} {cfg.bm}x{cfg.bn}x{cfg.bk} c{cfg.cluster_m}x{cfg.cluster_n} "
            f"{cfg.scheduler.value} {cfg.epilogue.value} s{cfg.stages} z{cfg.swizzle}")


def cell(res: EvalResult, task: Task, baseline: str) -> str:
    shape = next(s for s in res.shapes if s.task == task)
    if shape.status is not Status.OK:
        return shape.status.value
    return f"{shape.speedup(baseline):.2f}x"


def tflops(res: EvalResult, task: Task) -> float | None:
    shape = next(s for s in res.shapes if s.task == task)
    cand = shape.timings.get("candidate")
    return task.flops / cand.median_us / 1e6 if shape.status is Status.OK and cand else None


def geomean(xs: list[float]) -> float | None:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def table(results: list[EvalResult], baseline: str) -> str:
    head = ["config", *(t.mnk for t in SHAPES), "geomean"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cfg, res in zip(CONFIGS, results, strict=True):
        gm = geomean([x for s in res.shapes if s.status is Status.OK and (x := s.speedup(baseline))])
        cells = [cell(res, t, baseline) for t in SHAPES]
        rows.append(f"| {short(cfg)} | " + " | ".join(cells) + f" | {f'{gm:.2f}x' if gm else '-'} |")
    return "\n".join(rows)


def best_per_shape(results: list[EvalResult]) -> str:
    rows = ["| shape | best config | TFLOP/s | vs cublas | vs cublaslt_autotuned |", "|---|---|---|---|---|"]
    for task in SHAPES:
        scored = [(tflops(r, task), c, r) for c, r in zip(CONFIGS, results, strict=True) if tflops(r, task)]
        if not scored:
            rows.append(f"| {task.mnk} | none ok | - | - | - |")
            continue
        best, cfg, res = max(scored, key=lambda x: x[0])
        rows.append(f"| {task.mnk} | {short(cfg)} | {best:.0f} | {cell(res, task, 'cublas')} | "
                    f"{cell(res, task, 'cublaslt_autotuned')} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="", help="also write every figure to this JSON file")
    args = ap.parse_args()
    sources = [FAMILY.render(c) for c in CONFIGS]
    for c in CONFIGS:
        assert FAMILY.prune(c, "sm_90a") is None and all(FAMILY.supports(c, t) is None for t in SHAPES)
    with tempfile.TemporaryDirectory() as tmp:
        # Its own store: the autotuned cuBLASLt algorithm of each shape is found once and reused by every config.
        cfg = PoolConfig(db_path=str(Path(tmp) / "results.sqlite"), compile_workers=len(sources),
                         gpu_queue=len(sources), eval=EvalOptions(target_ms=30, compile_timeout_s=400))
        t0 = time.monotonic()
        with SandboxPool(cfg) as pool:
            results = pool.map(sources, SHAPES, caller="sm90_gpu")
        wall = time.monotonic() - t0
    for baseline in BASELINES:
        print(f"\nSpeedup vs {baseline} (offline mode, H200):\n")
        print(table(results, baseline))
    print("\nBest config per shape:\n")
    print(best_per_shape(results))
    print("\nnvcc seconds per config (all compiled in parallel; 0 = cached): "
          + ", ".join(f"{short(c)}: {r.compile.seconds if r.compile else 0:.0f}" for c, r in zip(CONFIGS, results, strict=True)))
    print(f"\nwall {wall:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "wall_s": wall,
            "configs": [config_name(FAMILY, c) for c in CONFIGS],
            "results": [{"config": config_name(FAMILY, c), "shapes": [
                {"mnk": s.task.mnk, "status": s.status.value, "reason": s.reason,
                 "speedups": s.speedups(), "tflops": tflops(r, s.task)} for s in r.shapes]}
                for c, r in zip(CONFIGS, results, strict=True)],
        }, indent=1))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
