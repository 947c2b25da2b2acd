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

Each kernel is checked against torch first (a wrong result aborts). Prints markdown; --out writes JSON. Compiling
takes ~1 minute of 16 cores on the H200 (a compile cache filled on a CPU machine with --compile-only, then carried
as in scripts/precompile.sh, is served instead).
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

import torch

from cudal2 import ops
from cudal2.export import sha256_text
from cudal2.kernels.family import config_name
from cudal2.kernels.sm90 import ARCH, FAMILY, Sm90Config
from cudal2.sandbox.evaluator import default_cache_dir

# (config, shapes): the grid's sm90 winner at 512x128x512 (64x16 basic, 4 stages), the 128x128 basic tile with the
# TMA epilogue, a stream-K split (flags cleared per call) and split-K as a batch with its reduction launched by PDL.
PAIRS: list[tuple[dict, list[tuple[int, int, int]]]] = [
    (dict(bm=64, bn=16, bk=128, cluster_m=1, cluster_n=1, schedule="basic", scheduler="persistent", epilogue="tma",
          stages=4, swizzle=1, acc="fp32", splits=1), [(512, 128, 512), (256, 256, 256), (1024, 64, 1024)]),
    (dict(bm=128, bn=128, bk=64, cluster_m=1, cluster_n=1, schedule="basic", scheduler="persistent", epilogue="tma",
          stages=0, swizzle=1, acc="fp32", splits=1), [(1024, 1024, 1024), (4096, 4096, 4096)]),
    (dict(bm=128, bn=64, bk=64, cluster_m=1, cluster_n=1, schedule="cooperative", scheduler="streamk",
          epilogue="tma", stages=0, swizzle=1, acc="fp32", splits=4), [(256, 256, 4096)]),
    (dict(bm=64, bn=64, bk=64, cluster_m=1, cluster_n=1, schedule="pingpong", scheduler="persistent",
          epilogue="tma", stages=0, swizzle=1, acc="fp32", splits=4, pdl=True), [(128, 256, 8192)]),
]
CALLS = 400


@dataclass(frozen=True)
class Row:
    config: str
    host_cache: bool | None  # None: torch.matmul
    shape: str
    queued_us: float
    sync_us: float
    moving_us: float


def twins() -> list[Sm90Config]:
    configs = [FAMILY.make(params) for params, _ in PAIRS]
    return [c for base in configs for c in (base, replace(base, host_cache=True))]


def compile_all(cache_dir: Path, source_dir: Path) -> dict[Sm90Config, Path]:
    """Each twin's source (written to source_dir) built into cache_dir, one nvcc per core, as cudal2.ops builds an
    exported kernel; exits with the reason if one does not compile."""
    configs = twins()

    def build(c: Sm90Config) -> Path:
        path = source_dir / f"{config_name(FAMILY, c)}.cu"
        path.write_text(FAMILY.render(c))
        built = ops.compile_kernel(path, sha256_text(path.read_text()), ARCH, cache_dir)
        if isinstance(built, ops.Failure):
            sys.exit(f"host_overhead: {built.reason}")
        return path

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # nvcc is single-threaded
        return dict(zip(configs, pool.map(build, configs), strict=True))


def measure(sources: dict[Sm90Config, Path], cache_dir: Path) -> list[Row]:
    rows = []
    for params, shapes in PAIRS:
        base = FAMILY.make(params)
        loaded = {c: load(sources[c], cache_dir) for c in (base, replace(base, host_cache=True))}
        for m, n, k in shapes:
            sets = [(torch.randn(m, k, device="cuda", dtype=torch.float16),
                     torch.randn(n, k, device="cuda", dtype=torch.float16),
                     torch.empty(m, n, device="cuda", dtype=torch.float16)) for _ in range(2)]
            for c, kernel in loaded.items():
                what = f"{config_name(FAMILY, c)} on {m}x{n}x{k}"
                call = kernel_call(kernel, sets, what)
                check(call, sets, what)
                rows.append(Row(config_name(FAMILY, base), c.host_cache, f"{m}x{n}x{k}", *timings(call)))
            rows.append(Row(config_name(FAMILY, base), None, f"{m}x{n}x{k}", *timings(matmul_call(sets))))
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
    ws_bytes = int(kernel.workspace_bytes(m, n, k))
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
    for r in rows:
        who = "torch.matmul" if r.host_cache is None else f"host_cache={int(r.host_cache)}"
        out.append(f"| {r.config.removeprefix('sm90_wgmma-')} | {r.shape} | {who} | {r.queued_us:.2f} | "
                   f"{r.sync_us:.2f} | {r.moving_us:.2f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile-only", action="store_true", help="build the twins into the cache and stop (no GPU)")
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="the compile cache (default: the evaluator's, which gpu_check.sh fills from .precompiled)")
    ap.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args()
    cache_dir = args.cache_dir or default_cache_dir()
    with tempfile.TemporaryDirectory() as source_dir:
        sources = compile_all(cache_dir, Path(source_dir))
        if args.compile_only:
            print(f"{len(sources)} libraries in {cache_dir}")
            return
        rows = measure(sources, cache_dir)
    print(markdown(rows))
    if args.out:
        args.out.write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
