"""`cudal2 tune`: inputs, search strategies, the compile-only run and its resumption, the best-kernel queries, the CLI;
on a GPU a short real tuning run."""

from __future__ import annotations

import gzip
import importlib
import itertools
import json
import math
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tarfile
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest

from cudal2 import tune, tune_search
from cudal2.data import ShapeRow, write_csv
from cudal2.kernels import cuda_parts
from cudal2.kernels.family import Tiling, config_name, config_params
from cudal2.kernels.sm80 import Reduce, Sm80Family
from cudal2.kernels.sm90 import (
    EXTENDED_GMMA_DEFINE,
    EXTENDED_GMMA_GAIN,
    Epilogue,
    Raster,
    Schedule,
    Scheduler,
    Sm90Family,
    batched_split_k,
    extended_gmma,
)
from cudal2.kernels.small import SmallFamily
from cudal2.sandbox.evaluator import source_hash
from cudal2.sandbox.harness_build import find_cublas
from cudal2.sandbox.lt_algo import CUBLASLT_AUTOTUNED, LtAlgo
from cudal2.sandbox.pool import RunnerSpec
from cudal2.sandbox.store import ResultStore
from cudal2.sandbox.types import Acc, Mode, ShapeResult, Status, Task, Timing
from cudal2.tune_log import ConfigRecord, TuneLog
from cudal2.tune_search import (
    ELITE,
    FILL_FAMILY_GAP,
    FILL_MAX_EST_LOSS,
    FILL_PARENTS,
    FILL_PER_SHAPE,
    MODEL_MIN_RESULTS,
    MODEL_PER_SHAPE,
    RERENDER_PER_SHAPE,
    RERENDER_WITHIN_US,
    Candidate,
    CublasLtSearch,
    EvolutionarySearch,
    FillSearch,
    ModelSearch,
    NeighboursSearch,
    RandomSearch,
    RerenderSearch,
    Strategy,
    TransferSearch,
    estimate_us,
)
from tests.test_cli import run as run_cli
from tests.tune_fakes import BASELINE_US, FAKE_GPU, simulated_us

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "data" / "grid.csv"
TWO_SHAPES = [Task(64, 64, 64), Task(77, 1000, 333)]
SMALL, SM80, SM90 = SmallFamily(), Sm80Family(), Sm90Family()


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("CUDAL2_NO_GPU", "1")  # the CPU path, also when a GPU happens to be present


# ------------------------------------------------------------------------------------------------- inputs


def test_load_tasks_from_a_split_and_mnk_deduplicated():
    held = tune.load_tasks(f"{GRID}:heldout", ["64_64_64", "64x64x64"], "fp32")
    every = tune.load_tasks(str(GRID), [], "fp32")
    assert len(every) == 1000 and 150 < len(held) < 260
    assert held.count(Task(64, 64, 64)) == 1 and set(held) <= set(every) | {Task(64, 64, 64)}
    assert tune.load_tasks(None, ["1_2_3"], "fp16") == [Task(1, 2, 3, Acc.FP16)]


@pytest.mark.parametrize(("shapes", "mnk", "message"), [
    (None, ["64_64"], "bad shape"),
    ("/no/such.csv", [], "cannot read"),
    (None, [], "no shapes"),
])
def test_load_tasks_rejects_bad_input(shapes, mnk, message):
    with pytest.raises(tune.TuneInputError, match=message):
        tune.load_tasks(shapes, mnk, "fp32")


def test_families_by_name():
    assert [f.name for f in tune.families_named(["all"])] == ["sm90_wgmma", "sm80_mma", "small"]
    assert [f.name for f in tune.families_named(["small"])] == ["small"]
    with pytest.raises(tune.TuneInputError, match="unknown family bogus"):
        tune.families_named(["bogus"])


def test_every_family_names_its_cut_parameters_and_tiles_like_its_config():
    for family in tune.FAMILIES:
        assert set(family.decomposition) <= set(family.space())
        t = family.tiling(family.default())
        assert (t.bm, t.bn) == (family.default().bm, family.default().bn) and t.bk >= 16 and t.splits >= 1


def test_prune_reasons_of_one_kind_count_together():
    assert tune.prune_category("shared memory 204800 B over 166912") == tune.prune_category("shared memory 9 B over 1")


# ----------------------------------------------------------------------------------------------- strategies


def _names(strategy, n):
    return [strategy.propose().candidate.name for _ in range(n)]


def test_random_search_starts_at_the_defaults_and_is_seeded():
    families = (SM80, SMALL)
    first = RandomSearch(families, random.Random(3))
    assert [p.candidate.cfg for p in (first.propose(), first.propose())] == [SM80.default(), SMALL.default()]
    assert _names(RandomSearch(families, random.Random(3)), 30) == _names(RandomSearch(families, random.Random(3)), 30)
    assert _names(RandomSearch(families, random.Random(3)), 30) != _names(RandomSearch(families, random.Random(4)), 30)


def test_evolutionary_search_breeds_from_the_elite_of_a_shape():
    search = EvolutionarySearch((SM80, SMALL), random.Random(0))
    search.propose(), search.propose()  # the defaults
    task = Task(64, 64, 64)
    parents = [Candidate(SMALL, SMALL.make({**config_params(SMALL.default()), "k_unroll": k})) for k in (1, 2, 4)]
    parents.append(Candidate(SM80, SM80.default()))
    for i, p in enumerate(parents):
        search.observe(p, task, 10.0 + i)
    search.observe(parents[0], task, 20.0)  # a re-measurement replaces, never duplicates
    assert len(search.elites[task]) == min(ELITE, len(parents))
    assert [e[1].name for e in search.elites[task]][0] == parents[1].name
    children = [p for p in (search.propose() for _ in range(200)) if p.focus is not None]
    assert len(children) > 100  # the rest are exploration samples
    assert all(c.focus == task for c in children)
    for c in children:
        space = c.candidate.family.space()
        assert all(v in space[k] for k, v in config_params(c.candidate.cfg).items())
    names = {p.name for p in parents}
    assert sum(c.candidate.name not in names for c in children) > 50  # mostly new configs


def _small(k_unroll: int) -> Candidate:
    return Candidate(SMALL, SMALL.make({**config_params(SMALL.default()), "k_unroll": k_unroll}))


def test_transfer_gives_every_target_the_best_configs_of_its_nearest_tuned_shapes(monkeypatch):
    monkeypatch.setattr(tune_search, "TRANSFER_NEIGHBOURS", 2)  # the mechanism, whatever the tuned constants
    monkeypatch.setattr(tune_search, "TRANSFER_TOP", 2)
    tiny, big = Task(64, 64, 64), Task(4096, 4096, 4096)
    targets = (Task(64, 128, 64), Task(128, 64, 64), Task(8192, 4096, 4096), big)
    search = TransferSearch((SMALL,), random.Random(0), targets)
    a, b, c, d = _small(1), _small(2), _small(4), Candidate(SM80, SM80.default())
    for cand, us in ((a, 3.0), (b, 2.0), (c, 9.0)):  # tiny: b, then a, then c
        search.observe(cand, tiny, us)
    for cand, us in ((d, 100.0), (c, 120.0), (a, 500.0)):  # big: d, then c
        search.observe(cand, big, us)
    plan = []
    while (p := search.propose()) is not None:
        plan.append(p)
    assert search.propose() is None  # the plan is spent
    picked = {p.candidate.name: set(p.shapes) for p in plan}
    assert len(picked) == len(plan)  # one proposal per config, with all its shapes
    # Each target's two nearest tuned shapes are tiny and big; each gives its TRANSFER_TOP fastest that support the
    # target: the small family (a, b, c) refuses the two large targets (not launch-bound), so they get only d.
    assert set(picked) == {a.name, b.name, c.name, d.name}
    assert picked[a.name] == picked[b.name] == picked[c.name] == set(targets[:2])
    assert picked[d.name] == set(targets)
    assert {plan[0].candidate.name, plan[1].candidate.name} == {b.name, d.name}  # rank-0 picks first
    assert all(p.focus is None for p in plan)


def test_transfer_looks_past_neighbours_whose_winners_refuse_the_target():
    near, far, farther = Task(64, 64, 64), Task(64, 64, 1024), Task(4096, 4096, 4096)
    odd = Task(64, 64, 66)  # K % 8 != 0: sm90's TMA refuses it
    search = TransferSearch((SMALL, SM90), random.Random(0), (odd,))
    tma = Candidate(SM90, SM90.default())
    search.observe(tma, near, 1.0)  # the nearest shape's only winner cannot run the target
    search.observe(_small(1), far, 2.0)
    search.observe(_small(2), farther, 3.0)
    picked = [p.candidate.name for p in iter(search.propose, None)]
    assert tma.name not in picked and picked == [_small(1).name, _small(2).name]


def test_wave_model_charges_whole_waves_and_split_partials():
    sms = 132
    full, spill = Task(128 * 12, 128 * 11, 4096), Task(128 * 12 + 1, 128 * 11, 4096)  # 132 tiles, then 143
    tile = Tiling(128, 128, 64)
    assert estimate_us(tile, spill, sms) > 1.5 * estimate_us(tile, full, sms)  # 11 tiles more: a second wave
    assert estimate_us(replace(tile, stream_k=True), spill, sms) < estimate_us(tile, spill, sms)  # shared out
    # 32 tiles of a long K on 132 SMs: 4 K ranges keep 128 SMs busy, which outweighs the fp32 partials.
    skinny = Task(256, 2048, 8192)
    assert estimate_us(replace(tile, splits=4), skinny, sms) < estimate_us(tile, skinny, sms)
    # With a full wave of tiles already, splitting only adds partials.
    assert estimate_us(replace(tile, splits=2), full, sms) > estimate_us(tile, full, sms)
    # Summed by the last CTA to arrive in the same launch: no second kernel's fixed cost, while that CTA reads few
    # partials (4 of a 64x64 tile: 64 KiB); 4 of a 128x128 tile (256 KiB) cost one SM about as much as the kernel.
    small_tile = Tiling(64, 64, 64, 4)
    assert estimate_us(replace(small_tile, last_arrival=True), skinny, sms) < estimate_us(small_tile, skinny, sms)
    assert estimate_us(replace(tile, splits=4, last_arrival=True), skinny, sms) > \
        estimate_us(replace(tile, splits=4), skinny, sms) - 0.5
    # Spread: every CTA reads a share, which pays where the last CTA would read much (a 64x64 tile cut 16 ways:
    # 256 KiB), not where it reads little (a 16x16 tile: 16 KiB), for its extra wait.
    long_k = Task(64, 64, 8192)
    for bm, wins in ((64, True), (16, False)):
        last = Tiling(bm, bm, 128, 16, last_arrival=True)
        assert (estimate_us(replace(last, spread=True), long_k, sms) < estimate_us(last, long_k, sms)) is wins, bm


def _sm90(**kw) -> Candidate:
    return Candidate(SM90, SM90.make({**config_params(SM90.default()), **kw}))


def _fill_plan(search: FillSearch) -> list:
    plan = [p for p in iter(search.propose, None)]
    assert search.propose() is None  # the plan is spent
    return plan


def test_fill_recuts_the_stored_winners_for_every_target():
    skinny, square, odd = Task(256, 2048, 8192), Task(8192, 8192, 8192), Task(300, 2000, 8000)
    measured = Task(4096, 4096, 4096)
    search = FillSearch((SM90, SMALL), random.Random(0), (skinny, square, odd), "sm_90a", 132)
    winner, runner_up = _sm90(), _sm90(bm=256, bn=128, swizzle=2)
    for task, order in ((measured, (winner, runner_up)), (Task(8192, 4096, 4096), (winner,)),
                        (Task(4096, 8192, 4096), (runner_up, winner)), (square, (winner,))):
        for i, cand in enumerate(order):
            search.observe(cand, task, 10.0 + i)
    assert [c.name for c in search._parents(SM90)] == [winner.name, runner_up.name]  # by shapes won
    assert FILL_PARENTS >= 2
    plan = _fill_plan(search)
    assert len({p.candidate.name for p in plan}) == len(plan) and all(p.focus is None for p in plan)
    fixed = {k: v for k, v in config_params(winner.cfg).items() if k not in SM90.decomposition}
    per_shape: dict[Task, list] = {}
    for p in plan:
        cand = p.candidate
        assert cand.family is SM90  # the small family has nothing to re-cut
        assert SM90.prune(cand.cfg, "sm_90a") is None
        params = config_params(cand.cfg)
        # Only the cut differs from a parent (here both parents share everything else but swizzle).
        assert {k: v for k, v in params.items() if k not in SM90.decomposition and k != "swizzle"} == {
            k: v for k, v in fixed.items() if k != "swizzle"}
        for task in p.shapes:
            assert SM90.supports(cand.cfg, task) is None
            per_shape.setdefault(task, []).append(cand)
    assert set(per_shape) == {skinny, odd} or set(per_shape) == {skinny, square, odd}
    assert len(per_shape[skinny]) == len(per_shape[odd]) == FILL_PER_SHAPE  # nothing stored on them: no limit
    # On the measured square shape only cuts the model rates at least as fast as its stored best's, and not that one.
    assert len(per_shape.get(square, [])) <= FILL_PER_SHAPE
    winner_est = estimate_us(SM90.tiling(winner.cfg), square, 132)
    assert all(estimate_us(SM90.tiling(c.cfg), square, 132) <= winner_est * FILL_MAX_EST_LOSS
               and c.name != winner.name for c in per_shape.get(square, []))
    assert any(c.cfg.splits > 1 for c in per_shape[skinny])  # few tiles, long K: split-K is among the cuts
    cuts = [(t.bm, t.bn, t.splits, t.stream_k) for t in (SM90.tiling(c.cfg) for c in per_shape[skinny])]
    assert len(set(cuts)) == len(cuts)  # distinct cuts, not one cut at two K-block depths


def test_fill_leaves_a_shape_to_the_families_among_its_fastest():
    target = Task(64, 64, 4096)
    search = FillSearch((SM80, SM90), random.Random(0), (target,), "sm_90a", 132)
    search.observe(Candidate(SM80, SM80.default()), target, 5.0)  # only sm80 measured fast on it
    search.observe(_sm90(), Task(4096, 4096, 4096), 5.0)
    plan = _fill_plan(search)
    assert plan and {p.candidate.family for p in plan} == {SM80}
    assert {p.candidate.cfg.split_k for p in plan} <= set(SM80.space()["split_k"]) - {SM80.default().split_k}


@pytest.mark.parametrize("sm90_us, recut", [(6.0, True), (7.0, False)])
def test_fill_recuts_a_family_outside_the_elite_while_it_is_close(sm90_us, recut):
    """Five sm80 configs fill the shape's elite (5.0-5.4 us); an sm90 config 1.2x behind still gets its family
    re-cut there (FILL_FAMILY_GAP = 1.25), one 1.4x behind does not."""
    target = Task(256, 512, 16384)
    search = FillSearch((SM80, SM90), random.Random(0), (target,), "sm_90a", 132)
    for i, split_k in enumerate((1, 2, 4, 8, 16)):
        search.observe(Candidate(SM80, replace(SM80.default(), split_k=split_k)), target, 5.0 + 0.1 * i)
    stored = _sm90(scheduler="streamk", splits=8, reduction="atomic", bn=128)
    search.observe(stored, target, sm90_us)
    assert all(c.family is SM80 for _, c in search.elites[target])  # sm90 is not among the fastest
    sm90_picks = [p for p in _fill_plan(search) if p.candidate.family is SM90]
    assert bool(sm90_picks) is recut and FILL_FAMILY_GAP == 1.25
    assert stored.name not in {p.candidate.name for p in sm90_picks}  # measured already


def test_fill_without_stored_winners_recuts_the_defaults():
    search = FillSearch((SM90,), random.Random(0), (Task(128, 1024, 16384),), "sm_90a", 132)
    plan = _fill_plan(search)
    assert len(plan) == FILL_PER_SHAPE
    base = {k: v for k, v in config_params(SM90.default()).items() if k not in SM90.decomposition}
    assert all({k: v for k, v in config_params(p.candidate.cfg).items() if k in base} == base for p in plan)


def test_rerender_plans_stale_configs_close_to_the_shapes_best():
    target, other = Task(256, 512, 12288), Task(4096, 4096, 4096)
    search = RerenderSearch((SM90,), random.Random(0), (target,))
    fastest = _sm90(bm=128, bn=64, cluster_n=1)
    search.observe_stored(fastest, target, 10.0, current=True)
    close = _sm90(scheduler="streamk", splits=8, bn=64, cluster_n=1)
    far = _sm90(scheduler="streamk", splits=4, bn=64, cluster_n=1)
    redone = _sm90(scheduler="streamk", splits=2, bn=64, cluster_n=1)
    search.observe_stored(close, target, 10.0 + RERENDER_WITHIN_US, current=False)
    search.observe_stored(far, target, 10.1 + RERENDER_WITHIN_US, current=False)
    search.observe_stored(redone, target, 10.5, current=False)
    search.observe_stored(redone, target, 10.2, current=True)  # today's render is measured there already
    search.observe_stored(_sm90(scheduler="streamk", splits=16, bn=64, cluster_n=1), other, 1.0, current=False)
    plan = [p for p in iter(search.propose, None)]
    assert [(p.candidate.name, p.shapes) for p in plan] == [(close.name, (target,))]


def test_rerender_divides_a_stale_time_by_the_familys_gain_for_todays_render():
    """An sm90 tile that now runs one extended-shape wgmma per K step (N = 80) may run up to 1.8x faster than its
    stored render: 1.5x the shape's fastest is close for it, but not for a stale stream-K config (a constant)."""
    target = Task(256, 1024, 12288)
    search = RerenderSearch((SM90,), random.Random(0), (target,))
    search.observe_stored(_sm90(bm=128, bn=64, cluster_n=1), target, 20.0, current=True)
    wide = _sm90(bm=128, bn=80, cluster_m=2, cluster_n=1, splits=4)
    too_slow = _sm90(bm=128, bn=176, cluster_n=1)
    constant = _sm90(scheduler="streamk", bn=64, cluster_n=1)
    assert SM90.rerender_gain(wide.cfg) == EXTENDED_GMMA_GAIN > 1.5 and SM90.rerender_gain(constant.cfg) == 1.0
    search.observe_stored(wide, target, 30.0, current=False)
    search.observe_stored(too_slow, target, (20.0 + RERENDER_WITHIN_US) * EXTENDED_GMMA_GAIN + 0.1, current=False)
    search.observe_stored(constant, target, 30.0, current=False)
    assert [(p.candidate.name, p.shapes) for p in iter(search.propose, None)] == [(wide.name, (target,))]


def test_neighbours_step_one_parameter_from_each_shapes_fastest_config():
    big, other, tiny_n = Task(8192, 8192, 4096), Task(12288, 8192, 2048), Task(4096, 4096, 4100)
    search = NeighboursSearch((SM90,), random.Random(0), (big, other, tiny_n, Task(64, 64, 64)), "sm_90a")
    best, slower = _sm90(), _sm90(bm=256, bn=128)
    measured = _sm90(raster="along_n")
    search.observe_stored(best, big, 500.0, current=True)
    search.observe_stored(slower, big, 510.0, current=True)  # the incumbent is the fastest only
    search.observe_stored(measured, big, 520.0, current=True)  # a neighbour measured there is not proposed again
    search.observe_stored(best, other, 300.0, current=True)
    search.observe_stored(best, tiny_n, 200.0, current=True)  # an incumbent whose neighbours all refuse the shape
    plan = [p for p in iter(search.propose, None)]
    names = [p.candidate.name for p in plan]
    assert len(names) == len(set(names)) and plan
    for p in plan:
        changed = {k for k, v in config_params(p.candidate.cfg).items() if config_params(best.cfg)[k] != v}
        assert len(changed) == 1 and SM90.prune(p.candidate.cfg, "sm_90a") is None
        assert Task(64, 64, 64) not in p.shapes  # no incumbent there
    by_name = {p.candidate.name: p.shapes for p in plan}
    assert by_name[measured.name] == (other,)  # measured on `big` already
    assert by_name[_sm90(raster="along_m").name] == by_name[_sm90(swizzle=8).name] == (big, other)
    assert plan[0].shapes == (big, other)  # those shared by the most shapes first
    assert _sm90(bk=128, stages=0).name in by_name and _sm90(acc="fp16").name not in by_name  # fp32 tasks
    assert all(tiny_n not in p.shapes for p in plan)  # K % 8 != 0: no sm90 config supports it (TMA)


def test_neighbours_vary_steps_only_along_the_named_parameters():
    big = Task(8192, 8192, 4096)
    search = NeighboursSearch((SM90,), random.Random(0), (big,), "sm_90a", vary=("epi_n",))
    best = _sm90(bm=128, bn=128, cluster_n=1)
    search.observe_stored(best, big, 500.0, current=True)
    plan = [p.candidate.cfg for p in iter(search.propose, None)]
    # 128 columns: subtiles of 16, 64 or all 128 (32 is CUTLASS's own choice, epi_n = 0)
    assert sorted(c.epi_n for c in plan) == [16, 64, 128]
    assert all(replace(c, epi_n=0) == best.cfg for c in plan)



def test_given_plans_the_listed_configs_in_order_on_the_shapes_each_supports():
    odd_k = Task(77, 1000, 333)  # K % 8 != 0: no sm90 config takes it (TMA)
    listed = (_sm90(bm=256), Candidate(SMALL, SMALL.default()), _sm90())
    search = tune_search.make_strategy(Strategy.GIVEN, (SM90, SMALL), 0, (Task(64, 64, 64), odd_k), given=listed)
    plan = list(iter(search.propose, None))
    assert [p.candidate.name for p in plan] == [c.name for c in listed]
    assert [p.shapes for p in plan] == [(Task(64, 64, 64),), (Task(64, 64, 64), odd_k), (Task(64, 64, 64),)]


def test_one_step_reaches_the_basic_twin_of_a_swizzled_winner():
    """`basic` takes no swizzle, raster order or stream-K: a winner that set them steps to basic by settling them
    (86 grid winners went basic, 1.096x over the winner before, RESULTS eighteenth session), and a basic parent's
    steps along those fields settle back to itself and are not proposed."""
    parent = _sm90(schedule="pingpong", bm=128, bn=128, cluster_n=1, swizzle=4, raster="along_n")
    steps = [c.cfg for c in tune_search.one_step(parent, "sm_90a", ("schedule",))]
    assert sorted(c.schedule.value for c in steps) == ["basic", "cooperative", "unspecialized"]
    basic = next(c for c in steps if c.schedule is Schedule.BASIC)
    assert basic == replace(parent.cfg, schedule=Schedule.BASIC, swizzle=1, raster=Raster.HEURISTIC)
    unspecialized = next(c for c in steps if c.schedule is Schedule.UNSPECIALIZED)  # its epilogue: from registers
    assert unspecialized == replace(basic, schedule=Schedule.UNSPECIALIZED, epilogue=Epilogue.NOSMEM)
    assert SM90.prune(basic, "sm_90a") is None
    twin = Candidate(SM90, basic)
    assert tune_search.one_step(twin, "sm_90a", ("swizzle", "raster", "scheduler")) == []
    every = tune_search.one_step(twin, "sm_90a")
    assert len({c.name for c in every}) == len(every) and twin.name not in {c.name for c in every}
    assert all(SM90.settle(c.cfg) == c.cfg for c in every)
    # a stream-K parent settles to the persistent tag (split-K as a batch keeps its splits)
    streamk = _sm90(bn=128, scheduler="streamk", splits=2, reduction="ordered")
    twins = [c.cfg for c in tune_search.one_step(streamk, "sm_90a", ("schedule",)) if c.cfg.schedule is Schedule.BASIC]
    assert twins == [replace(streamk.cfg, schedule=Schedule.BASIC, scheduler=Scheduler.PERSISTENT)]
    sm80 = Candidate(SM80, SM80.default())
    assert SM80.settle(sm80.cfg) is sm80.cfg and SMALL.settle(SMALL.default()) == SMALL.default()

def test_cublaslt_plans_the_configs_like_each_shapes_algorithm():
    a, b, without = Task(256, 512, 12288), Task(512, 256, 12288), Task(64, 64, 64)
    search = CublasLtSearch((SM80, SM90, SMALL), random.Random(0), (a, b, without))
    lt = LtAlgo(66, 64, 96, 6, "fp32 workspace", 4, 2)  # 6 and 8 K ranges: both divide K = 12288 in whole rows
    likes = [Candidate(SM90, c) for c in SM90.like_cublaslt(lt)]
    search.observe_stored(likes[0], a, 15.0, current=True)  # measured on `a` already
    search.observe_cublaslt(a, lt)
    search.observe_cublaslt(b, lt)  # `without`: no cuBLASLt algorithm stored there
    plan = [p for p in iter(search.propose, None)]
    assert [p.candidate.name for p in plan] == [c.name for c in likes]  # rank order; sm80 and small have none
    by_name = {p.candidate.name: p.shapes for p in plan}
    assert by_name[likes[0].name] == (b,) and by_name[likes[1].name] == (a, b)


def _taught_model_search(targets: tuple[Task, ...]) -> tuple[ModelSearch, dict[tuple[int, int], Candidate]]:
    """A model search fed a rule over 64 shapes: BN 128 is 20% faster than BN 64 or 256, a 1x2 cluster 10% faster
    than none; the time otherwise grows with M*N*K."""
    configs = {(bn, cn): _sm90(bn=bn, cluster_n=cn) for bn in (64, 128, 256) for cn in (1, 2)}
    assert all(SM90.prune(c.cfg, "sm_90a") is None for c in configs.values())
    search = ModelSearch((SM90,), random.Random(0), targets, "sm_90a", 132)
    for m, n, k in itertools.product((512, 1024, 2048, 4096), (512, 1024, 2048, 4096), (256, 1024, 4096, 8192)):
        for (bn, cn), cand in configs.items():
            us = m * n * k / 2e7 * (0.8 if bn == 128 else 1.0) * (1.0 if cn == 2 else 1.1)
            search.observe_stored(cand, Task(m, n, k), us, current=True)
    assert 64 * len(configs) >= MODEL_MIN_RESULTS
    return search, configs


def _model_plan(measured: Task, unmeasured: Task) -> tuple[ModelSearch, list, dict[tuple[int, int], Candidate]]:
    search, configs = _taught_model_search((measured, unmeasured))
    base = measured.m * measured.n * measured.k / 2e7
    search.observe_stored(configs[(256, 2)], measured, base * 1.0, current=True)
    search.observe_stored(configs[(64, 1)], measured, base * 1.1, current=True)
    plan = [p for p in iter(search.propose, None)]
    assert search.propose() is None  # the plan is spent
    return search, plan, configs


def test_model_proposes_what_the_stored_results_teach():
    measured, unmeasured = Task(3072, 3072, 2048), Task(6144, 1536, 3072)
    search, plan, configs = _model_plan(measured, unmeasured)
    winner = configs[(128, 2)].name
    assert search.forecast[measured][0][0].name == winner  # measured on the neighbouring shapes, not here
    assert search.forecast[unmeasured][0][0].name == winner and len(search.forecast[unmeasured]) == MODEL_PER_SHAPE
    assert search.forecast[measured][0][1] < 0.9 * measured.m * measured.n * measured.k / 2e7  # ~0.8x its incumbent
    by_name = {p.candidate.name: p.shapes for p in plan}
    assert plan[0].candidate.name == winner and by_name[winner] == (measured, unmeasured)
    assert all(measured not in by_name.get(configs[key].name, ()) for key in ((256, 2), (64, 1)))  # measured there


def test_model_gives_no_picks_to_a_shape_where_none_is_predicted_to_come_close(monkeypatch):
    """MODEL_MAX_RATIO: the winner is predicted at ~0.8x the measured shape's incumbent; a shape never measured has
    no incumbent to beat and keeps its picks."""
    monkeypatch.setattr(tune_search, "MODEL_MAX_RATIO", 0.5)
    measured, unmeasured = Task(3072, 3072, 2048), Task(6144, 1536, 3072)
    search, plan, _ = _model_plan(measured, unmeasured)
    assert search.forecast[measured] == [] and len(search.forecast[unmeasured]) == MODEL_PER_SHAPE
    assert all(p.shapes == (unmeasured,) for p in plan)


def test_model_needs_the_stores_results_to_learn_from(tmp_path):
    with pytest.raises(tune.TuneInputError, match="--strategy model learns from the store's results"):
        tune.run(_options(tmp_path, strategy=Strategy.MODEL), TWO_SHAPES)


def test_cublaslt_needs_a_gpus_stored_algorithms(tmp_path):
    with pytest.raises(tune.TuneInputError, match="needs a GPU, or --plan-as with --compile-only"):
        tune.run(_options(tmp_path, strategy=Strategy.CUBLASLT), TWO_SHAPES)


@pytest.mark.skipif(find_cublas() is None, reason="no cuBLAS headers/libraries (set CUDAL2_CUBLAS_HOME)")
def test_cublaslt_tuner_starts_from_the_stored_algorithm(tmp_path, monkeypatch):
    """The tuner decodes the algorithm the harness stored for a shape on this GPU and proposes its nearest config."""
    from tests.sandbox.test_lt_algo import H200_256x512x12288

    monkeypatch.setattr(tune, "detect_gpu", lambda index=0: FAKE_GPU)
    shape, other = Task(256, 512, 12288), Task(512, 512, 512)
    with ResultStore(tmp_path / "r.sqlite") as store:
        store.put_algo(shape, FAKE_GPU.label, CUBLASLT_AUTOTUNED, H200_256x512x12288, 11.56)
        store.put_algo(other, "another GPU", CUBLASLT_AUTOTUNED, H200_256x512x12288, 5.0)
    options = _options(tmp_path, families=("all",), strategy=Strategy.CUBLASLT, compile_only=False)
    with ResultStore(tmp_path / "r.sqlite") as store, TuneLog(store) as log:
        tuner = tune.Tuner(options, [shape, other], store, log, out=lambda line: None)
        first = tuner.strategy.propose()
        # cuBLASLt split K = 12288 in 5: as a batch that needs K % 40 == 0, so the first is the 4-range batch.
        likes = SM90.like_cublaslt(LtAlgo(66, 64, 96, 5, "", 4, 2))
        assert first.candidate.name == config_name(SM90, next(c for c in likes if SM90.supports(c, shape) is None))
        assert first.candidate.cfg.splits == 4
        assert first.shapes == (shape,)  # `other`'s algorithm is another GPU's
        store.put_algo(shape, FAKE_GPU.label, CUBLASLT_AUTOTUNED, "00" * 63, 11.0)
        with pytest.raises(tune.TuneInputError, match="cuBLASLt algorithm of 256x512x12288: .*64 bytes"):
            tune.Tuner(options, [shape], store, log, out=lambda line: None)



def test_cublaslt_tuner_also_follows_the_kernels_cublas_runs(tmp_path, monkeypatch):
    """With --cublas-kernels the plan also holds the configs nearest to the nvjet kernel cuBLAS's heuristic runs (the
    harness's `cublas` baseline) on each target, where no cuBLASLt algorithm is stored; a report that cannot be read is
    one input error."""
    from tests.sandbox.test_cublas_kernels import REPORT

    monkeypatch.setattr(tune, "detect_gpu", lambda index=0: FAKE_GPU)
    (tmp_path / "cublas.txt").write_text(REPORT)
    shape, other = Task(256, 12288, 2048), Task(512, 512, 512)
    options = _options(tmp_path, families=("all",), strategy=Strategy.CUBLASLT, compile_only=False,
                       cublas_kernels=tmp_path / "cublas.txt")
    with ResultStore(tmp_path / "r.sqlite") as store, TuneLog(store) as log:
        tuner = tune.Tuner(options, [shape, other], store, log, out=lambda line: None)
        first = tuner.strategy.propose()
        # cuBLAS's 128 x 192 cooperative tile in a cluster of 2 along M, which no cuBLASLt algorithm suggested
        assert first.candidate.name == config_name(SM90, SM90.like_cublaslt(LtAlgo(-1, 128, 192, 1, "none", 2, 1))[0])
        assert first.shapes == (shape,)  # the report has no kernel for `other`
        (tmp_path / "bad.txt").write_bytes(b"  1.00/call  kernel nvjet grid=1x1x1\n")
        with pytest.raises(tune.TuneInputError, match="--cublas-kernels .*bad.txt: line 1: a kernel before any shape"):
            tune.Tuner(replace(options, cublas_kernels=tmp_path / "bad.txt"), [shape], store, log, out=lambda line: None)
        with pytest.raises(tune.TuneInputError, match="--cublas-kernels .*missing.txt"):
            tune.Tuner(replace(options, cublas_kernels=tmp_path / "missing.txt"), [shape], store, log,
                       out=lambda line: None)

def test_rerender_takes_a_shapes_fastest_stale_configs_first_up_to_its_cap():
    target = Task(512, 512, 8192)
    search = RerenderSearch((SM90,), random.Random(0), (target,))
    search.observe_stored(_sm90(), target, 20.0, current=True)
    stale = [_sm90(scheduler="streamk", bn=bn, splits=splits, swizzle=swizzle)
             for bn in (128, 256) for splits in (1, 2) for swizzle in (1, 2, 4)]
    for i, cand in enumerate(stale):
        search.observe_stored(cand, target, 20.5 + 0.1 * i, current=False)
    assert len(stale) > RERENDER_PER_SHAPE
    assert [p.candidate.name for p in iter(search.propose, None)] == [c.name for c in stale[:RERENDER_PER_SHAPE]]


def test_stored_candidates_give_one_time_per_config_todays_render_first(tmp_path):
    """A config measured as an older render (faster or slower) and as today's render feeds today's time only; one
    measured only as an older render feeds that, marked stale."""
    shape = Task(256, 512, 12288)
    both, stale_only = SMALL.default(), replace(SMALL.default(), warps_k=SMALL.default().warps_k * 2)
    timings = lambda us: {"candidate": Timing(us, us, us, us, us, 0.0, 10)}  # noqa: E731
    with ResultStore(tmp_path / "r.sqlite") as store, TuneLog(store) as log:
        for h, cfg, us in ((source_hash(SMALL.render(both)), both, 9.0), ("1" * 64, both, 7.0),
                           ("2" * 64, stale_only, 8.0), ("3" * 64, stale_only, 10.0)):
            store.put_result(h, FAKE_GPU.label, "offline", ShapeResult(shape, Status.OK, "", 1e-5, timings(us)))
            log.put_config(h, ConfigRecord(SMALL.name, config_name(SMALL, cfg), config_params(cfg)))
        got = tune.stored_candidates(store, log, shape, FAKE_GPU.label, (SMALL,), limit=100)
    assert [(c.candidate.cfg, c.median_us, c.current) for c in got] == [(stale_only, 8.0, False), (both, 9.0, True)]


def test_worst_shapes_ranks_by_the_stored_best_and_puts_unmeasured_first(tmp_path):
    fast, slow, slower, unmeasured = Task(64, 64, 64), Task(128, 64, 64), Task(256, 64, 64), Task(512, 64, 64)
    timings = lambda us: {"candidate": Timing(us, us, us, us, us, 0.0, 10),  # noqa: E731
                          "cublas": Timing(10.0, 10.0, 10.0, 10.0, 10.0, 0.0, 10)}
    with ResultStore(tmp_path / "r.sqlite") as store, TuneLog(store) as log:
        for task, us in ((fast, 5.0), (slow, 20.0), (slower, 40.0)):
            store.put_result("a" * 64, FAKE_GPU.label, "offline", ShapeResult(task, Status.OK, "", 1e-5, timings(us)))
        store.put_result("b" * 64, FAKE_GPU.label, "offline", ShapeResult(fast, Status.OK, "", 1e-5, timings(50.0)))
        store.put_result("c" * 64, "another GPU", "offline", ShapeResult(unmeasured, Status.OK, "", 1e-5, timings(1.0)))
        tasks = [fast, slow, slower, unmeasured]
        assert tune.worst_shapes(store, log, tasks, FAKE_GPU.label, 3) == (unmeasured, slower, slow)
        assert tune.worst_shapes(store, log, tasks, FAKE_GPU.label, 9) == (unmeasured, slower, slow, fast)


def test_won_by_keeps_the_shapes_a_family_wins_on_this_gpu(tmp_path):
    """A family's slower kernel does not keep a shape; a source no family generated keeps it from every family; a
    win on another GPU does not count."""
    won, lost, hand, elsewhere = Task(64, 64, 64), Task(128, 64, 64), Task(256, 64, 64), Task(512, 64, 64)
    small, sm80 = SMALL.default(), SM80.default()
    timings = lambda us: {"candidate": Timing(us, us, us, us, us, 0.0, 10),  # noqa: E731
                          "cublas": Timing(10.0, 10.0, 10.0, 10.0, 10.0, 0.0, 10)}
    with ResultStore(tmp_path / "r.sqlite") as store, TuneLog(store) as log:
        for family, cfg in ((SMALL, small), (SM80, sm80)):
            log.put_config(source_hash(family.render(cfg)), ConfigRecord.of(family, cfg))
        h_small, h_sm80 = source_hash(SMALL.render(small)), source_hash(SM80.render(sm80))
        for task, small_us, sm80_us in ((won, 1.0, 2.0), (lost, 2.0, 1.0), (hand, 2.0, 3.0)):
            store.put_result(h_small, FAKE_GPU.label, "offline", ShapeResult(task, Status.OK, "", 1e-5, timings(small_us)))
            store.put_result(h_sm80, FAKE_GPU.label, "offline", ShapeResult(task, Status.OK, "", 1e-5, timings(sm80_us)))
        store.put_result("f" * 64, FAKE_GPU.label, "offline", ShapeResult(hand, Status.OK, "", 1e-5, timings(0.5)))
        store.put_result(h_small, "another GPU", "offline", ShapeResult(elsewhere, Status.OK, "", 1e-5, timings(1.0)))
        tasks = [won, lost, hand, elsewhere]
        assert tune.won_by(store, log, tasks, FAKE_GPU.label, [SMALL]) == (won,)
        assert tune.won_by(store, log, tasks, FAKE_GPU.label, [SM80]) == (lost,)
        assert tune.won_by(store, log, tasks, FAKE_GPU.label, [SMALL, SM80]) == (won, lost)
        assert tune.won_by(store, log, tasks, "another GPU", [SMALL]) == (elsewhere,)


# ---------------------------------------------------------------------------------------- compile-only runs


def _options(tmp_path: Path, **kw) -> tune.TuneOptions:
    base = dict(families=("small",), strategy=Strategy.RANDOM, max_configs=2, compile_only=True,
                db_path=str(tmp_path / "r.sqlite"), cache_dir=tmp_path / "build", compile_workers=2, budget_s=300)
    return tune.TuneOptions(**{**base, **kw})


@pytest.mark.nvcc
def test_compile_only_run_records_and_a_rerun_resumes_without_compiling(tmp_path):
    lines: list[str] = []
    first = tune.run(_options(tmp_path), TWO_SHAPES, out=lines.append)
    assert (first.submitted, first.resumed, first.cancelled) == (2, 0, 0)
    assert first.statuses[Status.COMPILED.value] == 4 and first.succeeded
    assert first.stop_reason == "--max-configs 2 reached" and len(lines) == 2
    with ResultStore(tmp_path / "r.sqlite") as store, TuneLog(store) as log:
        h = source_hash(SMALL.render(SMALL.default()))  # the first proposal is the default
        assert log.config_of(h) == ConfigRecord("small", tune.Candidate(SMALL, SMALL.default()).name,
                                                {**config_params(SMALL.default()), "acc": "fp32"})
        assert store.get_source(h) == SMALL.render(SMALL.default())
        record = log.compile_of(h, "sm_90a")
        assert record.status == Status.COMPILED and record.registers > 0 and record.spill_bytes == 0
    shutil.rmtree(tmp_path / "build")  # an empty compile cache: anything compiled again would show up in it
    lines.clear()
    second = tune.run(_options(tmp_path), TWO_SHAPES, out=lines.append)
    assert (second.submitted, second.resumed) == (0, 2) and second.succeeded
    assert all("resumed: compiled" in line for line in lines) and len(lines) == 2
    assert not [p for p in (tmp_path / "build").rglob("*.so")]
    third = tune.run(_options(tmp_path, max_configs=3), TWO_SHAPES, out=lines.append)
    assert (third.submitted, third.resumed) == (1, 2)  # goes on after what it has


@pytest.mark.nvcc
def test_time_budget_stops_the_run(tmp_path):
    summary = tune.run(_options(tmp_path, budget_s=1.0, max_configs=100, families=("all",),
                                strategy=Strategy.EVOLUTIONARY), TWO_SHAPES, out=lambda _: None)
    assert summary.stop_reason == "time budget spent"
    assert summary.elapsed_s < 120
    assert summary.submitted >= 1


@pytest.mark.parametrize(("kw", "message"), [
    ({"max_configs": 0}, "must be positive"),
    ({"budget_s": 0}, "must be positive"),
    ({"arch": "sm_xx"}, "bad target"),
    ({"compile_only": False}, "no CUDA GPU"),
    ({"families": ("nope",)}, "unknown family"),
    ({"vary": ("epi_n",)}, "--vary limits --strategy neighbours"),
    ({"strategy": Strategy.NEIGHBOURS, "families": ("sm90_wgmma",), "vary": ("epi_n", "bogus")},
     "--vary bogus: not a parameter"),
    ({"strategy": Strategy.NEIGHBOURS, "vary": ("epi_n",)}, "--vary epi_n: not a parameter"),  # not of `small`
    ({"cublas_kernels": Path("cublas.txt")}, "--cublas-kernels feeds --strategy cublaslt"),
    ({"strategy": Strategy.GIVEN}, "--strategy given measures the configs --configs FILE names"),
    ({"given": ("small-bm32-bn64-warps_m1-warps_n2-warps_k2-k_unroll1-accfp32",)}, "the list goes with it alone"),
    ({"strategy": Strategy.GIVEN, "given": ("sm80_mma-bm16",)}, "its family is not one searched"),
    ({"strategy": Strategy.GIVEN, "given": ("small-bm32-bn64",)}, "config 'small-bm32-bn64': missing parameter"),
])
def test_bad_options_are_input_errors(tmp_path, kw, message):
    with pytest.raises(tune.TuneInputError, match=message):
        tune.run(_options(tmp_path, **kw), TWO_SHAPES)


# ----------------------------------------------------------------------------------------------- queries


def _ok(task: Task, cand_us: float, cublas_us: float) -> ShapeResult:
    def t(us):
        return Timing(us, us, us, us, us, 0.0, 10)

    return ShapeResult(task, Status.OK, "correct and timed", 1e-5,
                       {"candidate": t(cand_us), "cublas": t(cublas_us), "cublaslt_autotuned": t(cublas_us * 1.5)})


def test_best_kernel_per_shape_names_its_config(tmp_path):
    gpu = "NVIDIA H200 (sm_90a)"
    task, other, empty = Task(64, 64, 64), Task(128, 4096, 64), Task(8, 8, 8)
    with ResultStore(tmp_path / "r.sqlite") as store, TuneLog(store) as log:
        fast, slow = SMALL.render(SMALL.default()), SM80.render(SM80.default())
        for source, us in ((fast, 1.0), (slow, 4.0)):
            store.put_source(source_hash(source), source)
            store.put_result(source_hash(source), gpu, "offline", _ok(task, us, 2.0))
        log.put_config(source_hash(fast), ConfigRecord("small", "small-the-fast-one", {}))
        store.put_result("f" * 64, gpu, "offline", _ok(other, 3.0, 3.0))  # not generated by the tuner
        best = tune.best_kernels(store, log, [task, other, empty])
        table = tune.best_table([task, other, empty], best)
    assert [(b.task, b.config, b.median_us) for b in best] == [(task, "small-the-fast-one", 1.0), (other, None, 3.0)]
    assert "| 64_64_64 | fp32 | NVIDIA H200 (sm_90a) | small-the-fast-one | 1.00 | 2.000x | 3.000x |" in table
    assert "(source ffffffffffff)" in table and "| 8_8_8 | fp32 | - | - | - | - | - |" in table


# --------------------------------------------------------------------------------------------------- CLI


@pytest.mark.nvcc
def test_cli_compile_only_then_show(capsys, tmp_path):
    db = str(tmp_path / "r.sqlite")
    code, out, err = run_cli(capsys, "tune", "--mnk", "64_64_64", "--mnk", "77_1000_333", "--family", "small",
                             "--max-configs", "1", "--compile-only", "--db", db, "--jobs", "1")
    assert code == 0, err
    assert "small-bm32-bn64" in out and "1 configs (1 sent in 1 jobs" in out
    code, out, _ = run_cli(capsys, "tune", "--mnk", "64_64_64", "--show", "--db", db)
    assert code == 0 and "| 64_64_64 | fp32 | - |" in out


def test_read_config_names_skips_comments_and_blank_lines(tmp_path):
    listed = tmp_path / "configs.txt"
    listed.write_text("# long K\nsmall-bm16-bn16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32-grid_k8  # 8 groups\n\n")
    assert tune.read_config_names(listed) == ("small-bm16-bn16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32-grid_k8",)
    listed.write_text("# nothing\n")
    with pytest.raises(tune.TuneInputError, match="no config names in it"):
        tune.read_config_names(listed)


def test_several_config_lists_give_each_name_once_in_file_order(tmp_path):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("small-bm16-bn16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32-grid_k8\nsm80_mma-x\n")
    second.write_text("sm80_mma-x\nsmall-bm32\n")
    assert tune.read_config_lists([first, second]) == (
        "small-bm16-bn16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32-grid_k8", "sm80_mma-x", "small-bm32")
    with pytest.raises(tune.TuneInputError, match="cannot read it"):
        tune.read_config_lists([first, tmp_path / "missing.txt"])


@pytest.mark.nvcc
def test_cli_given_takes_several_config_files(capsys, tmp_path):
    grid_k = "small-bm16-bn16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32-grid_k8"
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text(f"{grid_k}\n")
    second.write_text(f"{grid_k}\nsmall-bm16-bn16-warps_m1-warps_n2-warps_k4-k_unroll2-accfp32-cluster_k16-push1\n")
    code, out, err = run_cli(capsys, "tune", "--mnk", "64_64_4096", "--strategy", "given", "--configs", str(first),
                             str(second), "--compile-only", "--db", str(tmp_path / "r.sqlite"), "--jobs", "1")
    assert code == 0, err
    assert "2 configs (2 sent in 2 jobs" in out and "cluster_k16-push1" in out


def test_the_committed_config_lists_name_configs_worth_compiling():
    for listed in sorted((ROOT / "benchmarks" / "given").glob("*.txt")):
        names = tune.read_config_names(listed)
        for name in names:
            cand = tune.candidate_named(tune.FAMILIES, name)
            assert cand.family.prune(cand.cfg, "sm_90a") is None, name
        assert len(set(names)) == len(names), listed


@pytest.mark.parametrize("argv", [
    ["--mnk", "64_64"],
    ["--shapes", "/no/such.csv", "--compile-only"],
    ["--compile-only"],
    ["--mnk", "64_64_64", "--budget-minutes", "-1", "--compile-only"],
    ["--mnk", "64_64_64"],  # no GPU here and not --compile-only
    ["--mnk", "64_64_64", "--worst", "1", "--compile-only"],  # --worst ranks GPU results
    ["--mnk", "64_64_64", "--worst", "-1", "--compile-only"],
    ["--mnk", "64_64_64", "--won-only", "--compile-only"],  # --won-only reads GPU results too
    ["--mnk", "64_64_64", "--vary", "epi_n", "--compile-only"],  # --vary needs --strategy neighbours
    ["--mnk", "64_64_64", "--strategy", "given", "--configs", "/no/such.txt", "--compile-only"],
    ["--mnk", "64_64_64", "--strategy", "given", "--compile-only"],  # given needs --configs
])
def test_cli_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv):
    code, out, err = run_cli(capsys, "tune", *argv, "--db", str(tmp_path / "r.sqlite"))
    assert code == 2 and err.startswith("cudal2: error: ") and len(err.strip().splitlines()) == 1


# --------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_gpu_tuning_run_finds_verified_kernels(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDAL2_NO_GPU")
    # Random, not the default evolutionary: an evolutionary re-run breeds new configs from the first run's stored
    # times (its warm start), so only a random re-run proposes exactly the same configs and can resume them all.
    options = tune.TuneOptions(families=("all",), strategy=Strategy.RANDOM, max_configs=4, budget_s=240,
                               db_path=str(tmp_path / "r.sqlite"), cache_dir=tmp_path / "build", target_ms=20)
    summary = tune.run(options, TWO_SHAPES)
    assert summary.statuses[Status.OK.value] > 0
    assert {b.task for b in summary.best} == set(TWO_SHAPES)
    assert all(b.config and b.speedups.get("cublas") for b in summary.best)
    again = tune.run(options, TWO_SHAPES)
    assert again.submitted == 0 and again.resumed == summary.configs


# ------------------------------------------------------------------------------- the GPU path, simulated GPU


SIMULATED = RunnerSpec("tests.tune_fakes:simulated_gpu")


@pytest.mark.nvcc
def test_gpu_path_ranks_resumes_and_reports_with_a_simulated_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(tune, "detect_gpu", lambda index=0: FAKE_GPU)
    options = _options(tmp_path, compile_only=False, max_configs=3)
    lines: list[str] = []
    first = tune.run(options, TWO_SHAPES, out=lines.append, runner=SIMULATED)
    assert (first.submitted, first.statuses[Status.OK.value]) == (3, 6) and first.warm_start == 0
    with ResultStore(tmp_path / "r.sqlite") as store, TuneLog(store) as log:
        measured = {}
        for task in TWO_SHAPES:
            for h, res in store.best(task, FAKE_GPU.label, baseline=None, limit=10):
                assert res.timings["candidate"].median_us == simulated_us(h, task.mnk)
                measured.setdefault(task, []).append((res.timings["candidate"].median_us, log.config_of(h).name))
    assert all(len(v) == 3 for v in measured.values())
    for b in first.best:  # the fastest of the three, named by its config, speedups from the stored baselines
        assert (b.median_us, b.config) == min(measured[b.task])
        assert b.speedups["cublas"] == pytest.approx(BASELINE_US / b.median_us)
    assert any("best so far on" in line for line in lines)
    second = tune.run(options, TWO_SHAPES, out=lines.append, runner=SIMULATED)
    assert (second.submitted, second.resumed, second.warm_start) == (0, 3, 6)
    assert second.best == first.best
    evolutionary = tune.run(replace(options, strategy=Strategy.EVOLUTIONARY, max_configs=6), TWO_SHAPES,
                            out=lines.append, runner=SIMULATED)
    assert evolutionary.warm_start == 6 and evolutionary.submitted >= 1
    assert min(b.median_us for b in evolutionary.best) <= min(b.median_us for b in first.best)


def test_given_run_measures_the_listed_configs_then_resumes_them(tmp_path, monkeypatch):
    monkeypatch.setattr(tune, "detect_gpu", lambda index=0: FAKE_GPU)
    listed = [replace(SMALL.default(), grid_k=g) for g in (4, 1, 2)]
    names = tuple(config_name(SMALL, c) for c in listed)
    options = _options(tmp_path, compile_only=False, strategy=Strategy.GIVEN, given=names, max_configs=10)
    first = tune.run(options, TWO_SHAPES, out=lambda _: None, runner=SIMULATED)
    assert (first.submitted, first.statuses[Status.OK.value], first.stop_reason) == (3, 6, "the strategy has proposed everything it had")
    with ResultStore(tmp_path / "r.sqlite") as store, TuneLog(store) as log:
        for cfg in listed:  # each measured on both shapes and named in the tuner's table
            h = source_hash(SMALL.render(cfg))
            assert log.config_of(h).name == config_name(SMALL, cfg)
            assert all(store.best(t, FAKE_GPU.label, baseline=None, limit=10) for t in TWO_SHAPES)
    again = tune.run(options, TWO_SHAPES, out=lambda _: None, runner=SIMULATED)
    assert (again.submitted, again.resumed) == (0, 3)


@pytest.mark.nvcc
def test_retry_measures_again_the_pairs_a_stored_run_failure_answers(tmp_path, monkeypatch):
    """A stored rejection is resumed from (the config stays barred on that shape) unless --retry names its status;
    then the pair runs again and its new result answers from then on (the store is append-only)."""
    monkeypatch.setattr(tune, "detect_gpu", lambda index=0: FAKE_GPU)
    options = _options(tmp_path, compile_only=False, max_configs=1)
    tune.run(options, TWO_SHAPES, out=lambda line: None, runner=SIMULATED)
    rejected = ShapeResult(TWO_SHAPES[0], Status.REJECTED_BEHAVIOUR, "GPU work still running 0.60 ms after the "
                           "call's stream finished")
    with ResultStore(tmp_path / "r.sqlite") as store:
        ((h, _),) = store.best(TWO_SHAPES[0], FAKE_GPU.label, baseline=None, limit=10)
        store.put_result(h, FAKE_GPU.label, Mode.OFFLINE, rejected)
    lines: list[str] = []
    served = tune.run(options, TWO_SHAPES, out=lines.append, runner=SIMULATED)
    assert (served.submitted, served.resumed) == (0, 1)
    assert "resumed" in lines[0] and "rejected_behaviour" in lines[0], lines
    other = tune.run(replace(options, retry=frozenset({Status.WRONG_ANSWER})), TWO_SHAPES, out=lambda line: None,
                     runner=SIMULATED)
    assert (other.submitted, other.resumed) == (0, 1)  # only the statuses named are measured again
    retried = tune.run(replace(options, retry=frozenset({Status.REJECTED_BEHAVIOUR})), TWO_SHAPES,
                       out=lambda line: None, runner=SIMULATED)
    assert (retried.submitted, retried.resumed) == (1, 0) and retried.statuses[Status.OK.value] == 2
    with ResultStore(tmp_path / "r.sqlite") as store:
        again = store.get_result(h, TWO_SHAPES[0], FAKE_GPU.label, Mode.OFFLINE)
    assert again.status == Status.OK and again.timings["candidate"].median_us == simulated_us(h, TWO_SHAPES[0].mnk)


def _stored_config_names(db: Path) -> set[str]:
    with closing(sqlite3.connect(db)) as conn:
        return {name for (name,) in conn.execute("SELECT config FROM tune_configs")}


@pytest.mark.nvcc
def test_plan_as_precompiles_what_the_gpu_run_then_proposes_and_serves_it_from_the_cache(tmp_path, monkeypatch):
    """`--compile-only --plan-as GPU` on a CPU machine plans as that GPU's run would (worst shapes, warm start from
    its results) and fills the compile cache; the GPU run then proposes the same configs and compiles none."""
    monkeypatch.setattr(tune, "detect_gpu", lambda index=0: FAKE_GPU)
    measured = _options(tmp_path, compile_only=False, max_configs=1)
    tune.run(measured, TWO_SHAPES, out=lambda line: None, runner=SIMULATED)  # the GPU's stored results
    before = _stored_config_names(tmp_path / "r.sqlite")
    plan = replace(measured, compile_only=True, strategy=Strategy.NEIGHBOURS, worst=1, max_configs=2)
    with pytest.raises(tune.TuneInputError, match="--worst ranks a GPU's stored results"):
        tune.run(plan, TWO_SHAPES)
    with pytest.raises(tune.TuneInputError, match="--plan-as: .*matches none"):
        tune.run(replace(plan, plan_as="a100"), TWO_SHAPES)
    with pytest.raises(tune.TuneInputError, match="a GPU run plans as itself"):
        tune.run(replace(plan, compile_only=False, plan_as="simulated"), TWO_SHAPES)
    precompiled = tune.run(replace(plan, plan_as="simulated"), TWO_SHAPES, out=lambda line: None)
    assert precompiled.warm_start > 0 and precompiled.submitted == 2
    assert precompiled.statuses[Status.COMPILED.value] == 2  # one shape: the worst
    planned = _stored_config_names(tmp_path / "r.sqlite") - before
    libraries = sorted((tmp_path / "build").rglob("*.so"))
    on_gpu = tune.run(replace(plan, compile_only=False), TWO_SHAPES, out=lambda line: None, runner=SIMULATED)
    assert on_gpu.submitted == 2 and on_gpu.statuses[Status.OK.value] == 2
    assert _stored_config_names(tmp_path / "r.sqlite") - before == planned and len(planned) == 2
    assert sorted((tmp_path / "build").rglob("*.so")) == libraries  # nothing compiled again
    # Precompiling again into an empty cache compiles again: the store's compile outcomes are no library.
    shutil.rmtree(tmp_path / "build")
    again = tune.run(replace(plan, strategy=Strategy.RANDOM, plan_as="simulated"), TWO_SHAPES, out=lambda line: None)
    assert (again.submitted, again.resumed) == (2, 0) and len(list((tmp_path / "build").rglob("*.so"))) == 2


def _commit_store(db: Path, gz: Path) -> None:
    """db as benchmarks/stores holds it: one gzipped file (its write-ahead log checkpointed in first)."""
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    gz.write_bytes(gzip.compress(db.read_bytes(), mtime=0))


def _precompile(tmp_path: Path, store: Path, configs: int) -> set[str]:
    """Run scripts/precompile.sh as a user would (`configs` small configs planned on `store` by --strategy random,
    whose first is the family's default; packed under tmp_path/packs); returns the cache keys in its pack."""
    bin_dir = tmp_path / "bin"  # the script runs `python3`: this interpreter, with cudal2 importable
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").unlink(missing_ok=True)
    (bin_dir / "python3").symlink_to(sys.executable)
    shapes = tmp_path / "shapes.csv"
    write_csv([ShapeRow(t.m, t.n, t.k, "fp32", "train", "test") for t in TWO_SHAPES], shapes)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GRID_STORE": str(store), "PLAN_AS": "simulated",
           "PRECOMPILED_DIR": str(tmp_path / "packs")}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "precompile.sh"), "2", "--shapes", str(shapes), "--family",
                           "small", "--strategy", "random", "--max-configs", str(configs)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    with tarfile.open(tmp_path / "packs" / "build.tar.gz") as pack:
        return {Path(name).parent.name for name in pack.getnames() if name.endswith("candidate.so")}


@pytest.mark.nvcc
def test_precompile_pack_adds_on_the_same_store_and_keeps_only_what_the_plan_used_on_a_new_one(tmp_path, monkeypatch):
    """The carried pack must not grow past the carry limit: on a changed store only the plan's own libraries stay."""
    monkeypatch.setattr(tune, "detect_gpu", lambda index=0: FAKE_GPU)
    tune.run(_options(tmp_path, compile_only=False, max_configs=1), TWO_SHAPES, out=lambda line: None,
             runner=SIMULATED)  # the GPU's stored results, which --plan-as plans from
    store = tmp_path / "store.sqlite.gz"
    _commit_store(tmp_path / "r.sqlite", store)
    first = _precompile(tmp_path, store, configs=1)
    both = _precompile(tmp_path, store, configs=2)  # same store: the pack grows
    assert len(first) == 1 and len(both) == 2 and first < both
    tune.run(_options(tmp_path, compile_only=False, max_configs=2), TWO_SHAPES, out=lambda line: None,
             runner=SIMULATED)  # a later GPU session's results committed
    _commit_store(tmp_path / "r.sqlite", store)
    assert _precompile(tmp_path, store, configs=1) == first  # the default served from the pack, the other dropped


@pytest.mark.nvcc
def test_transfer_run_covers_a_larger_set_in_chunks_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setattr(tune, "detect_gpu", lambda index=0: FAKE_GPU)
    monkeypatch.setattr(tune, "MAX_JOB_SHAPES", 2)
    options = _options(tmp_path, compile_only=False, max_configs=3)
    tuned = tune.run(options, TWO_SHAPES, runner=SIMULATED)  # the "sample": 3 configs on 2 shapes
    assert tuned.statuses[Status.OK.value] == 6
    grid = [*TWO_SHAPES, Task(64, 128, 64), Task(128, 64, 64), Task(80, 1000, 333), Task(77, 1024, 320)]
    transfer = replace(options, strategy=Strategy.TRANSFER, max_configs=50)
    lines: list[str] = []
    first = tune.run(transfer, grid, out=lines.append, runner=SIMULATED)
    assert first.stop_reason == "the strategy has proposed everything it had"
    assert first.warm_start == 6 and first.submitted >= 1 and first.jobs > first.submitted  # chunks of 2 shapes
    assert {b.task for b in first.best} == set(grid)  # every shape has a verified kernel now
    assert all(len(line.split("(")[1].split(" shape")[0]) <= 2 for line in lines if "shape" in line)
    again = tune.run(transfer, grid, runner=SIMULATED)
    assert again.submitted == 0 and again.resumed >= first.submitted
    elsewhere = tune.run(transfer, [Task(64, 64, 128)], runner=SIMULATED)  # lends from the store's other shapes
    assert elsewhere.warm_start >= 6 and [b.task for b in elsewhere.best] == [Task(64, 64, 128)]
    with ResultStore(tmp_path / "r.sqlite") as store, TuneLog(store) as log:
        ranked = sorted(tune.best_kernels(store, log, grid, [FAKE_GPU.label]), key=lambda b: b.speedups["cublas"])
    worst = tune.run(replace(options, strategy=Strategy.RANDOM, max_configs=6, worst=2), grid, runner=SIMULATED)
    assert worst.shapes == tuple(b.task for b in ranked[:2])  # the two where the stored best is slowest
    assert worst.submitted >= 1 and {b.task for b in worst.best} == set(worst.shapes)
    with ResultStore(tmp_path / "r.sqlite") as store, TuneLog(store) as log:
        slowest = tune.worst_shapes(store, log, grid, FAKE_GPU.label, 1)  # after the run above measured more
    won = tune.run(replace(options, strategy=Strategy.NEIGHBOURS, max_configs=1, worst=1, won_only=True), grid,
                   runner=SIMULATED)  # small won every shape here: --won-only keeps them all, then --worst the worst
    assert won.shapes == slowest
    none = tune.run(replace(options, families=("sm80_mma",), strategy=Strategy.NEIGHBOURS, won_only=True), grid,
                    runner=SIMULATED)
    assert none.shapes == () and none.submitted == 0


@pytest.mark.nvcc
def test_fill_run_recuts_stored_winners_on_a_simulated_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(tune, "detect_gpu", lambda index=0: FAKE_GPU)
    options = _options(tmp_path, compile_only=False, families=("sm80_mma",), max_configs=1)
    shapes = [Task(64, 64, 4096), Task(128, 256, 8192)]  # 1 and 2 output tiles of 128x128, long K
    tune.run(options, shapes, runner=SIMULATED)  # the default (no split-K) measured: the parent
    fill = tune.run(replace(options, strategy=Strategy.FILL, max_configs=50), shapes, runner=SIMULATED)
    assert fill.stop_reason == "the strategy has proposed everything it had"
    assert fill.warm_start == 2 and fill.submitted >= FILL_PER_SHAPE
    with ResultStore(tmp_path / "r.sqlite") as store, TuneLog(store) as log:
        for task in shapes:
            configs = [log.config_of(h) for h, _ in store.best(task, FAKE_GPU.label, baseline=None, limit=50)]
            assert len(configs) >= 1 + FILL_PER_SHAPE  # the parent plus the new cuts (split-K), all measured
            assert len({c.params["split_k"] for c in configs}) > 1
    again = tune.run(replace(options, strategy=Strategy.FILL, max_configs=50), shapes, runner=SIMULATED)
    # A re-run plans afresh from the grown store (new winners, new parents) and never measures a cut twice.
    assert again.warm_start > fill.warm_start
    with closing(sqlite3.connect(tmp_path / "r.sqlite")) as db:
        per_key = db.execute("SELECT COUNT(*) FROM results GROUP BY source_hash, m, n, k").fetchall()
    assert per_key and all(n == 1 for (n,) in per_key)


@pytest.mark.nvcc
def test_rerender_run_measures_todays_render_of_a_stale_stored_config(tmp_path, monkeypatch):
    """A config whose stored source is not what it renders today (its family's code changed) is measured again as
    today's render on the shape where it was close; the old result stays, and a re-run has nothing left to do."""
    monkeypatch.setattr(tune, "detect_gpu", lambda index=0: FAKE_GPU)
    options = _options(tmp_path, compile_only=False, max_configs=1)
    shape = TWO_SHAPES[0]
    measured = tune.run(options, [shape], runner=SIMULATED)  # the family default, today's render
    (best,) = measured.best
    stale_cfg = replace(SMALL.default(), warps_k=SMALL.default().warps_k * 2)
    stale_hash = "5" * 64  # as if measured from an older render of that config
    timings = {"candidate": Timing(*(best.median_us + 1.0,) * 5, 0.0, 10),
               "cublas": Timing(*(BASELINE_US,) * 5, 0.0, 10)}
    with ResultStore(tmp_path / "r.sqlite") as store, TuneLog(store) as log:
        store.put_result(stale_hash, FAKE_GPU.label, "offline", ShapeResult(shape, Status.OK, "", 1e-5, timings))
        log.put_config(stale_hash, ConfigRecord(SMALL.name, config_name(SMALL, stale_cfg), config_params(stale_cfg)))
    rerender = replace(options, strategy=Strategy.RERENDER, max_configs=50)
    first = tune.run(rerender, [shape], runner=SIMULATED)
    assert first.submitted == 1 and first.stop_reason == "the strategy has proposed everything it had"
    with ResultStore(tmp_path / "r.sqlite") as store:
        today = store.get_result(source_hash(SMALL.render(stale_cfg)), shape, FAKE_GPU.label, "offline")
        assert today is not None and today.status is Status.OK
        assert store.get_result(stale_hash, shape, FAKE_GPU.label, "offline") is not None  # kept
    again = tune.run(rerender, [shape], runner=SIMULATED)
    assert again.submitted == 0 and again.proposals == 0


def _benchmark(name: str):
    """A script of benchmarks/ as a module (they are scripts, not a package)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module(name)


COMMITTED_STORE = ROOT / "benchmarks" / "stores" / "h200_grid.sqlite.gz"


# The last result of the store as the fourth session committed it (2026-11-29 17:21 UTC), before fill ran with the
# fitted constants: later results were measured because the model ranked them first, which says nothing about it.
FITTED_ON_STORE_UNTIL = 1795972871.0


def test_wave_model_ranks_the_committed_h200_store_better_than_chance(tmp_path):
    """benchmarks/wave_model_check.py on the held-out split of the committed grid store as it was when the model's
    constants were fitted: the measured best of a (shape, family) is among the model's first 3 picks more often than
    among 3 random ones."""
    check = _benchmark("wave_model_check")
    db = check.open_db(COMMITTED_STORE, tmp_path, until=FITTED_ON_STORE_UNTIL)
    # The families the constants were fitted on: the small family's configs then had no cut to vary (cluster_k
    # came later), so its groups differ in the kernel body alone, which the wave model does not describe.
    groups = check.load_groups(db, tune.load_tasks(f"{GRID}:heldout", [], "fp32"), "h200", (SM80.name, SM90.name))
    s = check.score(groups, 132)
    assert s["groups"] > 100 and s["top3"] > s["random_top3"] + 0.1 and s["spearman"] > 0.1


# The store as the eighteenth session left it: the nineteenth session's basic winners differ more from one shape to
# its neighbours (on the whole store the hit falls to 0.80 at 4.67 picks, benchmarks/RESULTS.md), which says something
# about the store, not about transfer's code that this test checks.
TRANSFER_CHECKED_UNTIL = 1796105779.0


def test_transfer_leave_one_out_on_the_committed_h200_store(tmp_path):
    """benchmarks/transfer_check.py with the committed constants on the held-out grid split: planned from the other
    shapes alone, transfer picks a near-best config for most shapes, at a few picks per shape."""
    check = _benchmark("transfer_check")
    measured = check.load(check.open_db(COMMITTED_STORE, tmp_path, TRANSFER_CHECKED_UNTIL), "h200")
    heldout = tune.load_tasks(f"{GRID}:heldout", [], "fp32")
    s = check.check(measured, heldout, tune_search.TRANSFER_NEIGHBOURS, tune_search.TRANSFER_TOP)
    # Picks are distinct configs among the 6 nearest shapes' winners: 4.08 per shape (hit 0.97) on the store of the
    # thirteenth session, where epi_n variants made neighbouring winners differ more often than before (<= 4).
    assert s["shapes"] == len(heldout) and s["picks"] <= 5 and s["hit"] > 0.85


# The store as the twenty-first session left it (2 folds: top-3 hit 80.4%). The twenty-second session's results, the
# model's own picks, moved the fastest config of many shapes and the hit to 79.3% (benchmarks/RESULTS.md): that says
# something about the store, not about the model's code that this test checks.
COST_MODEL_CHECKED_UNTIL = 1796131842.0
# The newest result before delta 0006 (forty-third session), whose re-timed small configs change the model's picks.
MODEL_PLANNED_ON_STORE_UNTIL = 1796467451.0


def test_cost_model_ranks_held_out_shapes_of_the_committed_h200_store_better_than_transfer():
    """benchmarks/cost_model_check.py with two folds: fitted on half the shapes, the model's first pick on the other
    half is closer to the fastest measured config than transfer's (the same config's time on the nearest shape) and
    the wave model's, and its top 3 hold a near-best config on most shapes (5 folds: 1.035x, 87.7%;
    benchmarks/RESULTS.md)."""
    check = _benchmark("cost_model_check")
    measured = check.load_copy(COMMITTED_STORE, "h200", COST_MODEL_CHECKED_UNTIL)
    ranked, ratios = check.rank_scores(measured, folds=2, sms=132)

    def first_pick(rule: str) -> float:
        return math.exp(statistics.fmean(math.log(r[0]) for r in ranked[rule]))

    assert len(ranked["model"]) > 1000 and len(ratios) == sum(len(c) for c in measured.values())
    assert first_pick("model") < 1.06 and first_pick("model") < first_pick("transfer") < first_pick("random")
    assert first_pick("model") < first_pick("wave")
    assert sum(min(r[:3]) <= 1.03 for r in ranked["model"]) > 0.8 * len(ranked["model"])


def test_cost_model_check_looks_back_at_the_picks_later_runs_measured():
    """cost_model_check --since: planned from the results before a cut, the model's pick that a later run measured
    is scored against the shape's fastest time before the cut; so is everything measured anew."""
    check = _benchmark("cost_model_check")
    search, configs = _taught_model_search(())
    before: dict = {}
    for (task, name), (cand, us) in search._times.items():
        before.setdefault(task, {})[name] = (cand, us)
    target = Task(3072, 3072, 2048)
    base = target.m * target.n * target.k / 2e7
    before[target] = {configs[(256, 2)].name: (configs[(256, 2)], base), configs[(64, 1)].name: (configs[(64, 1)], base * 1.1)}
    after = {t: dict(c) for t, c in before.items()}
    after[target][configs[(128, 2)].name] = (configs[(128, 2)], base * 0.8)  # the model's first pick, measured later
    after[target][configs[(64, 2)].name] = (configs[(64, 2)], base * 1.25)  # something else measured later
    table = check.retrospect(before, after, [target], 132).splitlines()
    assert table[2].startswith("| the model's picks | ")
    assert table[3] == "| the model's first picks | 1 | 100.0% | 0.8000 |"
    assert table[4] == f"| every pair the later runs measured anew | 2 | 50.0% | {math.sqrt(0.8 * 1.25):.4f} |"


@pytest.mark.nvcc
def test_model_plans_from_the_committed_store_and_precompiles_its_first_pick(tmp_path):
    """`tune --strategy model --compile-only --plan-as h200` on a CPU machine: fitted on the store's small-family
    results, it plans and compiles the first config it predicts for two small shapes the store has not measured (on
    its measured small shapes the family is tuned out: no config is predicted within MODEL_MAX_RATIO of their best).
    The store as it was before delta 0006: which configs the model picks follows the results it is fitted on."""
    db = _benchmark("wave_model_check").open_db(COMMITTED_STORE, tmp_path, until=MODEL_PLANNED_ON_STORE_UNTIL)
    options = _options(tmp_path, strategy=Strategy.MODEL, plan_as="h200", db_path=str(db), max_configs=1)
    lines: list[str] = []
    summary = tune.run(options, [Task(96, 160, 320), Task(200, 72, 136)], out=lines.append)
    assert summary.warm_start >= MODEL_MIN_RESULTS and summary.submitted == 1
    assert summary.statuses[Status.COMPILED.value] == 2  # one per shape


def test_every_config_in_the_committed_store_renders_to_its_stored_source(tmp_path):
    """A family change (e.g. a parameter added later, `ADDED_LATER`) must leave every stored config's source as it
    was measured: otherwise resumption, transfer and fill lose the store's results. The deliberate exceptions:
    sm90 stream-K sources as measured before commit b946c64, which cleared their flags through CUTLASS's
    initialize() (a memset node); sm90 tiles whose N needs CuTe's extended wgmma shapes, as measured before they
    had them (several narrower wgmmas per K step); and split-K sources whose splitk_reduce runs (sm90 as a batch,
    sm80 through the workspace) as measured before e360e52, which added one split's partial at a time; and the
    last-arrival reductions (small grid_k, sm80 reduce=last) as measured with a fence in every thread, before the
    shared `last_arrival` helper fenced once per CTA. `tune --strategy rerender` measures their new renders."""
    db = _benchmark("wave_model_check").open_db(COMMITTED_STORE, tmp_path)
    with closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT t.source_hash, t.family, t.params_json, s.source FROM tune_configs t"
                            " JOIN sources s USING (source_hash)").fetchall()
    families = {f.name: f for f in tune.FAMILIES}
    assert len(rows) > 300
    rerendered = {"streamk": 0, "extended": 0, "reduce": 0, "last_arrival": 0}
    for stored_hash, family, params, stored_source in rows:
        f = families[family]
        cfg = f.make(json.loads(params))
        today = f.render(cfg)
        if source_hash(today) == stored_hash:
            continue
        if f.tiling(cfg).last_arrival:
            assert "fence_gpu();      // this thread's" in stored_source and "last_arrival(" not in stored_source
            assert cuda_parts.LAST_ARRIVAL_SYNC in today
            rerendered["last_arrival"] += 1
            continue
        if (older := _one_by_one_reduce(family, cfg, today)) is not None:
            rerendered["reduce"] += 1
            if source_hash(older) == stored_hash:
                continue
            today = older
        assert family == SM90.name, (family, params)
        if extended_gmma(cfg):  # measured before the define: today's source is the stored one plus the define
            today = today.replace(EXTENDED_GMMA_DEFINE, "", 1)
            rerendered["extended"] += 1
            if source_hash(today) == stored_hash:
                continue
        assert cfg.scheduler.value == "streamk", params
        assert "gemm.initialize(args, workspace, stream)" in stored_source and "clear_flags" in today
        rerendered["streamk"] += 1
    assert rerendered["streamk"] > 0 and rerendered["extended"] > 0 and rerendered["reduce"] > 0
    assert rerendered["last_arrival"] == 9  # 5 small grid_k and 4 sm80 reduce=last configs, measured in delta 0001


def _one_by_one_reduce(family: str, cfg, today: str) -> str | None:
    """Today's source with splitk_reduce's batched loads put back to the one-by-one loop, for the configs that run
    it (None for the others, whose render never changed)."""
    runs = batched_split_k(cfg) if family == SM90.name else (family == "sm80_mma" and cfg.split_k > 1
                                                              and cfg.reduce is Reduce.WORKSPACE)
    if not runs:
        return None
    wait = getattr(cfg, "pdl", False)
    batched, older = (cuda_parts.splitk_reduce(wait=wait, batched=b) for b in (True, False))
    assert batched in today
    return today.replace(batched, older, 1)


def test_new_bests_tallies_runs_and_kinds_against_the_shapes_earlier_best(tmp_path, capsys):
    """benchmarks/new_bests.py: a result counts as a new best only when it beats every earlier offline result of its
    shape (the ones before --since too); runs are cut at gaps; confirm-mode and failed results are not tallied."""
    check = _benchmark("new_bests")
    db, gpu, shape = tmp_path / "s.sqlite", "NVIDIA H200 (sm_90a)", Task(256, 512, 1024)
    basic = _sm90(bm=128, bn=128, cluster_n=1, schedule="basic")
    rows = [  # (config, mode, status, median us, created)
        (_sm90(), Mode.OFFLINE, Status.OK, 10.0, 100.0),  # before the cut: the shape's best is 10 us
        (_sm90(bn=128), Mode.OFFLINE, Status.OK, 11.0, 1000.0),  # run 1: slower, no new best
        (basic, Mode.OFFLINE, Status.OK, 9.0, 1010.0),  # run 1: a new best
        (basic, Mode.CONFIRM, Status.OK, 8.0, 1011.0),  # confirm mode: not tallied
        (_sm90(bn=64), Mode.OFFLINE, Status.WRONG_ANSWER, 1.0, 1012.0),  # not verified: not tallied
        (Candidate(SMALL, SMALL.default()), Mode.OFFLINE, Status.OK, 8.5, 2000.0),  # run 2 (a gap): a new best
        (_sm90(bn=128), Mode.OFFLINE, Status.OK, 9.5, 2001.0),  # run 2: beats 10 but not 8.5
    ]
    with ResultStore(db) as store, TuneLog(store) as log:
        for cand, mode, status, us, _created in rows:
            source = cand.family.render(cand.cfg)
            h = source_hash(source)
            store.put_source(h, source)
            log.put_config(h, ConfigRecord(cand.family.name, cand.name, config_params(cand.cfg)))
            t = Timing(us, us, us, us, us, 0.0, 10)
            store.put_result(h, gpu, mode, ShapeResult(shape, status, "", 1e-5, {"candidate": t, "cublas": t}))
    with closing(sqlite3.connect(db)) as conn, conn:
        for row_id, (*_, created) in enumerate(rows, start=1):
            conn.execute("UPDATE results SET created = ? WHERE id = ?", (created, row_id))
    before, after = check.load(db, gpu, since=500.0)
    assert before == {(256, 512, 1024, "fp32"): 10.0} and [m.us for m in after] == [11.0, 9.0, 8.5, 9.5]
    runs, kinds = check.tally(before, after, gap=45.0)
    assert [(r.evaluations, len(r.configs), r.new_bests) for r in runs] == [(2, 2, 1), (2, 2, 1)]
    assert {k: (t.evaluations, t.new_bests) for k, t in kinds.items()} == {
        "sm90_wgmma cooperative": (2, 0), "sm90_wgmma basic": (1, 1), "small": (1, 1)}
    _, by_param = check.tally(*check.load(db, gpu, since=500.0, by=("bn", "k_unroll")), gap=45.0)
    assert {k: t.new_bests for k, t in by_param.items()} == {  # sm90 has no k_unroll: left out of its kinds
        "sm90_wgmma cooperative bn=128": 0, "sm90_wgmma basic bn=128": 1, "small bn=64 k_unroll=1": 1}
    with closing(sqlite3.connect(db)) as conn, conn:  # basic as stored before sm90 had ctas_per_sm: its default
        params = {k: v for k, v in config_params(basic.cfg).items() if k != "ctas_per_sm"}
        conn.execute("UPDATE tune_configs SET params_json = ? WHERE source_hash = ?",
                     (json.dumps(params, default=str), source_hash(basic.family.render(basic.cfg))))
    _, by_ctas = check.tally(*check.load(db, gpu, since=500.0, by=("ctas_per_sm",)), gap=45.0)
    assert set(by_ctas) == {"sm90_wgmma cooperative ctas_per_sm=1", "sm90_wgmma basic ctas_per_sm=1", "small"}
    table = check.table(runs, kinds).splitlines()
    assert table[2] == "| 1 (+0 s, 10 s) | 2 | 2 | 1 | 0.500 |"
    assert table[3] == "| 2 (+1000 s, 1 s) | 2 | 2 | 1 | 0.500 |"
    assert check.main(["--db", str(db), "--since", "500", "--gpu", "a100"]) == 2  # one line, no traceback
    other = tmp_path / "other.csv"
    other.write_text("M,N,K,acc,split,source\n64,64,64,fp32,train,test\n")
    assert check.main(["--db", str(db), "--since", "500", "--shapes", str(other)]) == 0
    assert capsys.readouterr().out.startswith("0 verified offline results")  # not among the set's shapes
    assert check.main(["--db", str(db), "--since", "500", "--shapes", str(tmp_path / "missing.csv")]) == 2
