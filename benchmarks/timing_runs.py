"""What the benchmarks that time a few sources again and again share (fence_ab.py, paired_noise.py, tiny_floor.py,
long_k_lean.py): their timing flags, the evaluator those flags ask for, every source compiled before anything is
timed, the lines that say which sources cannot be timed, and the rotated order of the timed evaluations."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from cudal2.sandbox.evaluator import EvalOptions, Evaluator, Prepared
from cudal2.sandbox.types import ShapeResult, Status, Task

K = TypeVar("K", bound=Hashable)


def add_timing_flags(ap: argparse.ArgumentParser, *, what: str, repeats: int, target_ms: float) -> None:
    """--repeats, --target-ms, --json and --compile-only, with `what` naming the thing timed in their help."""
    ap.add_argument("--repeats", type=int, default=repeats, help=f"fresh evaluations of each {what}")
    ap.add_argument("--target-ms", type=float, default=target_ms, help=f"timing budget per {what} per evaluation, ms")
    ap.add_argument("--json", type=Path, default=None, help="write every timing here")
    ap.add_argument("--compile-only", action="store_true", help=f"compile every {what} for sm_90a; time nothing")


def evaluator_for(args: argparse.Namespace, baselines: bool) -> Evaluator:
    """Fresh evaluations (nothing answered from a store) on the flags' budget, the baselines timed beside each source
    where `baselines`; with --compile-only the sources are only compiled, for sm_90a."""
    return Evaluator(EvalOptions(fresh=True, baselines=baselines and not args.compile_only, target_ms=args.target_ms,
                                 compile_only=args.compile_only, arch="sm_90a" if args.compile_only else None))


def prepare_all(evaluator: Evaluator, jobs: Mapping[K, tuple[str, Sequence[Task]]]) -> dict[K, Prepared]:
    """Each (source, tasks) through the CPU stages (static rules, compile, link check) at once on every core: they touch
    neither the GPU nor the store."""
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return dict(zip(jobs, pool.map(lambda job: evaluator.prepare(*job), jobs.values()), strict=True))


@dataclass(frozen=True)
class Sorted(Generic[K]):
    """prepare_all's sources split in two: those the GPU can time, and why each other one cannot."""

    runnable: dict[K, Prepared]
    stopped: dict[K, str]  # key -> "status: reason", the reason cut to 200 characters


def sort_prepared(prepared: Mapping[K, Prepared], *, what: str, compile_only: bool,
                  name: Callable[[K], str] = str) -> Sorted[K]:
    """Splits `prepared` and prints what it found. With --compile-only nothing is runnable: "N `what`: M compiled",
    then each source that did not compile. Otherwise one "not runnable" line per source whose outcome the CPU stages
    already decided (a static rule, a compile error). `name` labels a key in those lines."""
    expected = Status.COMPILED if compile_only else None  # None: no outcome yet, the GPU decides
    stopped: dict[K, str] = {}
    for key, p in prepared.items():
        shape = p.final.shapes[0] if p.final is not None else None
        if (shape.status if shape is not None else None) is not expected:
            stopped[key] = f"{shape.status.value}: {shape.reason[:200]}" if shape is not None else "not compiled"
    if compile_only:
        print(f"{len(prepared)} {what}: {len(prepared) - len(stopped)} compiled",
              *(f"{name(k)}: {why}" for k, why in stopped.items()), sep="\n")
    else:
        for k, why in stopped.items():
            print(f"not runnable: {name(k)}: {why}")
    return Sorted({k: p for k, p in prepared.items() if p.final is None and k not in stopped}, stopped)


def rotated_runs(evaluator: Evaluator, runnable: Mapping[K, Prepared],
                 repeats: int) -> Iterator[tuple[K, int, ShapeResult]]:
    """Each runnable source evaluated afresh `repeats` times, every source once per repeat, the order rotated by one each
    repeat (so no source always goes first on a GPU that drifts): (key, repeat, result) per shape it runs."""
    keys = list(runnable)
    for repeat in range(repeats):
        for key in keys[repeat % len(keys):] + keys[:repeat % len(keys)]:
            for shape in evaluator.run(runnable[key]).shapes:
                yield key, repeat, shape
