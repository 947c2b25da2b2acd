from __future__ import annotations

import math

import pytest

from cudal2.reward.config import TERMS, RewardConfig
from cudal2.reward.rubric import TOL_FP16, TOL_FP32, RewardBreakdown, score, tolerance
from cudal2.sandbox.types import Acc, Status, Task

from .builders import kernel, ok_shape, result, shape

CFG = RewardConfig()
T1, T2 = Task(1024, 1024, 1024), Task(64, 4096, 4096)


def check_sum(b: RewardBreakdown) -> None:
    assert b.total == pytest.approx(sum(b.terms.values()))


def test_tolerance_mirrors_evaluator_defaults():
    from cudal2.sandbox.evaluator import EvalOptions

    assert (TOL_FP32, TOL_FP16) == (EvalOptions().tol_fp32, EvalOptions().tol_fp16)
    assert tolerance(Task(8, 8, 1024)) == pytest.approx(2.5e-4)
    assert tolerance(Task(8, 8, 4096)) == pytest.approx(5e-4)
    assert tolerance(Task(8, 8, 4096, Acc.FP16)) == pytest.approx(1e-2)


def test_format_error():
    b = score(None, 100, CFG)
    assert b.statuses == ("format_error",) and b.speedup is None
    assert b.total == CFG.penalty_format == -1.0
    assert b.terms == {"speed": 0.0, "accuracy": 0.0, "length": 0.0, "status": -1.0, "ptxas": 0.0}


def test_fast_correct_candidate():
    r = result(ok_shape(T1, cand_us=5.0, cublas_us=10.0, err=0.0), ok_shape(T2, cand_us=10.0, cublas_us=80.0, err=0.0))
    b = score(r, 100, CFG)
    assert b.statuses == ("ok", "ok")
    assert b.speedup == pytest.approx(4.0)  # sqrt(2 * 8)
    assert b.terms["speed"] == pytest.approx(math.log(4.0))
    assert b.terms["status"] == pytest.approx(0.5)  # correct_reward, both shapes ok
    assert b.total == pytest.approx(math.log(4.0) + 0.5)
    check_sum(b)


def test_accuracy_penalty_on_ok_results():
    r = result(ok_shape(T1, err=0.5 * tolerance(T1)), ok_shape(T2, err=10 * tolerance(T2)))
    b = score(r, 0, CFG)
    assert b.terms["accuracy"] == pytest.approx(-0.1 * (0.5 + 1.0) / 2)
    assert b.terms["speed"] == 0.0 and b.terms["status"] == pytest.approx(0.5)  # parity speed, all ok
    assert b.total == pytest.approx(0.5 - 0.1 * (0.5 + 1.0) / 2)
    assert score(result(ok_shape(T1, err=None)), 0, CFG).terms["accuracy"] == 0.0


def test_custom_tolerance_function():
    b = score(result(ok_shape(T1, err=1e-3)), 0, CFG, tolerance_of=lambda task: 4e-3)
    assert b.terms["accuracy"] == pytest.approx(-0.1 * 0.25)


def test_length_penalty_when_switched_on():
    cfg = RewardConfig(length_weight=0.2)
    r = result(ok_shape(T1))
    assert score(r, 2048, cfg).terms["length"] == 0.0
    assert score(r, 2048 + 4096, cfg).terms["length"] == pytest.approx(-0.2)
    assert score(r, 10_000, CFG).terms["length"] == 0.0  # off by default


@pytest.mark.parametrize("bad", [Status.COMPILE_ERROR, Status.WRONG_ANSWER, Status.RUNTIME_ERROR, Status.TIMEOUT,
                                 Status.STATIC_REJECT, Status.REJECTED_BEHAVIOUR])
def test_failing_candidate_gets_only_its_penalty(bad):
    cfg = RewardConfig(length_weight=1.0)
    # One shape is 8x faster and correct; another fails: no speed credit, no accuracy or length charge. The status
    # term is still the mean over shapes, so the ok shape contributes correct_reward (0.5) to it.
    r = result(ok_shape(T1, cand_us=1.0, cublas_us=8.0, err=100.0), shape(bad, T2))
    b = score(r, 100_000, cfg)
    assert b.statuses == ("ok", bad.value)
    assert b.speedup is None
    assert b.terms["speed"] == b.terms["accuracy"] == b.terms["length"] == b.terms["ptxas"] == 0.0
    penalty = {"compile_error": -0.8, "wrong_answer": -0.5, "runtime_error": -0.6, "timeout": -0.6,
               "static_reject": -1.0, "rejected_behaviour": -1.0}[bad.value]
    assert b.terms["status"] == pytest.approx((0.5 + penalty) / 2)
    assert b.total == pytest.approx((0.5 + penalty) / 2)


def test_failing_everywhere_gets_the_full_penalty():
    b = score(result(shape(Status.COMPILE_ERROR, T1), shape(Status.COMPILE_ERROR, T2)), 0, CFG)
    assert b.total == pytest.approx(-0.8)


def test_internal_error_costs_nothing_but_is_reported():
    b = score(result(shape(Status.INTERNAL_ERROR)), 0, CFG)
    assert b.total == 0.0 and b.statuses == ("internal_error",)
    empty = score(result(), 0, CFG)  # nothing evaluated at all
    assert empty.total == 0.0 and empty.statuses == ("internal_error",)


def test_compile_only_gets_ptxas_reward():
    r = result(shape(Status.COMPILED, T1), shape(Status.COMPILED, T2), kernels=(kernel(spill_store=2048),))
    b = score(r, 0, CFG)
    assert b.statuses == ("compiled", "compiled")
    assert b.terms["ptxas"] == pytest.approx(0.5 - 0.2)
    assert b.terms["speed"] == 0.0 and b.speedup is None
    assert b.total == pytest.approx(0.3)
    # the ptxas term only applies to compile-only results
    assert score(result(ok_shape(T1), kernels=(kernel(),)), 0, CFG).terms["ptxas"] == 0.0


def test_compile_only_without_compile_record():
    r = result(shape(Status.COMPILED))
    r = type(r)(r.source_hash, r.gpu, r.evaluator_version, None, r.shapes)
    assert score(r, 0, CFG).total == pytest.approx(CFG.compiled_reward)


@pytest.mark.parametrize("term", TERMS)
def test_drop_removes_term_from_total_and_breakdown(term):
    cfg = RewardConfig(drop=[term], length_weight=1.0)
    full_cfg = RewardConfig(length_weight=1.0)
    cases = [
        result(ok_shape(T1, cand_us=5.0, cublas_us=10.0, err=tolerance(T1))),
        result(shape(Status.WRONG_ANSWER)),
        result(shape(Status.COMPILED), kernels=(kernel(spill_load=1024),)),
    ]
    for r in [*cases, None]:
        full, dropped = score(r, 10_000, full_cfg), score(r, 10_000, cfg)
        assert term not in dropped.terms
        assert set(dropped.terms) == set(TERMS) - {term}
        assert dropped.total == pytest.approx(full.total - full.terms[term])
        check_sum(dropped)


def test_drop_speed_concretely():
    r = result(ok_shape(T1, cand_us=5.0, cublas_us=10.0))
    assert score(r, 0, CFG).total == pytest.approx(math.log(2) + 0.5)
    b = score(r, 0, RewardConfig(drop=["speed"]))
    assert b.total == pytest.approx(0.5) and "speed" not in b.terms  # only correct_reward is left
    assert b.speedup == pytest.approx(2.0)  # the measurement is still reported


def test_baseline_and_form_choice():
    r = result(ok_shape(T1, cand_us=10.0, cublas_us=10.0, cublaslt_autotuned=30.0))
    b = score(r, 0, RewardConfig(baseline="cublaslt_autotuned", speed_form="minus_one"))
    assert b.total == pytest.approx(2.0 + 0.5)  # 3x - 1, plus correct_reward
    # a baseline that was not timed gives no speed credit (and no speedup), not an error
    b = score(r, 0, RewardConfig(baseline="cublaslt_heuristic"))
    assert b.terms["speed"] == 0.0 and b.speedup is None


def test_weights_scale_terms():
    r = result(ok_shape(T1, cand_us=5.0, cublas_us=10.0, err=tolerance(T1)))
    b = score(r, 0, RewardConfig(speed_weight=2.0, accuracy_weight=0.5))
    assert b.terms["speed"] == pytest.approx(2 * math.log(2))
    assert b.terms["accuracy"] == pytest.approx(-0.5)


def test_correct_at_parity_beats_every_failure():
    worst_correct = score(result(ok_shape(T1, err=tolerance(T1))), 0, CFG).total  # parity, at the tolerance
    for status in Status:
        if not status.success:
            assert worst_correct > score(result(shape(status)), 0, CFG).total or status in (Status.INTERNAL_ERROR,
                                                                                             Status.NO_GPU)
    assert worst_correct > score(None, 0, CFG).total


def test_slow_correct_kernel_outscores_a_wrong_answer():
    # correct_reward (0.5) and speed_floor (-0.8) keep every correct kernel above a wrong answer (-0.5).
    wrong = score(result(shape(Status.WRONG_ANSWER)), 0, CFG).total
    assert wrong == pytest.approx(-0.5)
    half = score(result(ok_shape(T1, cand_us=20.0, cublas_us=10.0)), 0, CFG)  # 0.5x: log(0.5) = -0.69, above floor
    assert half.terms["speed"] == pytest.approx(math.log(0.5))
    assert half.total == pytest.approx(0.5 + math.log(0.5))
    tenth = score(result(ok_shape(T1, cand_us=100.0, cublas_us=10.0)), 0, CFG)  # 0.1x: log(0.1) = -2.30, floored
    assert tenth.terms["speed"] == pytest.approx(-0.8)
    assert tenth.total == pytest.approx(0.5 - 0.8)
    assert half.total > wrong and tenth.total > wrong


@pytest.mark.parametrize("form", ["log", "minus_one", "clipped"])
@pytest.mark.parametrize("weight", [1.0, 2.0])
def test_speed_floor(form, weight):
    cfg = RewardConfig(speed_form=form, speed_weight=weight)
    r = result(ok_shape(T1, cand_us=1000.0, cublas_us=10.0))  # 0.01x cuBLAS
    crawl = score(r, 0, cfg)
    assert crawl.speedup == pytest.approx(0.01)  # the measurement is reported unfloored
    assert crawl.terms["speed"] == pytest.approx(-0.8 * weight)
    assert crawl.total == pytest.approx(0.5 - 0.8 * weight)
    # the floor is a config knob, applied after the form
    low = score(r, 0, RewardConfig(speed_form=form, speed_weight=weight, speed_floor=-0.9))
    assert low.terms["speed"] == pytest.approx(-0.9 * weight)


def test_worst_correct_kernel_with_defaults():
    # 0.01x cuBLAS and at the tolerance: 0.5 - 0.8 - 0.1 = -0.4, still above a wrong answer (-0.5).
    b = score(result(ok_shape(T1, cand_us=1000.0, cublas_us=10.0, err=tolerance(T1))), 0, CFG)
    assert b.terms == pytest.approx({"speed": -0.8, "accuracy": -0.1, "length": 0.0, "status": 0.5, "ptxas": 0.0})
    assert b.total == pytest.approx(-0.4)
    assert b.total > score(result(shape(Status.WRONG_ANSWER)), 0, CFG).total
