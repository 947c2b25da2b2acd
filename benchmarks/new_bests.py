"""Which tuning runs set new per-shape bests in a result store, and with which kinds of kernel: CPU only.

    python3 benchmarks/new_bests.py --since UNIX_SECONDS [--db benchmarks/stores/h200_grid.sqlite.gz] [--gpu h200]
                                    [--shapes CSV] [--gap 45] [--by PARAM ...]

A result is a new best when its offline median beats every earlier verified offline result of its shape (fp32 and
fp16 accumulation apart). The store does not record which `cudal2 tune --strategy` proposed a result, only when it
was measured: the verified offline results after --since, in time order, are cut into runs wherever more than --gap
seconds pass without one (within a `cudal2 tune` round results came at most ~35 s apart on the H200 while later
configs compiled; between rounds the next plan, the reports and the next device call took a minute or more). The
cut is a heuristic: read the runs next to the device log's own "N new per-shape bests" lines. Per kind of kernel
(its family, and sm90's schedule) the same counts say which kind the new winners were; --by PARAM (repeatable) splits
the kinds further by that config parameter's value (e.g. --by ctas_per_sm; a config stored before its family gained
the parameter counts with the parameter's default, as it was rendered; a family without it keeps its kind). --shapes
limits the count to a shape set's shapes (default: every stored shape).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
from collections import defaultdict
from contextlib import closing
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from pathlib import Path

from cudal2.data import BadShapeFile, load_shapes
from cudal2.kernels.family import BadConfig, config_params
from cudal2.sandbox.store import GpuLabelError, ResultStore, StoreError, resolve_gpu_label
from cudal2.tune import FAMILIES

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wave_model_check import open_db, store_arguments  # noqa: E402  (a sibling script)

Shape = tuple[int, int, int, str]  # M, N, K, acc
FAMILY_BY_NAME = {f.name: f for f in FAMILIES}


@dataclass(frozen=True)
class Measured:
    """One verified offline result after the cut."""

    shape: Shape
    source_hash: str
    kind: str  # "sm90_wgmma basic", "sm80_mma", ... ("?" for a source the tuner did not generate)
    us: float  # the kernel's median, microseconds
    created: float  # Unix seconds


@dataclass
class Tally:
    evaluations: int = 0
    configs: set[str] = field(default_factory=set)  # source hashes
    new_bests: int = 0
    first: float = 0.0
    last: float = 0.0

    def add(self, m: Measured, new_best: bool) -> None:
        self.first = self.first or m.created
        self.last = m.created
        self.evaluations += 1
        self.configs.add(m.source_hash)
        self.new_bests += new_best


def _params(family: str, params_json: str | None) -> dict[str, object]:
    """A stored config's parameters, with the default of every one its family gained after it was stored (the JSON
    lacks them); as stored for a family this code no longer has, or a config outside its family's space today (as
    tune.stored_candidates and carry skip those, make() refuses them)."""
    stored = json.loads(params_json or "{}")
    known = FAMILY_BY_NAME.get(family)
    if known is None:
        return stored
    try:
        cfg = known.make(stored)
    except BadConfig:
        return stored
    return {k: v.value if isinstance(v, Enum) else v for k, v in config_params(cfg).items()}


@cache  # once per stored config, not per result
def _kind(family: str | None, params_json: str | None, by: tuple[str, ...] = ()) -> str:
    """'family[ schedule][ PARAM=value ...]' for the parameters of `by` the config has."""
    if family is None:
        return "?"
    params = _params(family, params_json)
    words = [family] + ([str(params["schedule"])] if params.get("schedule") else [])
    return " ".join(words + [f"{name}={params[name]}" for name in by if name in params])


def load(db: Path, gpu: str, since: float, by: tuple[str, ...] = ()) -> tuple[dict[Shape, float], list[Measured]]:
    """The fastest verified offline median of every shape before `since`, and every verified offline result from
    then on, in time order; their kinds split by the parameters of `by`."""
    query = ("SELECT r.m, r.n, r.k, r.acc, r.cand_median_us, r.created, r.source_hash, t.family, t.params_json"
             " FROM results r LEFT JOIN tune_configs t USING (source_hash)"
             " WHERE r.gpu = ? AND r.mode = 'offline' AND r.status = 'ok' AND r.cand_median_us IS NOT NULL")
    best: dict[Shape, float] = {}
    after = []
    with closing(sqlite3.connect(db)) as conn:
        for m, n, k, acc, us, created, source_hash, family, params in conn.execute(query + " ORDER BY r.created, r.id",
                                                                                  (gpu,)):
            shape = (m, n, k, acc)
            if created < since:
                best[shape] = min(us, best.get(shape, us))
            else:
                after.append(Measured(shape, source_hash, _kind(family, params, by), us, created))
    return best, after


def tally(best_before: dict[Shape, float], results: list[Measured], gap: float) -> tuple[list[Tally], dict[str, Tally]]:
    """Per run (cut at gaps of more than `gap` seconds) and per kind: evaluations, configs and new bests."""
    best = dict(best_before)
    runs: list[Tally] = []
    kinds: dict[str, Tally] = defaultdict(Tally)
    for m in results:
        if not runs or m.created - runs[-1].last > gap:
            runs.append(Tally())
        new_best = m.us < best.get(m.shape, float("inf"))
        if new_best:
            best[m.shape] = m.us
        runs[-1].add(m, new_best)
        kinds[m.kind].add(m, new_best)
    return runs, dict(kinds)


def table(runs: list[Tally], kinds: dict[str, Tally]) -> str:
    def row(label: str, t: Tally) -> str:
        return (f"| {label} | {t.evaluations} | {len(t.configs)} | {t.new_bests} | "
                f"{t.new_bests / t.evaluations:.3f} |")

    head = ["| {} | evaluations | configs | new bests | new bests per evaluation |", "|---|---|---|---|---|"]
    lines = [head[0].format("run (start +seconds, length)"), head[1]]
    start = runs[0].first if runs else 0.0
    lines += [row(f"{i + 1} (+{t.first - start:.0f} s, {t.last - t.first:.0f} s)", t) for i, t in enumerate(runs)]
    lines += ["", head[0].format("kind"), head[1]]
    lines += [row(kind, t) for kind, t in sorted(kinds.items(), key=lambda kt: -kt[1].new_bests)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    store_arguments(ap)
    ap.set_defaults(shapes=None)  # every stored shape, unless a set is named
    ap.add_argument("--since", type=float, required=True, help="Unix seconds: the results from then on are tallied")
    ap.add_argument("--gap", type=float, default=45.0, help="seconds without a result that end a run")
    ap.add_argument("--by", action="append", default=[], metavar="PARAM",
                    help="also split the kinds by this config parameter's value (repeatable), e.g. ctas_per_sm")
    args = ap.parse_args(argv)
    db_path = Path(args.db)
    if not db_path.is_file():
        print(f"new_bests: no store at {db_path}", file=sys.stderr)
        return 2
    keep = None  # (M, N, K) of the named shape set, read before the store is unzipped
    if args.shapes is not None:
        try:
            keep = {(r.M, r.N, r.K) for r in load_shapes(args.shapes)}
        except BadShapeFile as e:
            print(f"new_bests: {e}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory() as tmp:
        try:
            db = open_db(db_path, Path(tmp), args.until)
            with ResultStore(db) as store:
                gpu = resolve_gpu_label(store.ok_gpus(), args.gpu, None)
        except (GpuLabelError, StoreError) as e:
            print(f"new_bests: {e}", file=sys.stderr)
            return 2
        before, after = load(db, gpu, args.since, tuple(args.by))
    if keep is not None:
        after = [m for m in after if m.shape[:3] in keep]
    runs, kinds = tally(before, after, args.gap)
    print(f"{len(after)} verified offline results on {gpu} from {args.since:.0f} on ({len(before)} shapes measured "
          f"before)\n")
    print(table(runs, kinds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
