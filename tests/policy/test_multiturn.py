"""Multi-turn rollout for TRL: feedback between turns, masked out of the loss (tiny policy, compile-only pool)."""

from __future__ import annotations

import types

import pytest

pytest.importorskip("torch")

from cudal2.policy.config import PolicyConfig  # noqa: E402
from cudal2.policy.multiturn import _task_of, make_rollout  # noqa: E402
from cudal2.policy.prompt import build_messages  # noqa: E402
from cudal2.sandbox.evaluator import EvalOptions  # noqa: E402
from cudal2.sandbox.pool import PoolConfig, SandboxPool  # noqa: E402
from cudal2.sandbox.types import Acc, Task  # noqa: E402

pytestmark = pytest.mark.nvcc


def test_task_is_read_back_from_the_prompt(tiny_tokenizer):
    for task in (Task(64, 4096, 128), Task(77, 1000, 333, Acc.FP16)):
        assert _task_of(build_messages(task, "NVIDIA H200", [], tiny_tokenizer, 2048)) == task


def test_two_turns_with_masked_feedback(tmp_path, tiny_dir):
    from cudal2.policy.model import load_policy

    model, tok = load_policy(PolicyConfig(model=str(tiny_dir)), apply_lora=False)
    prompt = build_messages(Task(64, 64, 64), "NVIDIA H200", [], tok, 2048)
    trainer = types.SimpleNamespace(model=model, processing_class=tok,
                                    accelerator=types.SimpleNamespace(unwrap_model=lambda m: m))
    cfg = PoolConfig(gpus=(), db_path="", eval=EvalOptions(compile_only=True, cache_dir=tmp_path / "build"))
    with SandboxPool(cfg) as pool:
        out = make_rollout(pool, 2, 1.0, 24)([prompt, prompt], trainer)
    assert len(out["prompt_ids"]) == len(out["completion_ids"]) == 2
    for comp, lps, mask in zip(out["completion_ids"], out["logprobs"], out["env_mask"], strict=True):
        assert len(comp) == len(lps) == len(mask)
        assert 0 in mask and mask[0] == 1  # model tokens, then feedback tokens, then model tokens again
        assert all(lp == 0.0 for lp, m in zip(lps, mask, strict=True) if m == 0)
        feedback = tok.decode([t for t, m in zip(comp, mask, strict=True) if m == 0])
        assert "Answer with one ```cuda block" in feedback or "Evaluation:" in feedback
