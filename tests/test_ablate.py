"""`cudal2 ablate`: variants, the comparison table from run logs, and usage errors. (A real ablation runs train.py
once per variant; tests/test_train.py covers train.py itself.)"""

from __future__ import annotations

import json

import pytest

from cudal2 import ablate, cli


def test_variants_full_first_then_one_per_drop():
    assert ablate.variants(["length", "accuracy"]) == [("full", []), ("no_length", ["length"]),
                                                         ("no_accuracy", ["accuracy"])]


def test_summary_and_table_from_a_run_log(tmp_path):
    log = tmp_path / "cudal2_run.json"
    log.write_text(json.dumps({"metrics": {"train_runtime": 12.5}, "log_history": [
        {"reward": -0.5, "status/compiled": 2, "status/format_error": 2, "status/compile_error": 0},
        {"reward": 0.5, "status/compiled": 3, "status/format_error": 0, "status/compile_error": 1},
        {"train_runtime": 12.5},
    ]}))
    s = ablate.summarize("full", 0, log)
    assert (s.steps, s.reward_last, s.reward_mean, s.success_rate, s.format_error_rate) == (2, 0.5, 0.0, 0.625, 0.25)
    failed = ablate.summarize("no_speed", 2, tmp_path / "missing.json")
    text = ablate.table([s, failed])
    assert "| full | 0 | 2 | 0.500 | 0.000 | 62% | 25% | 12.5 |" in text
    assert "| no_speed | 2 | 0 | - |" in text


@pytest.mark.parametrize("argv, message", [
    (["ablate", "--config", "/no/such.yaml", "--drop", "length"], "no such config"),
    (["ablate", "--config", "configs/smoke_cpu.yaml", "--drop", "charm"], "--drop takes reward terms"),
    (["ablate", "--config", "configs/smoke_cpu.yaml"], "at least one"),
])
def test_usage_errors(capsys, monkeypatch, argv, message):
    from tests.sandbox.corpus import ROOT

    monkeypatch.chdir(ROOT)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
