"""GPU tests of the whole evaluator (run on the device by scripts/gpu_check.sh): the seed and legit kernels are
ok, every adversarial and fault kernel gets its expected status, and the next legit candidate after each one
still evaluates correctly (faults are interleaved with a legit kernel)."""

from __future__ import annotations

import pytest

from cudal2.sandbox.evaluator import EvalOptions, Evaluator
from cudal2.sandbox.runner import RunLimits
from cudal2.sandbox.types import Status, Task
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


@pytest.mark.parametrize("path", corpus("seed", "legit"), ids=ids(corpus("seed", "legit")))
def test_legit_kernels_ok(evaluator, path):
    res = evaluator.evaluate(path.read_text(), SEED_SHAPES)
    for s in res.shapes:
        assert s.status == Status.OK, f"{path.name} {s.task.mnk}: {s.status.value}: {s.reason}"
        assert s.timings["candidate"].median_us > 0
        assert "cublas" in s.timings and s.speedup("cublas") > 0


# Kernels decided at compile time are covered by the CPU corpus test; the compile-time bomb would only burn
# device time here.
BAD = [p for p in corpus("adversarial", "faults") if not caught_at_compile_time(p) or expected_status(p) != Status.TIMEOUT]


@pytest.mark.parametrize("path", BAD, ids=ids(BAD))
def test_bad_kernel_caught_then_next_candidate_ok(evaluator, path):
    want = expected_status(path)
    res = evaluator.evaluate(path.read_text(), [CHECK_SHAPE])
    got = res.shapes[0]
    assert got.status == want, f"{path.name}: want {want.value}, got {got.status.value}: {got.reason}"
    assert got.reason, "a failure must say what was detected"
    after = evaluator.evaluate(LEGIT, [CHECK_SHAPE]).shapes[0]
    assert after.status == Status.OK, f"legit kernel after {path.name}: {after.status.value}: {after.reason}"


def test_store_answers_repeat_without_rerun(tmp_path):
    from cudal2.sandbox.store import ResultStore

    with ResultStore(tmp_path / "r.sqlite") as store:
        ev = Evaluator(EvalOptions(target_ms=5, warmup_ms=2, min_reps=3, max_reps=10), store)
        first = ev.evaluate(LEGIT, [CHECK_SHAPE]).shapes[0]
        second = ev.evaluate(LEGIT, [CHECK_SHAPE]).shapes[0]
        assert first.status == Status.OK
        assert second == first  # served from the store, identical figures


def test_baselines_alone():
    res = Evaluator(FAST).baselines([Task(512, 512, 512)])[0]
    assert res.status == Status.OK, res.reason
    assert {"cublas", "cublaslt_heuristic", "cublaslt_autotuned"} <= set(res.timings)
