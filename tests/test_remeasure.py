"""`cudal2 remeasure`: the plan on a fixture store (grouping, chunking, skipping), a run through the pool with the
simulated GPU of tests/tune_fakes.py, the time budget, the CLI's errors; on a GPU tune -> remeasure -> report."""

from __future__ import annotations

import importlib
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from cudal2 import remeasure, report, tune
from cudal2.data import ShapeRow
from cudal2.kernels.sm90 import FAMILY as SM90
from cudal2.kernels.small import SmallFamily
from cudal2.remeasure import RemeasureError, RemeasureRequest, plan
from cudal2.report import collect
from cudal2.sandbox.evaluator import EvalOptions, Evaluator, source_hash
from cudal2.sandbox.gpu import detect_gpu
from cudal2.sandbox.pool import RunnerSpec
from cudal2.sandbox.store import Rank, ResultStore
from cudal2.sandbox.types import Mode, PairedSpeedup, Status, Task
from cudal2.tune import MAX_JOB_SHAPES
from cudal2.tune_log import ConfigRecord, TuneLog
from cudal2.tune_search import Strategy
from cudal2.twins import host_cache_twin
from tests.library_fixtures import GPU, SM90_CFG, kernel_source, ok_result
from tests.sandbox.test_store import failed_result
from tests.test_cli import run as run_cli
from tests.tune_fakes import FAKE_GPU, simulated_us

SIMULATED = RunnerSpec("tests.tune_fakes:simulated_gpu")
TWO = (Task(64, 64, 64), Task(128, 128, 128))
NO_KERNEL = Task(256, 256, 256)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("CUDAL2_NO_GPU", "1")  # the CPU path, also when a GPU happens to be present


def _put(store: ResultStore, tag: str, task: Task, cand_us: float, *, gpu: str = GPU, mode: Mode = Mode.OFFLINE,
         with_source: bool = True) -> str:
    source = kernel_source(tag)
    h = source_hash(source)
    if with_source:
        store.put_source(h, source)
    store.put_result(h, gpu, mode, ok_result(task, cand_us, 10.0))
    return h


# ------------------------------------------------------------------------------------------------------ plan

MANY = [Task(64, 64 * i, 64) for i in range(1, 71)]  # 70 shapes where kernel "a" is the fastest
X, WRONG, ELSEWHERE, NO_SOURCE = Task(8, 8, 8), Task(9, 9, 9), Task(10, 10, 10), Task(11, 11, 11)
A, B = source_hash(kernel_source("a")), source_hash(kernel_source("b"))


@pytest.fixture
def store(tmp_path: Path):
    with ResultStore(tmp_path / "r.sqlite") as s:
        for t in MANY:
            _put(s, "a", t, 1.0)
        _put(s, "b", MANY[0], 2.0)  # second best on the first two shapes
        _put(s, "b", MANY[1], 2.0)
        _put(s, "b", X, 1.0)  # and the best on X
        _put(s, "a", MANY[0], 5.0, mode=Mode.SERVER)  # a on the first shape: already measured in server mode
        s.put_result(B, GPU, Mode.OFFLINE, failed_result(WRONG))  # a wrong answer is no verified kernel
        _put(s, "a", ELSEWHERE, 1.0, gpu="NVIDIA A100 (sm_80)")  # nor is a result on another GPU
        _put(s, "lost", NO_SOURCE, 1.0, with_source=False)
        yield s


ALL = [*MANY, X, WRONG, ELSEWHERE, NO_SOURCE]


def test_plan_groups_by_kernel_chunks_and_skips_what_is_measured(store):
    p = plan(store, ALL, GPU, Mode.SERVER, top=1)
    assert [(j.source_hash, len(j.tasks)) for j in p.jobs] == [(A, 32), (A, 32), (A, 5), (B, 1)]
    assert [t for j in p.jobs if j.source_hash == A for t in j.tasks] == MANY[1:]  # in order, the measured one out
    assert p.jobs[-1].tasks == (X,) and p.jobs[0].source == kernel_source("a")
    assert (p.already_measured, p.without_kernel, p.without_source) == (1, (WRONG, ELSEWHERE), 1)
    assert max(len(j.tasks) for j in p.jobs) <= MAX_JOB_SHAPES


def test_plan_top_two_and_another_mode(store):
    top2 = plan(store, ALL, GPU, Mode.SERVER, top=2)
    assert [j.tasks for j in top2.jobs if j.source_hash == B] == [(MANY[0], MANY[1], X)]
    wallclock = plan(store, ALL, GPU, Mode.WALLCLOCK, top=1)
    assert [len(j.tasks) for j in wallclock.jobs if j.source_hash == A] == [32, 32, 6]
    assert wallclock.already_measured == 0
    assert plan(store, ALL, "NVIDIA B200 (sm_100)", Mode.SERVER).without_kernel == tuple(ALL)


def test_plan_by_speedup_times_the_kernel_with_the_best_same_run_speedup(store):
    """On the first shape 'b' ran at 2 us against cuBLAS's 10 us; 'a' is re-timed here at 1.5 us in an evaluation
    where cuBLAS took 6 us: 'a' is faster by time, 'b' by speedup (5x against 4x)."""
    h = _put(store, "a", MANY[0], 1.0)
    store.put_result(h, GPU, Mode.OFFLINE, ok_result(MANY[0], 1.5, 6.0))
    by_speedup = plan(store, [MANY[0]], GPU, Mode.CONFIRM, rank=Rank.SPEEDUP)
    assert [(j.source_hash, j.tasks) for j in by_speedup.jobs] == [(B, (MANY[0],))]
    assert [j.source_hash for j in plan(store, [MANY[0]], GPU, Mode.CONFIRM).jobs] == [A]


def test_plan_with_need_paired_times_again_only_ok_results_without_the_paired_speedup(store):
    """A confirm figure from before the harness reported the paired speedup is planned again; one with it, or a
    failure (timing it again fails again), is not."""
    with_paired = replace(ok_result(MANY[1], 1.0, 10.0), paired={"cublas": PairedSpeedup(10.0, 9.8, 10.2, 10)})
    store.put_result(A, GPU, Mode.CONFIRM, ok_result(MANY[0], 1.0, 10.0))  # unpaired
    store.put_result(A, GPU, Mode.CONFIRM, with_paired)
    store.put_result(A, GPU, Mode.CONFIRM, failed_result(MANY[2]))
    tasks = MANY[:4]
    assert [j.tasks for j in plan(store, tasks, GPU, Mode.CONFIRM).jobs] == [(MANY[3],)]
    p = plan(store, tasks, GPU, Mode.CONFIRM, need_paired=True)
    assert [j.tasks for j in p.jobs] == [(MANY[0], MANY[3])] and p.already_measured == 2


# ------------------------------------------------------------------------------------- host_cache twins



def test_twin_is_the_same_sm90_config_with_host_cache_and_only_for_sm90_tuner_configs():
    twin = host_cache_twin(ConfigRecord.of(SM90, SM90_CFG))
    cfg = replace(SM90_CFG, host_cache=True)
    assert twin is not None and twin.source == SM90.render(cfg) and twin.source_hash == source_hash(twin.source)
    assert twin.record == ConfigRecord.of(SM90, cfg) and twin.record.name.endswith("-host_cache1")
    assert host_cache_twin(twin.record) is None  # a twin has no twin
    assert host_cache_twin(ConfigRecord.of(SmallFamily(), SmallFamily().default())) is None
    assert host_cache_twin(None) is None  # a source the tuner did not generate


def test_plan_with_twins_measures_each_sm90_kernels_twin_in_its_place(tmp_path):
    """The chosen kernels: an sm90 one on two shapes (its twin already measured in server mode on one), a small one and
    a hand-written one (no config record): only the sm90 kernel's twin is planned, on the shape it lacks."""
    sm90, small, hand = (Task(64, 64, 64), Task(128, 128, 128)), Task(256, 256, 256), Task(512, 512, 512)
    twin = host_cache_twin(ConfigRecord.of(SM90, SM90_CFG))
    with ResultStore(tmp_path / "r.sqlite") as s, TuneLog(s) as log:
        h_sm90, h_small = _put(s, "sm90", sm90[0], 1.0), _put(s, "small", small, 1.0)
        _put(s, "sm90", sm90[1], 1.0)
        _put(s, "hand", hand, 1.0)
        log.put_config(h_sm90, ConfigRecord.of(SM90, SM90_CFG))
        log.put_config(h_small, ConfigRecord.of(SmallFamily(), SmallFamily().default()))
        s.put_result(twin.source_hash, GPU, Mode.SERVER, ok_result(sm90[0], 2.0, 10.0))
        looked_up: list[str] = []

        def twin_of(h: str):
            looked_up.append(h)
            return host_cache_twin(log.config_of(h))

        p = plan(s, [*sm90, small, hand], GPU, Mode.SERVER, twin_of=twin_of)
        assert [(j.source_hash, j.source, j.tasks) for j in p.jobs] == [(twin.source_hash, twin.source, (sm90[1],))]
        assert (p.twins, p.already_measured, p.without_twin, p.without_source) == ((twin,), 1, 2, 0)
        assert sorted(looked_up) == sorted({h_sm90, h_small, source_hash(kernel_source("hand"))})  # once per kernel
        plain = plan(s, [*sm90, small, hand], GPU, Mode.SERVER)  # without twin_of: the kernels themselves
        assert {j.source_hash for j in plain.jobs} == {h_sm90, h_small, source_hash(kernel_source("hand"))}
        assert (plain.twins, plain.without_twin) == ((), 0)


def test_run_with_twins_records_each_twins_source_and_config_first(tmp_path, fake_gpu):
    db = str(tmp_path / "r.sqlite")
    with ResultStore(db) as s, TuneLog(s) as log:
        h = _put(s, "sm90", TWO[0], 1.0, gpu=FAKE_GPU.label)
        log.put_config(h, ConfigRecord.of(SM90, SM90_CFG))
        _put(s, "hand", TWO[1], 1.0, gpu=FAKE_GPU.label)
    summary = remeasure.run(_request(db, Mode.WALLCLOCK, host_cache_twins=True, budget_s=1e-9), out=lambda _: None,
                            runner=SIMULATED)
    twin = host_cache_twin(ConfigRecord.of(SM90, SM90_CFG))
    assert [j.source_hash for j in summary.plan.jobs] == [twin.source_hash] and summary.not_evaluated == 1
    assert "1 whose kernel has no host_cache twin" in summary.render()
    with ResultStore(db) as s, TuneLog(s) as log:
        assert s.get_source(twin.source_hash) == twin.source and log.config_of(twin.source_hash) == twin.record


def test_twins_gain_puts_each_measured_twin_in_its_kernels_place_faster_or_not(tmp_path):
    """benchmarks/twins_gain.py: the chosen sm90 kernel on two shapes, its twin timed in wallclock mode on both (faster
    on one, slower on the other: it replaces the kernel on both), a small kernel without a twin on a third shape, and
    a fourth shape whose chosen kernel has no wallclock figure (counted missing)."""
    gain = _twins_gain()
    t1, t2, t3, t4 = Task(64, 64, 64), Task(128, 128, 128), Task(256, 256, 256), Task(512, 512, 512)
    twin = host_cache_twin(ConfigRecord.of(SM90, SM90_CFG))
    with ResultStore(tmp_path / "r.sqlite") as s, TuneLog(s) as log:
        h = _put(s, "sm90", t1, 1.0)
        _put(s, "sm90", t2, 1.0)
        log.put_config(h, ConfigRecord.of(SM90, SM90_CFG))
        _put(s, "small", t3, 1.0)
        _put(s, "other", t4, 1.0)
        for task, kernel_us, twin_us in ((t1, 20.0, 14.0), (t2, 20.0, 21.0)):  # vs cuBLAS 40 us
            s.put_result(h, GPU, Mode.WALLCLOCK, ok_result(task, kernel_us, 40.0))
            s.put_result(twin.source_hash, GPU, Mode.WALLCLOCK, ok_result(task, twin_us, 40.0))
        _put(s, "small", t3, 10.0, mode=Mode.WALLCLOCK)
        found, missing = gain.pairs(s, [t1, t2, t3, t4], GPU, Mode.WALLCLOCK)
    assert missing == 1 and [p.task for p in found] == [t1, t2, t3] and found[2].twin is None
    assert [gain.speedup(p.deployed) for p in found] == [40 / 14, 40 / 21, 1.0]
    row = gain.summary("all", found).split(" | ")
    assert row[1:5] == ["3", "2", "1/2", "2.50"]  # median of 6 us saved and 1 us lost
    assert row[5:7] == [f"{(2 * 2 * 1) ** (1 / 3):.3f}x", f"{(40 / 14 * 40 / 21) ** (1 / 3):.3f}x |"]


def test_report_with_twins_shows_each_measured_twin_in_its_kernels_place(tmp_path):
    """`cudal2 report --mode wallclock --host-cache-twins`: the chosen sm90 kernel's twin stands in on a shape where it
    is slower (no best-of-2) and on one where the kernel itself has no wallclock figure; a kernel without a twin keeps
    its own figure; a shape with neither stays missing. Offline, the flag is a one-line error."""
    t1, t2, t3, t4 = Task(64, 64, 64), Task(128, 128, 128), Task(256, 256, 256), Task(512, 512, 512)
    twin = host_cache_twin(ConfigRecord.of(SM90, SM90_CFG))
    db = tmp_path / "r.sqlite"
    with ResultStore(db) as s, TuneLog(s) as log:
        h = _put(s, "sm90", t1, 1.0)
        _put(s, "sm90", t2, 1.0)
        _put(s, "sm90", t4, 1.0)
        log.put_config(h, ConfigRecord.of(SM90, SM90_CFG))
        log.put_config(twin.source_hash, twin.record)  # as remeasure records it
        h_small = _put(s, "small", t3, 1.0)
        s.put_result(h, GPU, Mode.WALLCLOCK, ok_result(t1, 20.0, 40.0))
        s.put_result(twin.source_hash, GPU, Mode.WALLCLOCK, ok_result(t1, 25.0, 40.0))
        s.put_result(twin.source_hash, GPU, Mode.WALLCLOCK, ok_result(t2, 10.0, 40.0))
        _put(s, "small", t3, 8.0, mode=Mode.WALLCLOCK)
        rows = [ShapeRow(t.m, t.n, t.k, "fp32", "train", "test") for t in (t1, t2, t3, t4)]
        plain = collect(rows, s, GPU, Mode.WALLCLOCK)
        twins = collect(rows, s, GPU, Mode.WALLCLOCK, host_cache_twins=True)
    assert [e.kernel_hash for e in plain] == [h, None, h_small, None]
    assert [e.kernel_hash for e in twins] == [twin.source_hash, twin.source_hash, h_small, None]
    assert [e.twin for e in twins] == [True, True, False, False] and twins[0].kernel_name == twin.record.name
    assert [e.speedups.get("cublas") for e in twins] == [40 / 25, 4.0, 10 / 8, None]
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K,acc,split,source\n"
                      + "".join(f"{t.m},{t.n},{t.k},fp32,train,test\n" for t in (t1, t2, t3, t4)))
    text = report.run(report.ReportRequest(str(shapes), GPU, Mode.WALLCLOCK, None, db, None, None, True))
    assert "on 2 shapes the figure is the chosen kernel's host_cache twin's" in text and "3/4 shapes" in text
    with pytest.raises(report.ReportError, match="--host-cache-twins with --mode offline"):
        report.run(report.ReportRequest(str(shapes), GPU, Mode.OFFLINE, None, db, None, None, True))
    with pytest.raises(report.ReportError, match="--host-cache-twins with --mode cold"):
        report.run(report.ReportRequest(str(shapes), GPU, Mode.COLD, None, db, None, None, True))


def _twins_gain():
    """benchmarks/twins_gain.py as a module (benchmarks/ holds scripts, not a package)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    return importlib.import_module("twins_gain")


def test_a_stored_sm90_config_that_no_longer_builds_has_no_twin_and_is_counted(tmp_path, fake_gpu):
    """As the tuner skips a config of an older version of sm90's space, so do the twins: counted, not an error."""
    db = str(tmp_path / "r.sqlite")
    with ResultStore(db) as s, TuneLog(s) as log:
        h = _put(s, "sm90", TWO[0], 1.0, gpu=FAKE_GPU.label)
        log.put_config(h, ConfigRecord(SM90.name, "sm90_wgmma-from-older-code", {"bm": 7}))
        assert host_cache_twin(log.config_of(h)) is None
    summary = remeasure.run(_request(db, Mode.WALLCLOCK, host_cache_twins=True), out=lambda _: None,
                            runner=SIMULATED)
    assert (summary.plan.jobs, summary.plan.without_twin, summary.stop_reason) == ((), 1, "nothing to measure")
    assert "1 whose kernel has no host_cache twin" in summary.render()


# ------------------------------------------------------------------------------------------------------- run


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(remeasure, "detect_gpu", lambda index=0: FAKE_GPU)


def _tuned_store(tmp_path: Path) -> tuple[str, str]:
    """A store where the small family's default kernel is verified offline on TWO (not on NO_KERNEL)."""
    source = SmallFamily().render(SmallFamily().default())
    h = source_hash(source)
    with ResultStore(tmp_path / "r.sqlite") as s, TuneLog(s) as log:
        s.put_source(h, source)
        log.put_config(h, ConfigRecord("small", "small-the-default", {}))  # names the kernel in progress lines
        for t in TWO:
            s.put_result(h, FAKE_GPU.label, Mode.OFFLINE, ok_result(t, 3.0, 10.0))
    return str(tmp_path / "r.sqlite"), h


def _request(db: str, mode: Mode, **kw) -> RemeasureRequest:
    return RemeasureRequest(None, tuple(t.mnk for t in (*TWO, NO_KERNEL)), mode=mode, db_path=db, compile_workers=1,
                            **kw)


@pytest.mark.nvcc
def test_run_stores_results_under_the_new_mode_and_a_rerun_measures_nothing(tmp_path, fake_gpu):
    db, h = _tuned_store(tmp_path)
    lines: list[str] = []
    first = remeasure.run(_request(db, Mode.SERVER), out=lines.append, runner=SIMULATED)
    assert (first.measured, first.statuses, first.not_evaluated) == (2, Counter(ok=2), 0)
    assert first.ok and first.stop_reason == "all jobs done" and first.plan.without_kernel == (NO_KERNEL,)
    assert len(lines) == 2 and "small-the-default (2 shapes) ok 2/2" in lines[1] and "no verified offline kernel: 1" in first.render()
    rows = [ShapeRow(t.m, t.n, t.k, "fp32", "train", "test") for t in TWO]
    with ResultStore(db) as s:
        for t in TWO:
            assert s.get_result(h, t, FAKE_GPU.label, Mode.SERVER).timings["candidate"].median_us == simulated_us(
                h, t.mnk)
            assert s.get_result(h, t, FAKE_GPU.label, Mode.OFFLINE).timings["candidate"].median_us == 3.0
        assert all(e.kernel_hash == h for e in collect(rows, s, FAKE_GPU.label, Mode.SERVER))
    again = remeasure.run(_request(db, Mode.SERVER), out=lines.append, runner=SIMULATED)
    assert (again.measured, again.plan.already_measured, again.stop_reason) == (0, 2, "nothing to measure")
    assert again.ok
    wallclock = remeasure.run(_request(db, Mode.WALLCLOCK), out=lines.append, runner=SIMULATED)  # compile cached
    assert (wallclock.measured, wallclock.statuses) == (2, Counter(ok=2))


@pytest.mark.nvcc
def test_confirm_mode_times_the_chosen_kernel_again_and_stores_it_apart(tmp_path, fake_gpu):
    db, h = _tuned_store(tmp_path)
    summary = remeasure.run(_request(db, Mode.CONFIRM), out=lambda _: None, runner=SIMULATED)
    assert (summary.measured, summary.statuses) == (2, Counter(ok=2))
    rows = [ShapeRow(t.m, t.n, t.k, "fp32", "train", "test") for t in TWO]
    with ResultStore(db) as s:
        for t in TWO:  # a fresh figure under confirm; the search's offline figure stays as it was
            assert s.get_result(h, t, FAKE_GPU.label, Mode.CONFIRM).timings["candidate"].median_us == simulated_us(
                h, t.mnk)
            assert s.get_result(h, t, FAKE_GPU.label, Mode.OFFLINE).timings["candidate"].median_us == 3.0
        assert [e.kernel_hash for e in collect(rows, s, FAKE_GPU.label, Mode.CONFIRM)] == [h, h]
    # The harness is asked for the offline method: confirm is a label of the stored figures, not a way of timing.
    spec = Evaluator(EvalOptions(mode=Mode.CONFIRM, compile_only=True))._spec(TWO)
    assert "mode offline" in spec and not any(line.startswith("mode confirm") for line in spec)


@pytest.mark.nvcc
def test_cold_mode_is_its_own_harness_method_and_stored_apart(tmp_path, fake_gpu):
    """Cold is a way of timing (the offline replay after an L2 flush): the harness is asked for it by name, and its
    figures sit beside the offline ones, which stay as they were."""
    db, h = _tuned_store(tmp_path)
    summary = remeasure.run(_request(db, Mode.COLD), out=lambda _: None, runner=SIMULATED)
    assert (summary.measured, summary.statuses) == (2, Counter(ok=2))
    with ResultStore(db) as s:
        for t in TWO:
            assert s.get_result(h, t, FAKE_GPU.label, Mode.COLD).timings["candidate"].median_us == simulated_us(h, t.mnk)
            assert s.get_result(h, t, FAKE_GPU.label, Mode.OFFLINE).timings["candidate"].median_us == 3.0
    spec = Evaluator(EvalOptions(mode=Mode.COLD, compile_only=True))._spec(TWO)
    assert "mode cold" in spec and "mode offline" not in spec
    assert Mode.COLD.replays and Mode.CONFIRM.replays and not Mode.SERVER.replays and not Mode.WALLCLOCK.replays


@pytest.mark.nvcc
def test_max_log2_mnk_keeps_only_the_shapes_below_it(tmp_path, fake_gpu):
    """TWO is 64^3 (2^18) and 128^3 (2^21): --max-log2-mnk 21 leaves 64^3 alone in the plan; 128^3 is not even
    counted as measured or missing, nor is NO_KERNEL (2^24)."""
    db, h = _tuned_store(tmp_path)
    summary = remeasure.run(_request(db, Mode.COLD, max_log2_mnk=21), out=lambda _: None, runner=SIMULATED)
    assert (summary.measured, summary.statuses, summary.plan.without_kernel) == (1, Counter(ok=1), ())
    with ResultStore(db) as s:
        assert s.get_result(h, TWO[0], FAKE_GPU.label, Mode.COLD) is not None
        assert s.get_result(h, TWO[1], FAKE_GPU.label, Mode.COLD) is None


@pytest.mark.nvcc
def test_chosen_on_times_another_gpus_kernels_here(tmp_path, fake_gpu):
    """The kernel is verified offline only on an A100: this GPU has no choice of its own, so a plain run finds no
    kernel; with --chosen-on a100 it times the A100's kernels here, stored under this GPU's label. A label no GPU in
    the store has is refused in one line, naming the option."""
    other = "NVIDIA A100-SXM4-80GB (sm_80)"
    source = SmallFamily().render(SmallFamily().default())
    h = source_hash(source)
    db = str(tmp_path / "r.sqlite")
    with ResultStore(db) as s:
        s.put_source(h, source)
        for t in TWO:
            s.put_result(h, other, Mode.OFFLINE, ok_result(t, 3.0, 10.0))
    plain = remeasure.run(_request(db, Mode.CONFIRM), out=lambda _: None, runner=SIMULATED)
    assert (plain.measured, plain.stop_reason, plain.plan.without_kernel) == (0, "nothing to measure", (*TWO, NO_KERNEL))
    lines: list[str] = []
    summary = remeasure.run(_request(db, Mode.CONFIRM, chosen_on="a100"), out=lines.append, runner=SIMULATED)
    assert (summary.measured, summary.statuses) == (2, Counter(ok=2))
    assert lines[0].endswith(f"on {FAKE_GPU.label}, the kernels chosen on {other}")
    with ResultStore(db) as s:
        assert all(s.get_result(h, t, FAKE_GPU.label, Mode.CONFIRM).status is Status.OK for t in TWO)
        assert s.get_result(h, TWO[0], other, Mode.CONFIRM) is None
    with pytest.raises(RemeasureError, match="--chosen-on 'v100' matches none of the GPUs with results"):
        remeasure.run(_request(db, Mode.CONFIRM, chosen_on="v100"), out=lambda _: None, runner=SIMULATED)


@pytest.mark.nvcc
def test_paired_confirm_of_the_large_shapes_only_fills_the_paired_report(tmp_path, fake_gpu):
    """--min-log2-mnk keeps the shapes at or above 2^N; --paired times again a confirm figure without the paired
    speedup, after which `report --estimator paired` scores the shape."""
    db, h = _tuned_store(tmp_path)  # TWO: 64^3 (2^18) and 128^3 (2^21)
    big = TWO[1]
    with ResultStore(db) as s:  # a confirm figure timed before the harness reported the paired speedup
        s.put_result(h, FAKE_GPU.label, Mode.CONFIRM, ok_result(big, 3.0, 10.0))
    rows = [ShapeRow(big.m, big.n, big.k, "fp32", "train", "test")]

    def paired_entry():
        with ResultStore(db) as s:
            return collect(rows, s, FAKE_GPU.label, Mode.CONFIRM, estimator=report.Estimator.PAIRED)[0]

    assert paired_entry().unpaired
    plain = remeasure.run(_request(db, Mode.CONFIRM, min_log2_mnk=21), out=lambda _: None, runner=SIMULATED)
    assert (plain.measured, plain.plan.already_measured, plain.stop_reason) == (0, 1, "nothing to measure")
    lines: list[str] = []
    summary = remeasure.run(_request(db, Mode.CONFIRM, min_log2_mnk=21, paired=True), out=lines.append,
                            runner=SIMULATED)
    assert (summary.measured, summary.statuses, summary.plan.without_kernel) == (1, Counter(ok=1), (NO_KERNEL,))
    assert "(1 shapes)" in lines[-1] and "with the paired speedup" in summary.render()
    got = paired_entry()
    assert not got.unpaired and got.speedups["cublas"] == pytest.approx(10.0 / simulated_us(h, big.mnk))
    again = remeasure.run(_request(db, Mode.CONFIRM, min_log2_mnk=21, paired=True), out=lambda _: None,
                          runner=SIMULATED)
    assert (again.measured, again.plan.already_measured) == (0, 1)


def test_time_budget_leaves_jobs_for_a_rerun(tmp_path, fake_gpu):
    db, _ = _tuned_store(tmp_path)
    summary = remeasure.run(_request(db, Mode.SERVER, budget_s=1e-9), out=lambda _: None, runner=SIMULATED)
    assert (summary.stop_reason, summary.not_evaluated, summary.finished) == ("time budget spent", 2, 0)
    assert not summary.ok


@pytest.mark.parametrize(("kw", "message"), [
    ({"mode": Mode.OFFLINE}, "--mode offline"),
    ({"top": 0}, "--top 0"),
    ({"mode": Mode.CONFIRM, "top": 2}, "--top 2 with --mode confirm"),
    ({"budget_s": 0}, "must be positive"),
    ({"compile_workers": -1}, "--jobs -1"),
    ({"mode": Mode.CONFIRM, "host_cache_twins": True}, "--host-cache-twins with --mode confirm"),
    ({"mode": Mode.COLD, "host_cache_twins": True}, "--host-cache-twins with --mode cold"),
    ({"min_log2_mnk": -1}, "--min-log2-mnk -1: must be >= 0"),
    ({"min_log2_mnk": 19}, "no shape of the set has 2\\^19 <= MNK < 2\\^64"),  # 64^3 = 2^18
    ({"max_log2_mnk": 18}, "no shape of the set has 2\\^0 <= MNK < 2\\^18"),
    ({"min_log2_mnk": 20, "max_log2_mnk": 20}, "--max-log2-mnk 20: must be above --min-log2-mnk \\(20\\)"),
])
def test_bad_requests_are_refused(tmp_path, fake_gpu, kw, message):
    db, _ = _tuned_store(tmp_path)
    with pytest.raises(RemeasureError, match=message):
        remeasure.run(RemeasureRequest(None, ("64_64_64",), db_path=db, **{"mode": Mode.SERVER, **kw}))


# ------------------------------------------------------------------------------------------------------- CLI


@pytest.mark.parametrize(("argv", "message"), [
    (["--mnk", "64_64_64", "--mode", "offline"], "offline results are what is remeasured"),
    (["--shapes", "/no/such.csv", "--mode", "server"], "cannot read"),
    (["--mnk", "64_64", "--mode", "server"], "bad shape"),
    (["--mnk", "64_64_64", "--mode", "wallclock"], "no CUDA GPU"),  # CUDAL2_NO_GPU: no GPU visible
    (["--mnk", "64_64_64", "--mode", "server", "--db", "/no/such.sqlite"], "no result store"),
    (["--mnk", "64_64_64", "--mode", "confirm", "--min-log2-mnk", "-1"], "--min-log2-mnk -1: must be >= 0"),
    (["--mnk", "64_64_64", "--mode", "cold", "--max-log2-mnk", "18"], "no shape of the set has 2^0 <= MNK < 2^18"),
])
def test_cli_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv, message):
    db, _ = _tuned_store(tmp_path)
    argv = argv if "--db" in argv else [*argv, "--db", db]
    code, _, err = run_cli(capsys, "remeasure", *argv)
    assert code == 2 and err.startswith("cudal2 remeasure: error: ") and len(err.strip().splitlines()) == 1
    assert message in err


def test_cli_nothing_left_to_measure_exits_0(capsys, tmp_path, fake_gpu):
    db, h = _tuned_store(tmp_path)
    with ResultStore(db) as s:
        for t in TWO:
            s.put_result(h, FAKE_GPU.label, Mode.SERVER, ok_result(t, 4.0, 10.0))
    code, out, _ = run_cli(capsys, "remeasure", "--mnk", "64_64_64", "--mnk", "128_128_128", "--mode", "server",
                           "--db", db)
    assert code == 0 and "stopped: nothing to measure" in out and "skipped: 2 (kernel, shape)" in out


# ------------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_gpu_tune_then_remeasure_fills_the_report(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDAL2_NO_GPU")
    db = str(tmp_path / "r.sqlite")
    tuned = tune.run(tune.TuneOptions(families=("small",), strategy=Strategy.RANDOM, max_configs=1, budget_s=300,
                                      db_path=db, cache_dir=tmp_path / "build", target_ms=20), TWO)
    assert tuned.statuses[Status.OK.value] == 2
    label = detect_gpu(0).label
    rows = [ShapeRow(t.m, t.n, t.k, "fp32", "train", "test") for t in TWO]
    for mode in (Mode.WALLCLOCK, Mode.SERVER):
        summary = remeasure.run(RemeasureRequest(None, tuple(t.mnk for t in TWO), mode=mode, db_path=db,
                                                 target_ms=20, budget_s=300))
        assert summary.ok and (summary.measured, summary.statuses) == (2, Counter(ok=2)), summary.render()
        with ResultStore(db) as s:
            entries = collect(rows, s, label, mode)
        assert all(e.result is not None and "cublas" in e.speedups for e in entries), mode
