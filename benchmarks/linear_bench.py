"""What cudal2.ops.linear's choices cost around the GEMM itself (GPU): the separate bias add, and the patched
forward's host time per call.

    python3 benchmarks/linear_bench.py [--tokens 1,16,128] [--out linear_bench.json]

1. Bias. F.linear(x, w, b) on CUDA hands the bias to cuBLAS(Lt)'s epilogue; cudal2's kernels take no bias, so
   cudal2.ops.linear adds it with a separate elementwise kernel. For each biased projection shape of the LLM models
   (Qwen2.5's q/k/v) at each token count M, both are timed as CUDA graphs of CALLS_PER_GRAPH calls, in ROUNDS
   alternating rounds:  ours-like = torch.matmul(x, w.T) + b   (cuBLAS without epilogue, then the add)
                        torch     = F.linear(x, w, b)           (the fused bias)
   The penalty per call is the median over rounds of the difference (us): what a kernel must save over
   torch.matmul for a biased layer to gain. A least-squares fit penalty = launch_us + 4 M N / bytes_per_us (the add
   reads and writes the [M, N] half output) is printed; cudal2.ops.BIAS_ADD_LAUNCH_US and BIAS_ADD_BYTES_PER_US were
   chosen from these points (the fit itself misses the small ones by 2x; ops.py says how close its constants are).
2. Host time per call of an nn.Linear(64, 64) forward on a [1, 1, 64] half input (host-bound: the GPU work is a
   few us), stock and patched with no library active (every call takes F.linear after the patch's checks), and the
   checks' parts alone. Each is the least of 3 loops of HOST_CALLS calls timed with time.perf_counter. (A whole
   model's forward timed so spread 1.8x between loops on the H200's host: benchmarks/model_bench.py times models,
   in alternating rounds.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from ops_bench import CALLS_PER_GRAPH, _events_us, capture

from cudal2 import ops
from cudal2.data import LLM_MODELS, TOKEN_COUNTS, parse_token_counts

ROUNDS = 5
HOST_CALLS = 2000


@dataclass(frozen=True)
class BiasRow:
    m: int
    n: int
    k: int
    matmul_us: float  # torch.matmul alone, graph, per call
    matmul_add_us: float  # torch.matmul then + b
    linear_bias_us: float  # F.linear(x, w, b)
    penalty_us: float  # median over rounds of (matmul_add - linear_bias)


def graph_timer(fn: Callable[[], torch.Tensor]) -> Callable[[], float]:
    """A graph of CALLS_PER_GRAPH calls of fn, and a function timing one replay (us per call)."""
    graph, outs = capture(fn, CALLS_PER_GRAPH)

    def timed() -> float:
        _ = outs  # the captured outputs live as long as the graph is replayed
        return _events_us(graph.replay, CALLS_PER_GRAPH)
    return timed


def bias_row(m: int, n: int, k: int) -> BiasRow:
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
    b = torch.randn(n, device="cuda", dtype=torch.float16)
    mm = graph_timer(lambda: torch.matmul(x, w.t()))
    mm_add = graph_timer(lambda: torch.matmul(x, w.t()) + b)
    lin = graph_timer(lambda: torch.nn.functional.linear(x, w, b))
    t_mm, t_add, t_lin = [], [], []
    for _ in range(ROUNDS):
        t_mm.append(mm())
        t_add.append(mm_add())
        t_lin.append(lin())
    med = statistics.median
    return BiasRow(m, n, k, med(t_mm), med(t_add), med(t_lin), med(a - b for a, b in zip(t_add, t_lin, strict=True)))


def fit(rows: list[BiasRow]) -> tuple[float, float]:
    """Least squares penalty = a + bytes / bw over the rows (bytes = 4 M N); returns (a us, bw bytes per us)."""
    xs = [4.0 * r.m * r.n for r in rows]
    ys = [r.penalty_us for r in rows]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, (1 / slope if slope > 0 else float("inf"))


def host_us(fn: Callable[[], object]) -> float:
    """Host microseconds per call: the least of 3 loops of HOST_CALLS calls (the GPU synchronised after each)."""
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(HOST_CALLS):
            fn()
        best = min(best, (time.perf_counter() - t0) * 1e6 / HOST_CALLS)
        torch.cuda.synchronize()
    return best


def host_rows() -> dict[str, float]:
    os.environ[ops.ENV_LIBRARY] = "/nonexistent/cudal2-linear-bench"  # no library: every shape takes torch
    ops.unload_library()
    lin = torch.nn.Linear(64, 64, device="cuda", dtype=torch.float16)
    x = torch.randn(1, 1, 64, device="cuda", dtype=torch.float16)
    rows = {"nn.Linear forward (stock)": host_us(lambda: lin(x))}
    with ops.patch_linear(lin):
        rows["nn.Linear forward (patched; every call takes F.linear)"] = host_us(lambda: lin(x))
    rows["F.linear"] = host_us(lambda: torch.nn.functional.linear(x, lin.weight, lin.bias))
    rows["torch.cuda.is_current_stream_capturing()"] = host_us(torch.cuda.is_current_stream_capturing)
    rows["torch.compiler.is_compiling()"] = host_us(torch.compiler.is_compiling)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default=",".join(map(str, TOKEN_COUNTS)), help="token counts M")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("linear_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        tokens = parse_token_counts(args.tokens)
    except ValueError as e:
        raise SystemExit(f"linear_bench: {e}") from None
    shapes = sorted({(n, k) for model in LLM_MODELS for name, n, k in model.linears() if model.has_bias(name)})
    with torch.inference_mode():
        rows = [bias_row(m, n, k) for n, k in shapes for m in tokens]
        host = host_rows()
    print("| M | N | K | matmul us | matmul + add us | F.linear with bias us | penalty us |\n" + "|---" * 7 + "|")
    for r in rows:
        print(f"| {r.m} | {r.n} | {r.k} | {r.matmul_us:.2f} | {r.matmul_add_us:.2f} | {r.linear_bias_us:.2f} | "
              f"{r.penalty_us:.2f} |")
    launch, bw = fit(rows)
    print(f"\nfit: penalty = {launch:.2f} us + 4 M N bytes / {bw:.3g} bytes per us")
    print("\n| host time per call | us |\n|---|---|")
    for name, us in host.items():
        print(f"| {name} | {us:.2f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"bias": [asdict(r) for r in rows], "fit": [launch, bw],
                                              "host_us": host}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
