"""How well the fill strategy's wave model (cudal2.tune_search.estimate_us) ranks measured kernels: CPU only, from a
result store.

    python3 benchmarks/wave_model_check.py [--db benchmarks/stores/h200_grid.sqlite.gz] [--shapes data/grid.csv]
                                           [--gpu h200] [--sms 132] [--search] [--until UNIX_SECONDS]

For every shape of the set and every family with decomposition parameters, the configs of that family measured on
the shape (offline, ok) are ranked by the model's estimate of their tiling and by their measured median. Printed:
how often the model's first pick is within 3% of the measured best, how often the measured best is among the model's
first 3 picks (what fill proposes per shape and family), the mean Spearman rank correlation, and for reference the
same hit rates of picking at random. `--search` also tries a grid of the model's constants (per-tile cost, L2
bandwidth, split cost) and prints the best few by top-3 hit rate, so a change to the constants rests on the store.

The model sees only the tiling (tile, K block, splits, stream-K), not cluster shape, swizzle or pingpong versus
cooperative, so configs that differ only there tie; ties are broken by measured-independent name order.
"""

from __future__ import annotations

import argparse
import itertools
import math
import shutil
import sqlite3
import sys
import tempfile
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from cudal2 import tune, tune_search
from cudal2.kernels.family import Tiling
from cudal2.sandbox import store_pack
from cudal2.sandbox.store import GpuLabelError, ResultStore, StoreError, resolve_gpu_label
from cudal2.sandbox.types import Acc, Task
from cudal2.tune_log import TuneLog

ROOT = Path(__file__).resolve().parent.parent
NEAR_BEST = 1.03  # a pick "hits" when its measured time is within 3% of the shape's measured best
MIN_CONFIGS = 3  # shape-family groups with fewer measured configs say nothing about ranking


@dataclass(frozen=True)
class Group:
    """The measured configs of one family on one shape: (tiling, name, median microseconds)."""

    task: Task
    family: str
    rows: tuple[tuple[Tiling, str, float], ...]


def load_groups(db: Path, shapes: list[Task], gpu: str | None, family_names: Sequence[str] = ()) -> list[Group]:
    """The (shape, family) groups of `family_names` (default: every family with decomposition parameters)."""
    families = [f for f in tune.FAMILIES if f.decomposition and (not family_names or f.name in family_names)]
    groups = []
    with ResultStore(db) as store, TuneLog(store) as log:
        label = resolve_gpu_label(store.ok_gpus(), gpu, None)
        for task in shapes:
            by_family: dict[str, list[tuple[Tiling, str, float]]] = {}
            for cand, us, _current in tune.stored_candidates(store, log, task, label, families, limit=1000):
                by_family.setdefault(cand.family.name, []).append((cand.family.tiling(cand.cfg), cand.name, us))
            groups += [Group(task, name, tuple(rows)) for name, rows in by_family.items() if len(rows) >= MIN_CONFIGS]
    return groups


def score(groups: list[Group], sms: int) -> dict[str, float]:
    top1 = top3 = rand1 = rand3 = rho = 0.0
    for g in groups:
        best = min(us for _, _, us in g.rows)
        picks = sorted(g.rows, key=lambda r: (tune_search.estimate_us(r[0], g.task, sms), r[1]))
        near = [us <= best * NEAR_BEST for _, _, us in picks]
        top1 += near[0]
        top3 += any(near[:3])
        rand1 += sum(near) / len(near)
        # P(at least one near-best among 3 drawn at random without replacement)
        n, hits = len(near), sum(near)
        rand3 += 1 - math.comb(n - hits, min(3, n)) / math.comb(n, min(3, n))
        rho += _spearman([i for i, _ in enumerate(picks)], _ranks([us for _, _, us in picks]))
    n = len(groups)
    return {"groups": n, "top1": top1 / n, "top3": top3 / n, "random_top1": rand1 / n, "random_top3": rand3 / n,
            "spearman": rho / n}


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    for rank, i in enumerate(order):
        ranks[i] = float(rank)
    return ranks


def _spearman(a: list[float], b: list[float]) -> float:
    n = len(a)
    d2 = sum((x - y) ** 2 for x, y in zip(a, b, strict=True))
    return 1 - 6 * d2 / (n * (n * n - 1))


def open_db(path: Path, tmp: Path, until: float | None = None) -> Path:
    """A store to read: `path` itself, or a copy in `tmp` (a committed NAME.sqlite.gz: its base and deltas assembled,
    `cudal2.sandbox.store_pack`) that keeps only the results measured up to `until` (Unix seconds). Why a cut-off:
    fill measures the configs the model ranks first, so results measured after a fill are chosen by the model under
    test and flatter any later score; a claim about the model names the store as it was when the claim was made.
    Raises StoreError (one line) on a file that is not a result store."""
    db = store_pack.materialise(path, tmp)
    if until is None:
        return db
    if db == path:  # never cut the caller's own file
        db = tmp / path.name
        shutil.copyfile(path, db)
    with closing(sqlite3.connect(db)) as conn, conn:  # closed, and committed first
        conn.execute("DELETE FROM results WHERE created > ?", (until,))
    return db


def store_arguments(ap: argparse.ArgumentParser) -> None:
    """The arguments that pick the measurements (shared with transfer_check.py)."""
    ap.add_argument("--db", default=str(ROOT / "benchmarks/stores/h200_grid.sqlite.gz"))
    ap.add_argument("--shapes", default=str(ROOT / "data/grid.csv"))
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--until", type=float, default=None,
                    help="only results measured up to this time (Unix seconds): the store as it was then")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    store_arguments(ap)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--search", action="store_true", help="also try a grid of the model's constants")
    ap.add_argument("--family", action="append", default=[], help="score only this family (repeatable; default "
                    "every family with decomposition parameters)")
    args = ap.parse_args(argv)
    try:
        shapes = tune.load_tasks(args.shapes, [], Acc.FP32.value)
        with tempfile.TemporaryDirectory() as tmp:
            groups = load_groups(open_db(Path(args.db), Path(tmp), args.until), shapes, args.gpu, args.family)
    except (tune.TuneInputError, GpuLabelError, StoreError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not groups:
        print(f"error: no shape has {MIN_CONFIGS}+ measured configs of one family in {args.db}", file=sys.stderr)
        return 2
    print("| constants | groups | model top-1 near best | model top-3 has it | random top-1 | random top-3 | "
          "Spearman |\n|---|---|---|---|---|---|---|")
    print(_row("as committed", score(groups, args.sms)))
    if args.search:
        results = []
        for tile_us, l2, split_us in itertools.product((1.0, 2.0, 4.0, 8.0), (6e6, 10e6, 14e6), (1.0, 3.0, 5.0, 8.0)):
            tune_search.TILE_US, tune_search.L2_BYTES_PER_US, tune_search.SPLIT_US = tile_us, l2, split_us
            results.append((score(groups, args.sms), f"TILE_US={tile_us} L2={l2:.0e} SPLIT_US={split_us}"))
        for s, name in sorted(results, key=lambda r: (-r[0]["top3"], -r[0]["spearman"]))[:5]:
            print(_row(name, s))
    return 0


def _row(name: str, s: dict[str, float]) -> str:
    return (f"| {name} | {s['groups']:.0f} | {s['top1']:.0%} | {s['top3']:.0%} | {s['random_top1']:.0%} | "
            f"{s['random_top3']:.0%} | {s['spearman']:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
