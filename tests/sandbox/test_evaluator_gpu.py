"""GPU tests of the whole evaluator (run on the device by scripts/gpu_check.sh): the seed and legit kernels are
ok, every adversarial and fault kernel gets its expected status, and the next legit candidate after each one
still evaluates correctly (faults are interleaved with a legit kernel)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cudal2.sandbox.evaluator import EvalOptions, Evaluator
from cudal2.sandbox.runner import RunLimits
from cudal2.sandbox.types import Mode, Status, Task
from tests.sandbox.corpus import KERNELS, caught_at_compile_time, corpus, expected_status, ids

pytestmark = pytest.mark.gpu

# Short timing: these tests check statuses, benchmarks measure.
FAST = EvalOptions(fresh=True, target_ms=5, warmup_ms=2, min_reps=3, max_reps=10, compile_timeout_s=60,
                   limits=RunLimits(start_timeout_s=60, task_timeout_s=10))
SEED_SHAPES = [Task(128, 128, 128), Task(256, 512, 1024), Task(1024, 1024, 1024), Task(192, 320, 4096)]
CHECK_SHAPE = Task(256, 256, 1024)  # K >= 1024: fp16 accumulation must fail an fp32 task here
LEGIT = (KERNELS / "seed" / "naive.cu").read_text()


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    return Evaluator(FAST)


# (kernel, expected, got, reason) of every corpus run; written as a markdown table to $CUDAL2_CORPUS_TABLE.
TABLE: list[tuple[str, str, str, str]] = []


@pytest.fixture(scope="module", autouse=True)
def corpus_table():
    yield
    target = os.environ.get("CUDAL2_CORPUS_TABLE")
    if target and TABLE:
        rows = ["| kernel | expected | got | reason |", "|---|---|---|---|"]
        rows += [f"| {k} | {e} | {g} | {r.replace('|', '/')[:160]} |" for k, e, g, r in sorted(TABLE)]
        Path(target).write_text("\n".join(rows) + "\n")


@pytest.mark.parametrize("path", corpus("seed", "legit"), ids=ids(corpus("seed", "legit")))
def test_legit_kernels_ok(evaluator, path):
    res = evaluator.evaluate(path.read_text(), SEED_SHAPES)
    worst = next((s for s in res.shapes if s.status != Status.OK), res.shapes[0])
    TABLE.append((f"{path.parent.name}/{path.stem}", "ok", worst.status.value, worst.reason))
    for s in res.shapes:
        assert s.status == Status.OK, f"{path.name} {s.task.mnk}: {s.status.value}: {s.reason}"
        assert s.timings["candidate"].median_us > 0
        assert "cublas" in s.timings and s.speedup("cublas") > 0
        assert_paired(s)


def assert_paired(s) -> None:
    """Every baseline has a speedup paired by repetition, bounded by the extreme samples' ratios (at <= 50
    repetitions p99 is the largest sample)."""
    cand = s.timings["candidate"]
    assert set(s.paired) == set(s.timings) - {"candidate"}
    for name, p in s.paired.items():
        base = s.timings[name]
        assert p.reps == cand.reps == base.reps
        assert p.p10 <= p.median <= p.p90
        assert base.min_us / cand.p99_us <= p.median <= base.p99_us / cand.min_us


# Kernels decided at compile time are covered by the CPU corpus test; the compile-time bomb would only burn
# device time here.
BAD = [p for p in corpus("adversarial", "faults") if not caught_at_compile_time(p) or expected_status(p) != Status.TIMEOUT]


@pytest.mark.parametrize("path", BAD, ids=ids(BAD))
def test_bad_kernel_caught_then_next_candidate_ok(evaluator, path):
    want = expected_status(path)
    res = evaluator.evaluate(path.read_text(), [CHECK_SHAPE])
    got = res.shapes[0]
    TABLE.append((f"{path.parent.name}/{path.stem}", want.value, got.status.value, got.reason))
    assert got.status == want, f"{path.name}: want {want.value}, got {got.status.value}: {got.reason}"
    assert got.reason, "a failure must say what was detected"
    after = evaluator.evaluate(LEGIT, [CHECK_SHAPE]).shapes[0]
    assert after.status == Status.OK, f"legit kernel after {path.name}: {after.status.value}: {after.reason}"


def test_legit_kernel_ok_while_every_host_core_is_busy(evaluator):
    """The idle check (no GPU work may run on after the call's stream has finished) reads the host clock. Under a
    host busy on every core, as when the tuner compiles with one nvcc per core, a preempted harness thread must not
    read as a candidate leaving work running (it did once, on a CUTLASS kernel, in the sixth session's tuning)."""
    import subprocess
    import sys

    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        res = evaluator.evaluate(LEGIT, [Task(64 * i, 128, 128) for i in range(1, 9)])
    finally:
        for p in burners:
            p.kill()
            p.wait()
    for s in res.shapes:
        assert s.status == Status.OK, f"{s.task.mnk}: {s.status.value}: {s.reason}"


def test_store_answers_repeat_without_rerun(tmp_path):
    from cudal2.sandbox.store import ResultStore

    with ResultStore(tmp_path / "r.sqlite") as store:
        ev = Evaluator(EvalOptions(target_ms=5, warmup_ms=2, min_reps=3, max_reps=10), store)
        first = ev.evaluate(LEGIT, [CHECK_SHAPE]).shapes[0]
        second = ev.evaluate(LEGIT, [CHECK_SHAPE]).shapes[0]
        assert first.status == Status.OK
        assert second == first  # served from the store, identical figures


def test_server_mode_reports_latency_percentiles():
    opts = EvalOptions(fresh=True, mode=Mode.SERVER, target_qps=5000, target_ms=20, warmup_ms=2, min_reps=20,
                       max_reps=40)
    res = Evaluator(opts).evaluate((KERNELS / "seed" / "wmma.cu").read_text(), [Task(1024, 1024, 1024)]).shapes[0]
    assert res.status == Status.OK, res.reason
    cand = res.timings["candidate"]
    assert cand.reps >= 20 and cand.p99_us >= cand.median_us > 0
    assert res.speedup("cublas") > 0


def test_wallclock_mode_times_plain_calls_and_still_reverifies():
    """CUDA-L2's method (host clock around a call and a sync): every check still runs, nothing is graph-replayed."""
    opts = EvalOptions(fresh=True, mode=Mode.WALLCLOCK, target_ms=10, warmup_ms=2, min_reps=20, max_reps=40)
    res = Evaluator(opts).evaluate(LEGIT, [Task(256, 512, 128)]).shapes[0]
    assert res.status == Status.OK, res.reason
    assert res.timings["candidate"].reps >= 20 and res.speedup("cublas") > 0
    assert {"cublaslt_heuristic", "cublaslt_autotuned"} <= set(res.timings)
    assert_paired(res)


def test_cold_mode_replays_the_graph_after_a_flush_and_still_reverifies():
    """Cold mode is the offline replay after an L2 flush: graph-timed, every check, every baseline, paired figures."""
    opts = EvalOptions(fresh=True, mode=Mode.COLD, target_ms=10, warmup_ms=2, min_reps=20, max_reps=40)
    res = Evaluator(opts).evaluate(LEGIT, [Task(64, 64, 64)]).shapes[0]
    assert res.status == Status.OK, res.reason
    assert res.graph is True and any(c.startswith("timed-call re-verification (32 sets)") for c in res.checks)
    assert res.timings["candidate"].reps >= 20 and res.speedup("cublas") > 0
    assert {"cublaslt_heuristic", "cublaslt_autotuned"} <= set(res.timings)
    assert_paired(res)


@pytest.mark.parametrize("mode", [Mode.OFFLINE, Mode.COLD, Mode.SERVER, Mode.WALLCLOCK])
def test_pdl_is_allowed_inside_a_call_and_rejected_between_calls_in_every_mode(mode):
    """cuBLAS's split-K launches its reduction with PDL inside one call; a kernel launched with PDL after the previous
    call's kernel overlaps the calls. Server and wall-clock time plain calls, so the harness captures them to check."""
    opts = EvalOptions(fresh=True, mode=mode, target_ms=5, warmup_ms=2, min_reps=3, max_reps=10)
    evaluator = Evaluator(opts)
    task = [Task(256, 512, 128)]
    inside = evaluator.evaluate((KERNELS / "legit" / "pdl_within_call.cu").read_text(), task).shapes[0]
    assert inside.status == Status.OK, inside.reason
    between = evaluator.evaluate((KERNELS / "adversarial" / "pdl_overlap.cu").read_text(), task).shapes[0]
    assert between.status == Status.REJECTED_BEHAVIOUR, between.reason
    assert "across calls" in between.reason


def test_baselines_alone():
    res = Evaluator(FAST).baselines([Task(512, 512, 512)])[0]
    assert res.status == Status.OK, res.reason
    assert {"cublas", "cublaslt_heuristic", "cublaslt_autotuned"} <= set(res.timings)
    assert res.paired == {}  # nothing to pair without a candidate
