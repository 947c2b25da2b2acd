"""Does the fence in the last-arrival and spread protocols cost time in the rendered kernels? fence.sc against acq_rel.

    python3 benchmarks/fence_ab.py [--configs NAME ...] [--mnk M_N_K ...] [--repeats 3] [--target-ms 40]
        [--json OUT] [--compile-only]

Each config (a name as `config_name` prints it; default: the long-K winners of the small family's grid_k, with and
without spread, and an sm80 reduce=last) is rendered as the family renders it, whose fence_gpu is __threadfence()
(PTX fence.sc.gpu: cuda_parts.FENCE_GPU_SC), and once more with fence.acq_rel.gpu (cuda_parts.FENCE_GPU_ACQ_REL),
all the message passing of the protocols needs. Both twins are timed on every shape the config supports, in offline
mode, `repeats` times each in fresh evaluations that alternate which twin goes first; nothing is stored. Printed per
(config, shape): each twin's median over the repeats of its median time (us) and sc / acq_rel (> 1: acq_rel faster),
then the geomean of that ratio per config and over all. Both twins are verified as every candidate is: a twin that
sums stale partials fails its checks and is listed.

--compile-only compiles both twins of every config for sm_90a and times nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from cudal2.kernels.cuda_parts import FENCE_GPU_ACQ_REL, FENCE_GPU_SC
from cudal2.sandbox.evaluator import Evaluator, Prepared
from cudal2.sandbox.types import Status, Task
from cudal2.tune import FAMILIES, TuneInputError, candidate_named, load_tasks

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing_runs import add_timing_flags, evaluator_for, prepare_all, sort_prepared  # noqa: E402  (a sibling script)

DEFAULT_CONFIGS = (
    "small-bm16-bn16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32-grid_k16",  # 64x64x8192's H200 winner
    "small-bm16-bn16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32-grid_k8",  # 64x64x4096's
    "small-bm16-bn16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32-grid_k16-spread1",
    "small-bm64-bn64-warps_m2-warps_n2-warps_k2-k_unroll1-accfp32-grid_k16-spread1",
    "small-bm32-bn32-warps_m1-warps_n2-warps_k4-k_unroll2-accfp32-grid_k8",
    "sm80_mma-bm16-bn32-bk64-warps_m1-warps_n2-stages8-split_k16-group_m4-min_blocks1-accfp32-reducelast",
)
DEFAULT_MNK = ("64_64_1024", "64_64_4096", "64_64_8192", "64_64_16384", "128_128_4096", "256_256_2048")
FLAVOURS = ("sc", "acq_rel")


class NoFence(ValueError):
    """The rendered source has no fence_gpu to swap (the config takes no last-arrival or spread path)."""


def acq_rel_twin(source: str) -> str:
    """The source with fence_gpu's fence.sc.gpu swapped for fence.acq_rel.gpu; NoFence when it defines none."""
    if source.count(FENCE_GPU_SC) != 1:
        raise NoFence("no fence_gpu definition to swap (one expected)")
    return source.replace(FENCE_GPU_SC, FENCE_GPU_ACQ_REL)


@dataclass(frozen=True)
class Pair:
    """One config's two twins on the shapes it supports."""

    config: str
    tasks: tuple[Task, ...]
    sources: dict[str, str]  # flavour -> source


@dataclass(frozen=True)
class Timed:
    config: str
    mnk: str
    flavour: str
    repeat: int
    median_us: float


def pairs_for(names: list[str], tasks: list[Task]) -> list[Pair]:
    """Both twins of each named config, with the tasks its family supports; TuneInputError or NoFence names the config."""
    out = []
    for name in names:
        cand = candidate_named(FAMILIES, name)
        supported = tuple(t for t in tasks if cand.family.supports(cand.cfg, t) is None)
        if not supported:
            raise TuneInputError(f"config {name}: supports none of the shapes")
        source = cand.family.render(cand.cfg)
        try:
            out.append(Pair(name, supported, {"sc": source, "acq_rel": acq_rel_twin(source)}))
        except NoFence as e:
            raise NoFence(f"config {name}: {e}") from None
    return out


def ratios(timed: list[Timed]) -> dict[tuple[str, str], tuple[float, float, float]]:
    """(config, mnk) -> (sc us, acq_rel us, sc / acq_rel), each twin's median over its repeats; pairs missing a twin
    are left out."""
    by: dict[tuple[str, str, str], list[float]] = {}
    for t in timed:
        by.setdefault((t.config, t.mnk, t.flavour), []).append(t.median_us)
    out = {}
    for (config, mnk, flavour), values in by.items():
        other = by.get((config, mnk, "acq_rel"))
        if flavour == "sc" and other:
            sc, ar = statistics.median(values), statistics.median(other)
            out[(config, mnk)] = (sc, ar, sc / ar)
    return out


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def summary(timed: list[Timed]) -> str:
    rows = ratios(timed)
    lines = ["| config | shape | sc us | acq_rel us | sc / acq_rel |", "|---|---|---|---|---|"]
    lines += [f"| {c} | {m} | {sc:.2f} | {ar:.2f} | {r:.3f} |" for (c, m), (sc, ar, r) in rows.items()]
    for config in dict.fromkeys(c for c, _ in rows):
        lines.append(f"\n{config}: geomean sc / acq_rel {geomean([r for (c, _), (_, _, r) in rows.items() if c == config]):.3f}")
    if rows:
        lines.append(f"\nall {len(rows)} (config, shape) pairs: geomean sc / acq_rel "
                     f"{geomean([r for _, _, r in rows.values()]):.3f}")
    return "\n".join(lines)


def measure(evaluator: Evaluator, prepared: dict[tuple[str, str], Prepared], repeats: int) -> tuple[list[Timed], list[str]]:
    """Every twin `repeats` times, the twins' order flipped each repeat so that drift favours neither."""
    timed, failures = [], []
    configs = list(dict.fromkeys(c for c, _ in prepared))
    for repeat in range(repeats):
        order = FLAVOURS if repeat % 2 == 0 else FLAVOURS[::-1]
        for config in configs:
            for flavour in order:
                for shape in evaluator.run(prepared[(config, flavour)]).shapes:
                    if shape.status is not Status.OK:
                        failures.append(f"{config} {flavour} {shape.task.mnk} repeat {repeat}: "
                                        f"{shape.status.value}: {shape.reason[:120]}")
                        continue
                    timed.append(Timed(config, shape.task.mnk, flavour, repeat, shape.timings["candidate"].median_us))
                    print(f"{config[:60]:<60} {flavour:<8} {shape.task.mnk:<14} repeat {repeat} "
                          f"{timed[-1].median_us:.2f} us", flush=True)
    return timed, failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), help="config names (config_name)")
    ap.add_argument("--mnk", nargs="+", default=list(DEFAULT_MNK), help="shapes, M_N_K")
    add_timing_flags(ap, what="twin", repeats=3, target_ms=40.0)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        print("fence_ab.py: --repeats must be >= 1", file=sys.stderr)
        return 2
    try:
        pairs = pairs_for(args.configs, load_tasks(None, args.mnk, "fp32"))
    except (TuneInputError, NoFence) as e:
        print(f"fence_ab.py: {e}", file=sys.stderr)
        return 2
    evaluator = evaluator_for(args, baselines=False)
    twins = {(p.config, f): (p.sources[f], p.tasks) for p in pairs for f in FLAVOURS}
    ready = sort_prepared(prepare_all(evaluator, twins), what="twins", compile_only=args.compile_only,
                          name=lambda key: f"{key[0]} {key[1]}")
    if args.compile_only:
        return 1 if ready.stopped else 0
    timed, failures = measure(evaluator, ready.runnable, args.repeats)
    print(f"\n{len(ready.runnable)} twins x {args.repeats} repeats on {evaluator.gpu_label}, target_ms {args.target_ms:g}; "
          f"{len(failures)} evaluations not ok", *failures, sep="\n")
    print(summary(timed))
    if args.json:
        args.json.write_text(json.dumps([asdict(t) for t in timed], indent=1))
    return 0 if timed and not failures and not ready.stopped else 1


if __name__ == "__main__":
    raise SystemExit(main())
