"""Evaluator benchmarks (GPU): wall time per (candidate, shape), re-evaluation spread, cost of the runtime
checks, and cuBLAS-through-the-harness vs torch.matmul. Prints a markdown summary; full numbers to --out.

    python3 benchmarks/eval_bench.py --out bench.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from cudal2.sandbox.evaluator import EvalOptions, Evaluator
from cudal2.sandbox.types import Task

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "kernels" / "seed" / "mma_multistage.cu"
SIZES = {"small": Task(128, 128, 128), "medium": Task(1024, 1024, 1024), "large": Task(4096, 4096, 4096)}
GRID_SAMPLE = [Task(m, n, k) for m, n, k in [(64, 64, 64), (128, 4096, 128), (512, 512, 512), (1024, 1024, 4096),
                                             (4096, 4096, 4096), (8192, 8192, 8192)]]


def eval_wall(ev: Evaluator, src: str, task: Task) -> tuple[float, dict]:
    """Wall seconds of one fresh single-shape evaluation (compile cached beforehand) and its result."""
    t0 = time.perf_counter()
    res = ev.evaluate(src, [task])
    return time.perf_counter() - t0, res.shapes[0]


def wall_times(src: str, reps: int, checks: bool) -> dict:
    ev = Evaluator(EvalOptions(fresh=True, checks=checks))
    ev.evaluate(src, [SIZES["small"]])  # compile + harness build outside the measurement
    out = {}
    for name, task in SIZES.items():
        walls, statuses = [], []
        for _ in range(reps):
            w, s = eval_wall(ev, src, task)
            walls.append(w)
            statuses.append(s.status.value)
        out[name] = {"task": task.mnk, "median_s": statistics.median(walls), "walls_s": walls, "statuses": statuses}
    return out


def spread(src: str, reps: int) -> dict:
    ev = Evaluator(EvalOptions(fresh=True))
    out = {}
    for name, task in SIZES.items():
        meds = [ev.evaluate(src, [task]).shapes[0].timings["candidate"].median_us for _ in range(reps)]
        out[name] = {"task": task.mnk, "medians_us": meds,
                     "spread": (max(meds) - min(meds)) / statistics.mean(meds)}
    return out


def torch_graph_us(task: Task, sets: int = 8, reps: int = 50) -> float:
    """torch.matmul (F.linear layout) replayed back-to-back in a CUDA graph over rotating inputs, us per call."""
    import torch

    a = [torch.randn(task.m, task.k, device="cuda", dtype=torch.half) for _ in range(sets)]
    b = [torch.randn(task.n, task.k, device="cuda", dtype=torch.half) for _ in range(sets)]
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for i in range(sets):
            torch.nn.functional.linear(a[i], b[i])
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [torch.nn.functional.linear(a[i], b[i]) for i in range(sets)]
    for _ in range(5):
        g.replay()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1000 / sets)
    del outs
    return statistics.median(times)


def baselines_vs_torch() -> list[dict]:
    ev = Evaluator(EvalOptions())
    rows = []
    for task, res in zip(GRID_SAMPLE, ev.baselines(GRID_SAMPLE), strict=True):
        cub = res.timings.get("cublas")
        tor = torch_graph_us(task)
        rows.append({"task": task.mnk, "status": res.status.value, "cublas_us": cub.median_us if cub else None,
                     "cublaslt_heuristic_us": _med(res, "cublaslt_heuristic"),
                     "cublaslt_autotuned_us": _med(res, "cublaslt_autotuned"), "torch_graph_us": tor,
                     "cublas_over_torch": (cub.median_us / tor) if cub else None})
    return rows


def _med(res, name):
    t = res.timings.get(name)
    return t.median_us if t else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=5, help="re-evaluations for the spread")
    ap.add_argument("--wall-reps", type=int, default=3, help="evaluations per size for the wall times")
    args = ap.parse_args()
    src = KERNEL.read_text()
    report = {
        "wall_with_checks": wall_times(src, args.wall_reps, checks=True),
        "wall_without_checks": wall_times(src, args.wall_reps, checks=False),
        "spread": spread(src, args.reps),
        "baselines_vs_torch": baselines_vs_torch(),
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"\n| size | shape | eval wall median (s), checks on | checks off | ratio | spread of {args.reps} medians |")
    print("|---|---|---|---|---|---|")
    for name in SIZES:
        on, off = report["wall_with_checks"][name], report["wall_without_checks"][name]
        print(f"| {name} | {on['task']} | {on['median_s']:.3f} | {off['median_s']:.3f} | "
              f"{on['median_s'] / off['median_s']:.2f} | {report['spread'][name]['spread'] * 100:.2f}% |")
    print("\n| shape | cuBLAS (us) | Lt heur (us) | Lt auto (us) | torch.matmul graph (us) | cuBLAS/torch |")
    print("|---|---|---|---|---|---|")
    for r in report["baselines_vs_torch"]:
        f = lambda v: f"{v:.2f}" if v is not None else "-"  # noqa: E731
        print(f"| {r['task']} | {f(r['cublas_us'])} | {f(r['cublaslt_heuristic_us'])} | "
              f"{f(r['cublaslt_autotuned_us'])} | {f(r['torch_graph_us'])} | {f(r['cublas_over_torch'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
