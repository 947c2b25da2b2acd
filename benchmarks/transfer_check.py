"""Leave-one-out check of `cudal2 tune --strategy transfer` on a result store: CPU only.

    python3 benchmarks/transfer_check.py [--db benchmarks/stores/h200_grid.sqlite.gz] [--shapes data/grid.csv]
                                         [--gpu h200] [--settings 2x2,4x1,6x1]

For each shape of the set, TransferSearch plans from every other stored shape (as if this one had never been
measured) with TRANSFER_NEIGHBOURS x TRANSFER_TOP set to each `--settings` entry (neighbours x configs each). Printed
per setting: configs picked per shape (the device cost of a transfer run), the share of picks the store has measured
on that shape, and how often a pick is near-best there (within 3% of the fastest config measured on it).

The store's measurements were themselves chosen by earlier transfers (2x2), evolution and fill, so a setting's
unmeasured picks are unknowns, not misses: compare settings at equal picks per shape.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

from cudal2 import tune, tune_search
from cudal2.sandbox.store import GpuLabelError, ResultStore, StoreError, resolve_gpu_label
from cudal2.sandbox.types import Acc, Task
from cudal2.tune_log import TuneLog
from cudal2.tune_search import ELITE, Candidate, TransferSearch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wave_model_check import NEAR_BEST, open_db, store_arguments  # noqa: E402  (a sibling script)


def load(db: Path, gpu: str | None) -> dict[Task, dict[str, tuple[Candidate, float]]]:
    """Every stored shape -> config name -> (candidate, fastest offline median, microseconds)."""
    out: dict[Task, dict[str, tuple[Candidate, float]]] = {}
    with ResultStore(db) as store, TuneLog(store) as log:
        label = resolve_gpu_label(store.ok_gpus(), gpu, None)
        for task in store.ok_shapes(Acc.FP32, label):
            for cand, us, _current in tune.stored_candidates(store, log, task, label, tune.FAMILIES, limit=10_000):
                out.setdefault(task, {}).setdefault(cand.name, (cand, us))
    return out


def load_copy(db: Path, gpu: str | None, until: float | None) -> dict[Task, dict[str, tuple[Candidate, float]]]:
    """load() of the store at `db` as it was up to `until` (Unix seconds; None: all), read from a temporary copy."""
    with tempfile.TemporaryDirectory() as tmp:
        return load(open_db(db, Path(tmp), until), gpu)


def check(measured: dict[Task, dict[str, tuple[Candidate, float]]], shapes: list[Task], neighbours: int,
          top: int) -> dict[str, float]:
    tune_search.TRANSFER_NEIGHBOURS, tune_search.TRANSFER_TOP = neighbours, top
    search = TransferSearch(tune.FAMILIES, random.Random(0), ())
    for task, configs in measured.items():
        for cand, us in sorted(configs.values(), key=lambda cu: (cu[1], cu[0].name))[:ELITE]:
            search.observe(cand, task, us)
    picks = known = hits = 0
    targets = [s for s in shapes if s in measured]
    for target in targets:
        # The plan for this one target, from every other shape's elite: its own is set aside meanwhile.
        own = search.elites.pop(target)
        search.targets, search._plan = (target,), None
        names = [p.candidate.name for p in iter(search.propose, None)]
        search.elites[target] = own
        best = min(us for _, us in measured[target].values())
        picks += len(names)
        known += sum(n in measured[target] for n in names)
        hits += any(measured[target].get(n, (None, float("inf")))[1] <= best * NEAR_BEST for n in names)
    n = len(targets)
    return {"shapes": n, "picks": picks / n, "measured": known / max(picks, 1), "hit": hits / n}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    store_arguments(ap)
    ap.add_argument("--settings", default="2x2,3x2,4x1,6x1,8x1", help="neighbours x configs each, comma-separated")
    args = ap.parse_args(argv)
    try:
        settings = [tuple(int(x) for x in s.split("x")) for s in args.settings.split(",")]
        if any(len(s) != 2 or min(s) < 1 for s in settings):
            raise ValueError
    except ValueError:
        print(f"error: --settings wants NxT entries like 2x2,6x1, got {args.settings!r}", file=sys.stderr)
        return 2
    try:
        shapes = tune.load_tasks(args.shapes, [], Acc.FP32.value)
        measured = load_copy(Path(args.db), args.gpu, args.until)
    except (tune.TuneInputError, GpuLabelError, StoreError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("| neighbours x configs | shapes | picks per shape | picks measured there | a pick near-best |\n"
          "|---|---|---|---|---|")
    for neighbours, top in settings:
        s = check(measured, shapes, neighbours, top)
        print(f"| {neighbours} x {top} | {s['shapes']:.0f} | {s['picks']:.1f} | {s['measured']:.0%} | {s['hit']:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
