"""What sm90's host_cache twins take off the chosen kernels' calls in server or wallclock mode: CPU only, from a store.

    python3 benchmarks/twins_gain.py [--db benchmarks/stores/h200_grid.sqlite.gz] [--shapes data/grid.csv]
                                     [--gpu h200] [--mode wallclock]

Per shape of the set: the kernel the offline search chose (the one `cudal2 report --mode MODE` shows) and, when
`cudal2 remeasure --mode MODE --host-cache-twins` has timed it, its host_cache twin (same config and device code;
the entry point keeps CUTLASS's parameters between calls with the same pointers and shape). Each figure is a
speedup over the cuBLAS baseline timed in its own evaluation, so the two share no baseline run. Printed: how many
shapes have a twin figure, how often the twin is faster, the median time it saves per call (us), and the set's
geomean vs cuBLAS as `report` shows it and with every measured twin in its kernel's place (what `report
--host-cache-twins` shows). The twin replaces its kernel whenever it was measured, faster or not: taking the faster
of the two figures would be a best-of-2 on noise.
By MNK bucket as the report's targets cut it (small < 2^27, large >= 2^36).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cudal2.report import geomean, measured_twin
from cudal2.sandbox.store import GpuLabelError, ResultStore, StoreError, resolve_gpu_label
from cudal2.sandbox.types import Mode, ShapeResult, Status, Task
from cudal2.tune import TuneInputError, load_tasks
from cudal2.tune_log import TuneLog

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wave_model_check import open_db, store_arguments  # noqa: E402  (a sibling script)

SMALL_MNK, LARGE_MNK = 2**27, 2**36  # the target buckets


@dataclass(frozen=True)
class Pair:
    """One shape: the chosen kernel's figure in the mode and, when measured, its twin's."""

    task: Task
    kernel: ShapeResult
    twin: ShapeResult | None

    @property
    def deployed(self) -> ShapeResult:
        return self.twin or self.kernel


def _ok(result: ShapeResult | None) -> ShapeResult | None:
    return result if result is not None and result.status is Status.OK and "cublas" in result.timings else None


def pairs(store: ResultStore, tasks: list[Task], gpu: str, mode: Mode) -> tuple[list[Pair], int]:
    """The shapes whose chosen kernel has an ok figure in `mode` (with its twin's, where there is one), and how many
    shapes of `tasks` lack that figure."""
    out, missing = [], 0
    with TuneLog(store) as log:
        for task in tasks:
            chosen = store.chosen(task, gpu)
            kernel = _ok(store.get_result(chosen[0][0], task, gpu, mode)) if chosen else None
            if kernel is None:
                missing += 1
                continue
            twin = measured_twin(store, log, chosen[0][0], task, gpu, mode)
            out.append(Pair(task, kernel, _ok(twin[1]) if twin else None))
    return out, missing


def speedup(result: ShapeResult) -> float:
    return result.speedups()["cublas"]


def summary(name: str, group: list[Pair]) -> str:
    twinned = [p for p in group if p.twin is not None]
    if not group:
        return f"| {name} | 0 | 0 | | | | |"
    saved = [p.kernel.timings["candidate"].median_us - p.twin.timings["candidate"].median_us for p in twinned]
    faster = sum(s > 0 for s in saved)
    return (f"| {name} | {len(group)} | {len(twinned)} | {faster}/{len(twinned)} | "
            f"{statistics.median(saved) if saved else 0.0:.2f} | "
            f"{geomean([speedup(p.kernel) for p in group]):.3f}x | {geomean([speedup(p.deployed) for p in group]):.3f}x |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    store_arguments(ap)
    ap.add_argument("--mode", default=Mode.WALLCLOCK.value, choices=[Mode.SERVER.value, Mode.WALLCLOCK.value])
    args = ap.parse_args(argv)
    mode = Mode(args.mode)
    if not Path(args.db).is_file():
        print(f"twins_gain.py: {args.db}: no result store there", file=sys.stderr)
        return 2
    try:
        tasks = list(load_tasks(args.shapes, [], "fp32"))
        with tempfile.TemporaryDirectory() as tmp, ResultStore(open_db(Path(args.db), Path(tmp), args.until)) as s:
            gpu = resolve_gpu_label(s.ok_gpus(), args.gpu, None)
            found, missing = pairs(s, tasks, gpu, mode)
    except (TuneInputError, StoreError, GpuLabelError, OSError) as e:
        print(f"twins_gain.py: {e}", file=sys.stderr)
        return 2
    print(f"{gpu}, {mode.value} mode, {args.shapes}: {len(found)} shapes with the chosen kernel timed in this mode "
          f"({missing} without)\n")
    print("| MNK | shapes | twin timed | twin faster | median us saved | geomean vs cuBLAS, as reported | with twins |")
    print("|---|---|---|---|---|---|---|")
    buckets = (("all", 0, 2**64), ("small, < 2^27", 0, SMALL_MNK), ("2^27 - 2^36", SMALL_MNK, LARGE_MNK),
               ("large, >= 2^36", LARGE_MNK, 2**64))
    for name, low, high in buckets:
        print(summary(name, [p for p in found if low <= p.task.m * p.task.n * p.task.k < high]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
