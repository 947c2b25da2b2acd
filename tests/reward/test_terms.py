from __future__ import annotations

import math

import pytest

from cudal2.reward.config import RewardConfig, SpeedForm
from cudal2.reward.terms import (
    ALL_STATUSES,
    FORMAT_ERROR,
    accuracy_term,
    length_term,
    ptxas_term,
    speed_term,
    status_penalty,
    status_term,
)
from cudal2.sandbox.types import Status

from .builders import kernel

CFG = RewardConfig()


# ------------------------------------------------------------------------------------------------------- speed
@pytest.mark.parametrize("form", list(SpeedForm))
def test_speed_parity_is_zero(form):
    assert speed_term([1.0], form, 8.0) == pytest.approx(0.0)
    assert speed_term([1.0, 1.0, 1.0], form, 8.0) == pytest.approx(0.0)


@pytest.mark.parametrize("form", list(SpeedForm))
def test_speed_empty_is_zero(form):
    assert speed_term([], form, 8.0) == 0.0


@pytest.mark.parametrize("form, speedups, expected", [
    (SpeedForm.LOG, [2.0], math.log(2.0)),
    (SpeedForm.LOG, [0.5], -math.log(2.0)),
    (SpeedForm.LOG, [2.0, 0.5], 0.0),  # geometric mean 1
    (SpeedForm.LOG, [2.0, 8.0], math.log(4.0)),
    (SpeedForm.MINUS_ONE, [2.0], 1.0),
    (SpeedForm.MINUS_ONE, [0.5], -0.5),
    (SpeedForm.MINUS_ONE, [2.0, 8.0], 3.0),  # geometric mean 4
    (SpeedForm.MINUS_ONE, [100.0], 99.0),  # no clip in this form
    (SpeedForm.CLIPPED, [2.0], 1.0),
    (SpeedForm.CLIPPED, [100.0], 7.0),  # clipped at 8
    (SpeedForm.CLIPPED, [64.0, 1.0], math.sqrt(8.0) - 1.0),  # clip per shape, then geometric mean
    (SpeedForm.CLIPPED, [0.25], -0.75),  # slowdowns are not clipped
])
def test_speed_values(form, speedups, expected):
    assert speed_term(speedups, form, 8.0) == pytest.approx(expected)


def test_speed_accepts_form_strings_and_skips_unmeasurable():
    assert speed_term([2.0], "log", 8.0) == pytest.approx(math.log(2.0))
    assert speed_term([2.0, 0.0, float("inf"), float("nan")], "minus_one", 8.0) == pytest.approx(1.0)
    assert speed_term([0.0], "log", 8.0) == 0.0


def test_speed_clip_parameter_is_used():
    assert speed_term([10.0], SpeedForm.CLIPPED, 2.0) == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------------- accuracy
@pytest.mark.parametrize("ratios, expected", [
    ([], 0.0),
    ([0.0], 0.0),
    ([0.5], -0.5),
    ([1.0], -1.0),
    ([30.0], -1.0),  # saturates
    ([0.2, 0.4], -0.3),
    ([0.5, 5.0], -0.75),
    ([float("nan")], -1.0),
    ([-1.0], 0.0),
])
def test_accuracy(ratios, expected):
    assert accuracy_term(ratios) == pytest.approx(expected)


# ------------------------------------------------------------------------------------------------------ length
@pytest.mark.parametrize("n, expected", [
    (0, 0.0),
    (2048, 0.0),
    (2049, -1 / 4096),
    (2048 + 4096, -1.0),
    (2048 + 2 * 4096, -2.0),
])
def test_length(n, expected):
    assert length_term(n, 2048, 4096) == pytest.approx(expected)


# ------------------------------------------------------------------------------------------------------ status
def test_status_ok_earns_correct_reward_compiled_and_empty_are_zero():
    assert status_term(["ok", "ok"], CFG) == pytest.approx(0.5)
    assert status_term(["ok"], RewardConfig(correct_reward=0.2)) == pytest.approx(0.2)
    assert status_term(["compiled"], CFG) == 0.0
    assert status_term([], CFG) == 0.0


@pytest.mark.parametrize("status, field", [
    ("ok", "correct_reward"),
    (FORMAT_ERROR, "penalty_format"),
    ("static_reject", "penalty_static_reject"),
    ("compile_error", "penalty_compile_error"),
    ("runtime_error", "penalty_runtime_error"),
    ("timeout", "penalty_timeout"),
    ("wrong_answer", "penalty_wrong_answer"),
    ("rejected_behaviour", "penalty_rejected_behaviour"),
    ("internal_error", "penalty_internal_error"),
    ("no_gpu", "penalty_internal_error"),
])
def test_status_penalties_follow_config(status, field):
    assert status_term([status], CFG) == getattr(CFG, field)
    cfg = RewardConfig(**{field: -0.37})
    assert status_term([status], cfg) == -0.37


def test_status_mean_over_shapes():
    assert status_term(["ok", "wrong_answer"], CFG) == pytest.approx(0.0)  # (0.5 - 0.5) / 2
    assert status_term(["ok", "wrong_answer"], RewardConfig(correct_reward=1.0)) == pytest.approx(0.25)
    assert status_term(["ok", "compiled", "compile_error"], CFG) == pytest.approx((0.5 + 0.0 - 0.8) / 3)
    assert status_term(["compile_error"] * 3, CFG) == pytest.approx(-0.8)


def test_every_status_has_a_penalty_and_unknown_raises():
    assert set(ALL_STATUSES) == {s.value for s in Status} | {FORMAT_ERROR}
    for s in ALL_STATUSES:
        status_penalty(s, CFG)
    with pytest.raises(ValueError, match="unknown status"):
        status_term(["exploded"], CFG)


# ------------------------------------------------------------------------------------------------------- ptxas
@pytest.mark.parametrize("kernels, expected", [
    ((), 0.5),
    ((kernel(),), 0.5),
    ((kernel(spill_store=512, spill_load=512),), 0.5 - 0.1),  # 1 KiB of spill
    ((kernel(spill_store=1024), kernel(spill_load=1024)), 0.5 - 0.2),  # summed over kernels
    ((kernel(spill_store=1 << 20),), 0.0),  # floored: never below a failing candidate
    ((kernel(registers=255),), 0.5),
])
def test_ptxas(kernels, expected):
    assert ptxas_term(kernels, CFG) == pytest.approx(expected)


def test_ptxas_register_limit():
    cfg = RewardConfig(register_limit=128, register_penalty=0.25)
    assert ptxas_term((kernel(registers=128),), cfg) == pytest.approx(0.5)
    assert ptxas_term((kernel(registers=129), kernel(registers=64)), cfg) == pytest.approx(0.25)
