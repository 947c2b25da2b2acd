from __future__ import annotations

import dataclasses

import pytest

from cudal2.reward.config import BASELINES, TERMS, RewardConfig, SpeedForm


def test_defaults_are_valid_and_simple_types():
    cfg = RewardConfig()
    assert cfg.form is SpeedForm.LOG and cfg.baseline == "cublas" and cfg.drop == []
    assert cfg.length_weight == 0.0  # off by default (Kevin-32B)
    assert (cfg.correct_reward, cfg.speed_floor) == (0.5, -0.8)
    # the worst correct kernel (speed at the floor, accuracy saturated) stays above a wrong answer
    worst_correct = cfg.correct_reward + cfg.speed_weight * cfg.speed_floor - cfg.accuracy_weight
    assert worst_correct == pytest.approx(-0.4) and worst_correct > cfg.penalty_wrong_answer
    for f in dataclasses.fields(RewardConfig):
        assert f.type in ("float", "int", "str", "bool", "list[str]"), f.name


@pytest.mark.parametrize("kwargs, word", [
    ({"speed_form": "linear"}, "speed_form"),
    ({"baseline": "torch"}, "baseline"),
    ({"drop": ["speed", "bogus"]}, "bogus"),
    ({"length_scale_tokens": 0}, "length_scale_tokens"),
    ({"speed_clip": 0.0}, "speed_clip"),
])
def test_bad_values_raise_one_line(kwargs, word):
    with pytest.raises(ValueError) as info:
        RewardConfig(**kwargs)
    assert word in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("form", [f.value for f in SpeedForm])
@pytest.mark.parametrize("baseline", BASELINES)
def test_every_form_and_baseline_accepted(form, baseline):
    RewardConfig(speed_form=form, baseline=baseline, drop=list(TERMS))


def test_every_field_has_help():
    for f in dataclasses.fields(RewardConfig):
        assert f.metadata.get("help"), f.name


def test_parses_as_cli_flags_and_yaml_keys():
    transformers = pytest.importorskip("transformers")
    parser = transformers.HfArgumentParser(RewardConfig)
    (cfg,) = parser.parse_args_into_dataclasses(["--speed_form", "clipped", "--drop", "length", "ptxas",
                                                 "--length_weight", "0.3"])
    assert (cfg.form, cfg.drop, cfg.length_weight) == (SpeedForm.CLIPPED, ["length", "ptxas"], 0.3)
    (cfg,) = parser.parse_dict({"baseline": "cublaslt_autotuned", "drop": ["speed"]})
    assert (cfg.baseline, cfg.drop) == ("cublaslt_autotuned", ["speed"])
