"""What one config parameter is worth, from a store: configs that differ only in it, timed on the same shapes. CPU only.

    python3 benchmarks/param_gain.py --param push [--value 1] [--base 0] [--family small]
        [--db benchmarks/stores/h200_grid.sqlite.gz] [--shapes data/grid.csv] [--gpu h200] [--until T]
        [--max-log2-mnk E] [--min-k K]

Each config the tuner recorded (the store's tune_configs) whose parameter PARAM is VALUE is paired with its twin: the
same family and config with PARAM = BASE (default: the family's default config's value), where the store has that
too. On each shape of the set where both have a verified offline median on the GPU (each source's newest offline
result there), the gain is the twin's median over the config's (> 1: VALUE is faster). Printed per pair: its shapes,
the geomean and range of the gain; then over every pair and shape; then per shape the fastest config of each side
(fastest twin / fastest config: what VALUE adds to the best the pairs offer). A value is written as config names
print it (push: 1 or 0; reduce: push, cluster, ...).

The two figures of a pair come from separate evaluations, perhaps separate device calls: a `--strategy given` list
that names both (benchmarks/given/long_k_push.txt) times them in one call, where drift between them is small. Another
GPU's rows kept apart from the committed store (benchmarks/stores/h100_*.sqlite.gz) are read from a store assembled
with them: `cudal2 store assemble ... --out g.sqlite --also FILE`, then `--db g.sqlite --gpu h100`.
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import sys
import tempfile
from contextlib import closing
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from cudal2.kernels.family import BadConfig, KernelFamily, config_name
from cudal2.sandbox.evaluator import EVALUATOR_VERSION
from cudal2.sandbox.store import GpuLabelError, ResultStore, StoreError, resolve_gpu_label
from cudal2.sandbox.types import Task
from cudal2.tune import FAMILIES, TuneInputError, load_tasks

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wave_model_check import open_db, store_arguments  # noqa: E402  (a sibling script)


class ParamError(ValueError):
    """A parameter or value no searched family has (one line)."""


@dataclass(frozen=True)
class Pair:
    """A config with the parameter at the value and its twin at the base: their offline medians (us) on the shapes
    both have."""

    config: str
    twin: str
    mine: dict[Task, float]
    theirs: dict[Task, float]

    @property
    def gains(self) -> dict[Task, float]:
        """Per shape, the twin's median over the config's (> 1: the config is faster)."""
        return {t: self.theirs[t] / us for t, us in self.mine.items()}


def parse_value(family: KernelFamily, param: str, text: str) -> Any:
    """The value of `param` in `family`'s space that `text` names, as config names print it (1/0 for a flag, an
    enum's value, a number); ParamError when none does."""
    values = family.space().get(param)
    if values is None:
        raise ParamError(f"{family.name} has no parameter {param!r}")
    for v in values:
        names = {str(v), spelled(v)} | ({"true"} if v is True else {"false"} if v is False else set())
        if text.lower() in {s.lower() for s in names}:
            return v
    shown = ", ".join(spelled(v) for v in values)
    raise ParamError(f"{family.name}: {param}={text!r} is not one of its values ({shown})")


def spelled(value: Any) -> str:
    """A parameter value as config names print it."""
    return str(value.value if isinstance(value, Enum) else int(value) if isinstance(value, bool) else value)


def recorded_configs(db: Path, family: KernelFamily) -> dict[str, tuple[str, Any]]:
    """name -> (source hash, config) of every config of `family` the tuner recorded in the store (a stored parameter
    set no longer valid in the family is left out)."""
    out: dict[str, tuple[str, Any]] = {}
    with closing(sqlite3.connect(db)) as conn:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'tune_configs'").fetchone():
            return out
        for source_hash, params in conn.execute(
                "SELECT source_hash, params_json FROM tune_configs WHERE family = ?", (family.name,)):
            try:
                cfg = family.make(json.loads(params))
            except (BadConfig, ValueError, TypeError):
                continue
            out[config_name(family, cfg)] = (source_hash, cfg)
    return out


def offline_medians(db: Path, source_hash: str, gpu: str) -> dict[Task, float]:
    """Task -> median us of the source's newest offline result on `gpu` (current evaluator), where that one is ok."""
    newest: dict[Task, tuple[str, float | None]] = {}
    with closing(sqlite3.connect(db)) as conn:
        for m, n, k, acc, status, us in conn.execute(
                "SELECT m, n, k, acc, status, cand_median_us FROM results WHERE source_hash = ? AND gpu = ? AND "
                "mode = 'offline' AND evaluator_version = ? ORDER BY id", (source_hash, gpu, EVALUATOR_VERSION)):
            newest[Task.parse(f"{m}_{n}_{k}", acc)] = (status, us)
    return {t: us for t, (status, us) in newest.items() if status == "ok" and us}


def pairs_for(db: Path, gpu: str, family: KernelFamily, param: str, value: Any, base: Any,
              tasks: set[Task]) -> list[Pair]:
    """Every recorded config with `param` = `value` whose twin (`param` = `base`) is recorded too, with the gain on
    each shape of `tasks` where both have a figure."""
    configs = recorded_configs(db, family)
    out = []
    for name, (source_hash, cfg) in sorted(configs.items()):
        if getattr(cfg, param) != value:
            continue
        twin_name = config_name(family, replace(cfg, **{param: base}))
        if twin_name not in configs:
            continue
        mine, theirs = offline_medians(db, source_hash, gpu), offline_medians(db, configs[twin_name][0], gpu)
        shared = mine.keys() & theirs.keys() & tasks
        if shared:
            out.append(Pair(name, twin_name, {t: mine[t] for t in shared}, {t: theirs[t] for t in shared}))
    return out


def why_unpaired(db: Path, family: KernelFamily, param: str, value: Any, base: Any) -> str:
    """Why `family` has no pair, where the tune_configs rows tell: no config with the value recorded, or none of their
    twins recorded (a delta from a device call records only the configs that call added); "" where both are."""
    configs = recorded_configs(db, family)
    with_value = [cfg for _, cfg in configs.values() if getattr(cfg, param) == value]
    if not with_value:
        return f"{family.name}: none with it is recorded"
    if not any(config_name(family, replace(cfg, **{param: base})) in configs for cfg in with_value):
        return (f"{family.name}: {len(with_value)} with it recorded, none of their twins ({param} = {spelled(base)}); "
                "a device call's delta records only the configs it added: read it assembled with its committed store "
                "(cudal2 store assemble STORE --also DELTA --out DB)")
    return ""


def geomean(values: list[float]) -> float:
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


def summary(pairs: list[Pair], label: str) -> str:
    """The per-pair table, the pooled figure, and best against best per shape."""
    lines = [f"| config ({label}) | shapes | twin / config, geomean | range | config faster |", "|---|---|---|---|---|"]
    for p in pairs:
        g = list(p.gains.values())
        lines.append(f"| {p.config} | {len(g)} | {geomean(g):.3f} | {min(g):.2f}-{max(g):.2f} | "
                     f"{sum(x > 1 for x in g)} |")
    pooled = [x for p in pairs for x in p.gains.values()]
    lines.append(f"\nall {len(pairs)} pairs, {len(pooled)} (pair, shape) figures: geomean {geomean(pooled):.3f}, "
                 f"the config faster on {sum(x > 1 for x in pooled)}")
    return "\n".join(lines)


def best_against_best(pairs: list[Pair]) -> str:
    """Per shape that a pair covers: the fastest twin's median over the fastest config's (both sides' configs only)."""
    best: dict[Task, list[float]] = {}
    for p in pairs:
        for t, us in p.mine.items():
            side = best.setdefault(t, [math.inf, math.inf])
            side[0], side[1] = min(side[0], us), min(side[1], p.theirs[t])
    ratios = [twin / mine for mine, twin in best.values()]
    return (f"per shape, fastest twin / fastest config over {len(ratios)} shapes: geomean {geomean(ratios):.3f}, "
            f"the config side faster on {sum(r > 1 for r in ratios)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    store_arguments(ap)
    ap.add_argument("--param", required=True, help="the config parameter, e.g. push, reduce, stage_c")
    ap.add_argument("--value", default="1", help="its value under test, as config names print it (default 1: on)")
    ap.add_argument("--base", default=None, help="the twins' value (default: the family default config's)")
    ap.add_argument("--family", default=None, help="only this family (default: every family with the parameter)")
    ap.add_argument("--max-log2-mnk", type=int, default=64, help="only shapes with MNK < 2^this")
    ap.add_argument("--min-k", type=int, default=1, help="only shapes with K >= this")
    args = ap.parse_args(argv)
    families = [f for f in FAMILIES if (args.family in (None, f.name)) and args.param in f.space()]
    try:
        if not families:
            raise ParamError(f"no family{' ' + args.family if args.family else ''} has a parameter {args.param!r}")
        tasks = {t for t in load_tasks(args.shapes, [], "fp32")
                 if t.m * t.n * t.k < 2**args.max_log2_mnk and t.k >= args.min_k}
        with tempfile.TemporaryDirectory() as tmp:
            db = open_db(Path(args.db), Path(tmp), args.until)
            with ResultStore(db) as store:
                gpu = resolve_gpu_label(store.ok_gpus(), args.gpu, None)
            found, why = 0, []
            for family in families:
                value = parse_value(family, args.param, args.value)
                base = (getattr(family.default(), args.param) if args.base is None
                        else parse_value(family, args.param, args.base))
                pairs = pairs_for(db, gpu, family, args.param, value, base, tasks)
                found += len(pairs)
                why.append("" if pairs else why_unpaired(db, family, args.param, value, base))
                if pairs:
                    print(f"{family.name} on {gpu}: {args.param} = {spelled(value)} against {spelled(base)}\n")
                    print(summary(pairs, f"{args.param} = {spelled(value)}"))
                    print(best_against_best(pairs) + "\n")
    except (ParamError, TuneInputError, StoreError, GpuLabelError, OSError) as e:
        print(f"param_gain.py: {e}", file=sys.stderr)
        return 2
    if not found:
        print(f"param_gain.py: no config with {args.param} = {args.value} has a twin timed on the same shapes on {gpu}",
              *(f"({w})" for w in why if w), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
