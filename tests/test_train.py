"""train.py on the CPU: a 2-step GRPO run with the tiny local policy and the real nvcc compile-only reward; resume;
bad configs. (The GPU run with the full reward is made on the device, not here.)"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

import train  # noqa: E402
from cudal2.sandbox.types import Mode  # noqa: E402
from tests.sandbox.corpus import ROOT  # noqa: E402

pytestmark = pytest.mark.nvcc
CONFIG = str(ROOT / "configs" / "smoke_cpu.yaml")


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny") / "policy")


def run(tmp_path, tiny_path, *extra) -> int:
    return train.main(["--config", CONFIG, "--tiny_path", tiny_path, "--output_dir", str(tmp_path / "out"),
                       "--db", str(tmp_path / "r.sqlite"), "--report_to", "none", *extra])


def weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_two_grpo_steps_change_parameters_and_log_reward_terms(tmp_path, tiny_path):
    from pathlib import Path

    assert run(tmp_path, tiny_path) == 0
    before, after = weights(Path(tiny_path)), weights(tmp_path / "out")
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "GRPO updated no parameter"
    state = json.loads((tmp_path / "out" / "checkpoint-2" / "trainer_state.json").read_text())
    logs = [h for h in state["log_history"] if "reward" in h]
    assert len(logs) == 2
    for key in ("reward/status", "reward/ptxas", "status/compiled", "status/format_error", "reward_std"):
        assert all(key in h for h in logs), key
    # Every one of the 16 completions (2 steps x 8) got exactly one status. Which ones depends on what the random
    # policy writes (random weights, a tokenizer trained per TINY_VERSION): count them all.
    assert sum(v for h in logs for k, v in h.items() if k.startswith("status/")) == 16
    # The step time split (cudal2.policy.grpo): every step generated and evaluated (steps_per_generation = 1).
    for h in logs:
        parts = [h["time/generation_s"], h["time/evaluation_s"], h["time/update_s"]]
        assert all(p > 0 for p in parts), h
        assert h["time/evaluation_share"] == pytest.approx(parts[1] / sum(parts), rel=1e-6)


def test_resume_continues_from_the_last_checkpoint(tmp_path, tiny_path):
    assert run(tmp_path, tiny_path) == 0
    assert run(tmp_path, tiny_path, "--resume", "true", "--max_steps", "3", "--save_steps", "3") == 0
    state = json.loads((tmp_path / "out" / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    assert len([h for h in state["log_history"] if "reward" in h]) == 3  # 2 restored + 1 new


@pytest.mark.parametrize("extra, message", [
    (["--shapes", "/no/such.csv"], "cannot read"),
    (["--model", "/no/such/model"], "/no/such/model"),
    (["--speed_form", "cubic"], "speed_form"),
    (["--eval_mode", "server"], "eval_mode 'server': one of offline, cold"),
    (["--eval_mode", "cold", "--pool_server", "/no/such/state.json"], "eval_mode cold with pool_server"),
])
def test_bad_input_is_one_line_error(tmp_path, tiny_path, capsys, extra, message):
    assert run(tmp_path, tiny_path, *extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


FAKE_SMI = """#!/bin/sh
# nvidia-smi of a machine with two H200s: answers --id=N --query-gpu=... for N in 0, 1
case "$1" in --id=0|--id=1) echo "NVIDIA H200, 9.0, 143771";; *) exit 6;; esac
"""


@pytest.mark.parametrize("extra, expected", [
    ([], "0"),                                  # the pool takes every GPU: the trainer shares GPU 0
    (["--pool_gpus", "1"], "0"),                # split: trainer on the free GPU
    (["--pool_gpus", "0"], "1"),
    (["--pool_gpus", "0", "--trainer_gpus", "0"], "0"),  # an explicit choice wins
])
def test_trainer_placement_sees_one_gpu_the_pool_leaves_free(tmp_path, monkeypatch, extra, expected):
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:/usr/bin:/bin")
    for var in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "CUDAL2_NO_GPU"):
        monkeypatch.setenv(var, "x")  # so that teardown restores the environment whatever place_trainer sets
        monkeypatch.delenv(var)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("pool_gpus: all\n")
    assert train.place_trainer(["--config", str(cfg), *extra]) == expected
    assert train.os.environ["CUDA_VISIBLE_DEVICES"] == expected


def test_trainer_placement_leaves_a_launchers_choice(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert train.place_trainer(["--pool_gpus", "0"]) is None
    assert train.os.environ["CUDA_VISIBLE_DEVICES"] == "3"


def test_the_reward_pool_times_in_the_eval_mode_named(tmp_path):
    """eval_mode cold reaches the pool's evaluator options (offline by default); the pool runs no GPU work here."""
    for name, mode in (("offline", Mode.OFFLINE), ("cold", Mode.COLD)):
        pool = train.make_pool(train.PoolArgs(pool_gpus="none", compile_only=True, db=str(tmp_path / "r.sqlite"),
                                              eval_mode=name))
        try:
            assert pool.config.eval.mode is mode
        finally:
            pool.shutdown()
