"""What an sm90 kernel's entry point costs the host per call, with and without `host_cache` (GPU).

    python3 benchmarks/host_overhead.py [--out host_overhead.json]
    python3 benchmarks/host_overhead.py --compile-only [--cache-dir DIR]   # CPU: fill a compile cache for the device

Why: in server and wallclock mode the grid's sm90 winners take ~13 us more per call over their offline (graph
replay) time than the sm80 and small kernels do (benchmarks/RESULTS.md, twenty-fifth session). A graph replays the
launch alone; a plain call also runs the entry point's host code, which for sm90 is CUTLASS's initialize() (the TMA
descriptors, the tile scheduler's setup, the shared memory attribute) on every call. `host_cache=True` keeps those
between calls with the same pointers, shape, workspace and device. This measures both twins of each config in
PAIRS, and torch.matmul (cuBLAS) beside them, on the same operands, called straight through ctypes as cudal2.ops
calls a kernel:

    queued_us   back-to-back calls, CALLS of them, then one synchronize, per call: the rate a host-bound eager caller
                gets (the kernels of PAIRS' small shapes run in a few us, faster than their host code)
    sync_us     median over CALLS of one call then a synchronize, host wall clock: CUDA-L2's wall-clock method
    moving_us   queued_us with the operands alternating between two buffer sets, so that every call changes its
                pointers: host_cache's miss path (it still keeps the shared memory attribute per thread and device)

Each kernel is checked against torch first (a wrong result aborts). Beside the twins, two reference kernels with a
plain launch (REFERENCES: the `small` kernel that won 512x128x512 before the sm90 one, the fastest sm80 kernel at
1024^3) show what a launch costs without CUTLASS's host code. Then every kernel is timed by the evaluator itself in
MODES (offline, server, wallclock: the harness's own figures, cuBLAS beside them), unless --no-eval. Prints
markdown; --out writes JSON. Compiling takes ~1 minute of 16 cores on the H200 (a compile cache filled on a CPU
machine with --compile-only, then carried as in scripts/precompile.sh, is served instead).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from cudal2 import ops
from cudal2.export import sha256_text
from cudal2.kernels.family import KernelFamily, config_name
from cudal2.kernels.sm80 import Sm80Family
from cudal2.kernels.sm90 import ARCH
from cudal2.kernels.sm90 import FAMILY as SM90
from cudal2.kernels.small import SmallFamily
from cudal2.sandbox.evaluator import EvalOptions, Evaluator, default_cache_dir
from cudal2.sandbox.types import Mode, Task

Shape = tuple[int, int, int]
SMALL_SHAPES: list[Shape] = [(512, 128, 512), (256, 256, 256), (1024, 64, 1024)]

# (config, shapes): the grid's sm90 winner at 512x128x512 (64x16 basic, 4 stages), the 128x128 basic tile with the
# TMA epilogue, a stream-K split (flags cleared per call) and split-K as a batch with its reduction launched by PDL.
PAIRS: list[tuple[dict, list[Shape]]] = [
    (dict(bm=64, bn=16, bk=128, cluster_m=1, cluster_n=1, schedule="basic", scheduler="persistent", epilogue="tma",
          stages=4, swizzle=1, acc="fp32", splits=1), SMALL_SHAPES),
    (dict(bm=128, bn=128, bk=64, cluster_m=1, cluster_n=1, schedule="basic", scheduler="persistent", epilogue="tma",
          stages=0, swizzle=1, acc="fp32", splits=1), [(1024, 1024, 1024), (4096, 4096, 4096)]),
    (dict(bm=128, bn=64, bk=64, cluster_m=1, cluster_n=1, schedule="cooperative", scheduler="streamk",
          epilogue="tma", stages=0, swizzle=1, acc="fp32", splits=4), [(256, 256, 4096)]),
    (dict(bm=64, bn=64, bk=64, cluster_m=1, cluster_n=1, schedule="pingpong", scheduler="persistent",
          epilogue="tma", stages=0, swizzle=1, acc="fp32", splits=4, pdl=True), [(128, 256, 8192)]),
]
# Plain-launch kernels (<<<>>> with a few arguments, no CUTLASS host code) on the shapes of the twins they stand
# beside: the store's small-bucket winner of 512x128x512 before the sm90 kernel above, and its fastest sm80 at 1024^3.
REFERENCES: list[tuple[KernelFamily, dict, list[Shape]]] = [
    (SmallFamily(), dict(bm=16, bn=16, warps_m=1, warps_n=2, warps_k=8, k_unroll=1, acc="fp32"), SMALL_SHAPES),
    (Sm80Family(), dict(bm=64, bn=64, bk=64, warps_m=4, warps_n=1, stages=5, split_k=1, group_m=1, min_blocks=1,
                        acc="fp32"), [(1024, 1024, 1024)]),
]
MODES = (Mode.OFFLINE, Mode.SERVER, Mode.WALLCLOCK)
CALLS = 400


@dataclass(frozen=True)
class Kernel:
    """One library to measure: a config of a family, how its entry point launches, the shapes it runs."""

    family: KernelFamily
    config: Any
    entry: str  # "host_cache=0", "host_cache=1" (sm90 twins) or "plain launch" (REFERENCES)
    shapes: tuple[Shape, ...]

    @property
    def name(self) -> str:
        # the twins share the name of the config without host_cache, so that a table pairs them
        base = replace(self.config, host_cache=False) if self.family is SM90 else self.config
        return config_name(self.family, base)


@dataclass(frozen=True)
class Row:
    config: str
    entry: str  # as Kernel.entry, or "torch.matmul"
    shape: str
    queued_us: float
    sync_us: float
    moving_us: float


@dataclass(frozen=True)
class EvalRow:
    """The evaluator's figures for one kernel on one shape in one mode (medians, us)."""

    config: str
    entry: str
    shape: str
    mode: str
    status: str
    candidate_us: float | None
    cublas_us: float | None


def kernels() -> list[Kernel]:
    out = []
    for params, shapes in PAIRS:
        base = SM90.make(params)
        out += [Kernel(SM90, base, "host_cache=0", tuple(shapes)),
                Kernel(SM90, replace(base, host_cache=True), "host_cache=1", tuple(shapes))]
    return out + [Kernel(family, family.make(params), "plain launch", tuple(shapes))
                  for family, params, shapes in REFERENCES]


def compile_all(cache_dir: Path, source_dir: Path) -> dict[Kernel, Path]:
    """Each kernel's source (written to source_dir) built into cache_dir for sm_90a, one nvcc per core, as
    cudal2.ops builds an exported kernel (the evaluator's cache: its timings below are cache hits); exits with the
    reason if one does not compile."""
    todo = kernels()

    def build(kern: Kernel) -> Path:
        path = source_dir / f"{config_name(kern.family, kern.config)}.cu"
        path.write_text(kern.family.render(kern.config))
        built = ops.compile_kernel(path, sha256_text(path.read_text()), ARCH, cache_dir)
        if isinstance(built, ops.Failure):
            sys.exit(f"host_overhead: {built.reason}")
        return path

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # nvcc is single-threaded
        return dict(zip(todo, pool.map(build, todo), strict=True))


def measure(sources: dict[Kernel, Path], cache_dir: Path) -> list[Row]:
    """Host time per call through ctypes, each kernel and torch.matmul on the same operands, per shape."""
    loaded = {kern: load(path, cache_dir) for kern, path in sources.items()}
    shapes = list(dict.fromkeys(s for kern in loaded for s in kern.shapes))
    rows = []
    for m, n, k in shapes:
        sets = [(torch.randn(m, k, device="cuda", dtype=torch.float16),
                 torch.randn(n, k, device="cuda", dtype=torch.float16),
                 torch.empty(m, n, device="cuda", dtype=torch.float16)) for _ in range(2)]
        shape = f"{m}x{n}x{k}"
        for kern, kernel in loaded.items():
            if (m, n, k) in kern.shapes:
                what = f"{config_name(kern.family, kern.config)} on {shape}"
                call = kernel_call(kernel, sets, what)
                check(call, sets, what)
                rows.append(Row(kern.name, kern.entry, shape, *timings(call)))
        rows.append(Row("cuBLAS", "torch.matmul", shape, *timings(matmul_call(sets))))
    return rows


def evaluate(sources: dict[Kernel, Path], cache_dir: Path, modes: tuple[Mode, ...]) -> list[EvalRow]:
    """The evaluator's own timing of every kernel on its shapes in each mode (no store: always measured)."""
    rows = []
    for mode in modes:
        ev = Evaluator(EvalOptions(mode=mode, cache_dir=cache_dir))
        for kern, path in sources.items():
            res = ev.evaluate(path.read_text(), [Task(m, n, k) for m, n, k in kern.shapes])
            for r in res.shapes:
                cand, cublas = r.timings.get("candidate"), r.timings.get("cublas")
                rows.append(EvalRow(kern.name, kern.entry, f"{r.task.m}x{r.task.n}x{r.task.k}", mode.value,
                                    r.status.value, cand.median_us if cand else None,
                                    cublas.median_us if cublas else None))
    return rows


def load(source: Path, cache_dir: Path) -> ops.LoadedKernel:
    """The built library of `source` (a cache hit after compile_all), loaded into this process."""
    kernel = ops.build_kernel(source, sha256_text(source.read_text()), ARCH, cache_dir)
    if isinstance(kernel, ops.Failure):
        sys.exit(f"host_overhead: {kernel.reason}")
    return kernel


def kernel_call(kernel: ops.LoadedKernel, sets: list, what: str) -> Callable[[int], None]:
    """C = A @ B^T of buffer set i by the kernel, on torch's current stream, with a workspace of its own."""
    m, k = sets[0][0].shape
    n = sets[0][1].shape[0]
    ws_bytes = int(kernel.workspace_bytes(m, n, k)) if kernel.workspace_bytes else 0  # the export is optional
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream

    def call(i: int) -> None:
        a, b, out = sets[i]
        rc = kernel.hgemm(a.data_ptr(), b.data_ptr(), out.data_ptr(), m, n, k, ws.data_ptr(), ws_bytes, stream)
        if rc:
            sys.exit(f"host_overhead: {what}: returned {rc}")

    return call


def matmul_call(sets: list) -> Callable[[int], None]:
    def call(i: int) -> None:
        a, b, out = sets[i]
        torch.matmul(a, b.T, out=out)

    return call


def check(call: Callable[[int], None], sets: list, what: str) -> None:
    for i in (0, 1, 0):  # both buffer sets, then the first again (host_cache: rebuilt each time)
        call(i)
        a, b, out = sets[i]
        ref = a.float() @ b.float().T
        torch.cuda.synchronize()
        if float((out.float() - ref).abs().max()) > 1e-2 * float(ref.abs().max()):
            sys.exit(f"host_overhead: {what}: wrong result")


def timings(call: Callable[[int], None]) -> tuple[float, float, float]:
    """(queued_us, sync_us, moving_us) of `call(i)`, i the buffer set (see the module docstring)."""
    def queued(sets: tuple[int, ...]) -> float:
        for i in range(20):  # warm: the first calls build what is kept
            call(sets[i % len(sets)])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(CALLS):
            call(sets[i % len(sets)])
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / CALLS * 1e6

    samples = []
    for _ in range(CALLS):
        t0 = time.perf_counter()
        call(0)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    return queued((0,)), statistics.median(samples), queued((0, 1))


def markdown(rows: list[Row]) -> str:
    out = ["| config | shape | entry point | queued us/call | call + sync us (median) | moving pointers us/call |",
           "|---|---|---|---|---|---|"]
    out += [f"| {r.config} | {r.shape} | {r.entry} | {r.queued_us:.2f} | {r.sync_us:.2f} | {r.moving_us:.2f} |"
            for r in rows]
    return "\n".join(out)


def eval_markdown(rows: list[EvalRow]) -> str:
    """One line per (kernel, shape), a column pair (candidate, cuBLAS) per mode."""
    modes = list(dict.fromkeys(r.mode for r in rows))
    cells: dict[tuple[str, str, str], dict[str, str]] = {}
    for r in rows:
        us = (f"{r.candidate_us:.2f} / {r.cublas_us:.2f}" if r.candidate_us is not None and r.cublas_us is not None
              else r.status)
        cells.setdefault((r.config, r.shape, r.entry), {})[r.mode] = us
    out = ["| config | shape | entry point | " + " | ".join(f"{m} us (kernel / cuBLAS)" for m in modes) + " |",
           "|---|---|---|" + "---|" * len(modes)]
    out += [f"| {c} | {s} | {e} | " + " | ".join(v.get(m, "-") for m in modes) + " |"
            for (c, s, e), v in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2]))]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile-only", action="store_true", help="build the kernels into the cache and stop (no GPU)")
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="the compile cache (default: the evaluator's, which gpu_check.sh fills from .precompiled)")
    ap.add_argument("--no-eval", action="store_true", help="skip the evaluator's timing in MODES")
    ap.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args()
    cache_dir = args.cache_dir or default_cache_dir()
    with tempfile.TemporaryDirectory() as source_dir:
        sources = compile_all(cache_dir, Path(source_dir))
        if args.compile_only:
            print(f"{len(sources)} libraries in {cache_dir}")
            return
        rows = measure(sources, cache_dir)
        print(markdown(rows), flush=True)
        eval_rows = [] if args.no_eval else evaluate(sources, cache_dir, MODES)
    if eval_rows:
        print("\n" + eval_markdown(eval_rows))
    if args.out:
        args.out.write_text(json.dumps({"host": [asdict(r) for r in rows], "evaluator": [asdict(r) for r in eval_rows]},
                                       indent=1))


if __name__ == "__main__":
    main()
