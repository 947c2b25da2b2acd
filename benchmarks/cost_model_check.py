"""How well `cudal2 tune --strategy model`'s cost model ranks configs it has not seen on a shape: CPU only.

    python3 benchmarks/cost_model_check.py [--db benchmarks/stores/h200_grid.sqlite.gz] [--shapes data/grid.csv]
                                           [--gpu h200] [--folds 5] [--plan]

The store's shapes (every shape with results, grid and LLM alike) are split into `--folds` folds. For each fold the
model is fitted on the other folds' results, and each held-out shape's measured configs are ranked by four rules:

    model     the cost model's predicted time (cudal2.cost_model, as the strategy fits it)
    wave      the wave model's estimate (tune_search.estimate_us: compute in waves, L2, HBM, split-K's reduction)
    transfer  the config's time on the nearest other shape (log2 M, N, K) where it was measured; never: last
    random    a seeded shuffle

Printed per rule, over held-out shapes with at least MIN_CONFIGS measured configs: the geometric mean of (measured
time of the top-ranked config / the shape's fastest), and how often the top 1, 2 or 3 hold a config within 3% of the
fastest. Also the model's error on held-out results (|predicted / measured - 1|: median and 90th percentile).

The ranking is over configs the store measured there, which earlier strategies chose because they looked good: every
rule ranks the same lists, so compare rules with each other, not with the tuner's odds on unmeasured configs.
`--plan` also fits on every result and plans `--strategy model` over `--shapes` as the tuner would (fit and predict
seconds, configs planned, shapes given picks, the predicted gain of each shape's first pick). `--since T` plans from
the results measured before T and scores the picks that later runs (other strategies) happened to measure, against
everything those runs measured anew: a look back at real measurements the model did not see.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from cudal2 import tune
from cudal2.cost_model import ConfigFeatures, GradientBoostedTrees
from cudal2.sandbox.store import GpuLabelError, StoreError
from cudal2.sandbox.types import Acc, Task
from cudal2.tune_search import Candidate, ModelSearch, estimate_us, log_distance

sys.path.insert(0, str(Path(__file__).resolve().parent))
from transfer_check import load_copy  # noqa: E402  (a sibling script)
from wave_model_check import NEAR_BEST, store_arguments  # noqa: E402

MIN_CONFIGS = 5  # shapes with fewer measured configs say little about ranking
RULES = ("model", "wave", "transfer", "random")

Measured = dict[Task, dict[str, tuple[Candidate, float]]]


def features_for(sms: int) -> ConfigFeatures:
    return ConfigFeatures(tune.FAMILIES, estimate_us, sms)


def rank_scores(measured: Measured, folds: int, sms: int) -> tuple[dict[str, list[list[float]]], list[float]]:
    """rule -> per held-out shape the measured times in that rule's order, divided by the shape's fastest; and the
    model's predicted / measured ratio of every held-out result."""
    shapes = sorted(measured, key=lambda t: (t.m, t.n, t.k, t.acc.value))
    random.Random(0).shuffle(shapes)
    fold_of = {t: i % folds for i, t in enumerate(shapes)}
    features = features_for(sms)
    by_name: dict[str, list[tuple[Task, float]]] = {}
    for task, configs in measured.items():
        for name, (_, us) in configs.items():
            by_name.setdefault(name, []).append((task, us))
    ranked: dict[str, list[list[float]]] = {r: [] for r in RULES}
    ratios: list[float] = []
    shuffle = random.Random(1)
    for fold in range(folds):
        train = [(c, t, us) for t in shapes if fold_of[t] != fold for c, us in measured[t].values()]
        model = GradientBoostedTrees().fit(features.matrix([(c, t) for c, t, _ in train]),
                                           np.log([us for _, _, us in train]))
        for task in (t for t in shapes if fold_of[t] == fold):
            rows = sorted(measured[task].values(), key=lambda cu: cu[0].name)
            times = [us for _, us in rows]
            predicted = np.exp(model.predict(features.matrix([(c, task) for c, _ in rows]))).tolist()
            ratios += [p / us for p, us in zip(predicted, times, strict=True)]
            if len(rows) < MIN_CONFIGS:
                continue
            keys = {
                "model": predicted,
                "wave": [estimate_us(c.family.tiling(c.cfg), task, sms) for c, _ in rows],
                "transfer": [_nearest_time(by_name[c.name], task, fold_of) for c, _ in rows],
                "random": [shuffle.random() for _ in rows],
            }
            best = min(times)
            for rule, key in keys.items():
                order = sorted(range(len(rows)), key=lambda i: (key[i], rows[i][0].name))
                ranked[rule].append([times[i] / best for i in order])
    return ranked, ratios


def _nearest_time(elsewhere: list[tuple[Task, float]], task: Task, fold_of: dict[Task, int]) -> float:
    """The config's time on the nearest shape of another fold; infinity where it was measured on none."""
    others = [(log_distance(t, task), us) for t, us in elsewhere if fold_of[t] != fold_of[task]]
    return min(others)[1] if others else math.inf


def planned(measured: Measured, targets: list[Task], sms: int) -> tuple[ModelSearch, list, float]:
    """--strategy model planned over `targets` from every result, as the tuner's warm start would feed it; its
    proposals and the seconds the plan took."""
    search = ModelSearch(tune.FAMILIES, random.Random(0), tuple(targets), "sm_90a", sms)
    for task, configs in measured.items():
        for cand, us in configs.values():
            search.observe_stored(cand, task, us, True)
    started = time.monotonic()
    proposals = list(iter(search.propose, None))
    return search, proposals, time.monotonic() - started


def plan(measured: Measured, targets: list[Task], sms: int) -> str:
    search, proposals, seconds = planned(measured, targets, sms)
    picked = {t for p in proposals for t in p.shapes or ()}
    # The first pick's predicted time over the shape's fastest stored time (shapes with both).
    gains = sorted(picks[0][1] / min(us for _, us in measured[t].values())
                   for t, picks in search.forecast.items() if picks and t in measured)
    quartiles = " / ".join(f"{q:.3f}" for q in statistics.quantiles(gains, n=4)) if len(gains) > 1 else "-"
    return (f"planned {len(proposals)} configs for {len(picked)} of {len(targets)} shapes in {seconds:.1f} s "
            f"(fit, pools, prediction); configs picked for 1 shape: {sum(len(p.shapes) == 1 for p in proposals)}, "
            f"for 10 or more: {sum(len(p.shapes) >= 10 for p in proposals)}; first pick's predicted time / the "
            f"shape's fastest, quartiles: {quartiles}")


def retrospect(before: Measured, after: Measured, targets: list[Task], sms: int) -> str:
    """Plan from the store as it was (`before`), then look up what later runs of other strategies measured (`after`
    holds every result): of the model's picks that they happened to measure, how many beat the shape's fastest time
    as it was, against the same rate over every (config, shape) they measured anew."""
    search, _, _ = planned(before, targets, sms)

    def ratios(pairs) -> list[float]:
        return [after[t][name][1] / min(us for _, us in before[t].values()) for t, name in pairs
                if t in before and name in after.get(t, {}) and name not in before[t]]

    picks = ratios((t, c.name) for t, fc in search.forecast.items() for c, _ in fc)
    firsts = ratios((t, fc[0][0].name) for t, fc in search.forecast.items() if fc)
    everything = ratios((t, name) for t in targets for name in after.get(t, {}))
    lines = ["| (config, shape) pairs measured after the cut | pairs | faster than the shape's fastest before | "
             "measured / fastest before (geomean) |", "|---|---|---|---|"]
    for label, rs in (("the model's picks", picks), ("the model's first picks", firsts),
                      ("every pair the later runs measured anew", everything)):
        if rs:
            geo = math.exp(statistics.fmean(math.log(r) for r in rs))
            lines.append(f"| {label} | {len(rs)} | {sum(r < 1 for r in rs) / len(rs):.1%} | {geo:.4f} |")
        else:
            lines.append(f"| {label} | 0 | - | - |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    store_arguments(ap)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--plan", action="store_true", help="also plan --strategy model over --shapes from every result")
    ap.add_argument("--since", type=float, default=None, metavar="UNIX_SECONDS", help="also plan from the results "
                    "measured before this time and score the picks that later runs measured")
    args = ap.parse_args(argv)
    if args.folds < 2:
        print(f"error: --folds wants 2 or more, got {args.folds}", file=sys.stderr)
        return 2
    try:
        targets = tune.load_tasks(args.shapes, [], Acc.FP32.value)
        measured = load_copy(Path(args.db), args.gpu, args.until)
        before = load_copy(Path(args.db), args.gpu, args.since) if args.since is not None else {}
    except (tune.TuneInputError, GpuLabelError, StoreError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    started = time.monotonic()
    ranked, ratios = rank_scores(measured, args.folds, args.sms)
    shapes = len(ranked["model"])
    print(f"{sum(len(c) for c in measured.values())} results on {len(measured)} shapes, {args.folds} folds by shape, "
          f"{time.monotonic() - started:.0f} s; ranked: {shapes} held-out shapes with >= {MIN_CONFIGS} configs\n")
    print("| rule | top-1 time / fastest (geomean) | near-best in top 1 | top 2 | top 3 |\n|---|---|---|---|---|")
    for rule in RULES:
        lists = ranked[rule]
        geo = math.exp(statistics.fmean(math.log(r[0]) for r in lists))
        hits = [sum(min(r[:k]) <= NEAR_BEST for r in lists) / shapes for k in (1, 2, 3)]
        print(f"| {rule} | {geo:.4f} | {hits[0]:.1%} | {hits[1]:.1%} | {hits[2]:.1%} |")
    errors = sorted(abs(r - 1) for r in ratios)
    print(f"\nmodel error on held-out results (|predicted / measured - 1|, {len(errors)} results): median "
          f"{statistics.median(errors):.1%}, p90 {errors[int(0.9 * len(errors))]:.1%}")
    if args.plan:
        print(plan(measured, targets, args.sms))
    if args.since is not None:
        print(f"\nplanned from the {sum(len(c) for c in before.values())} results measured before {args.since:.0f}:\n")
        print(retrospect(before, measured, targets, args.sms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
