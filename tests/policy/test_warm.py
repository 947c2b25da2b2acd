"""The warm-start answers of the tiny policy (cudal2.policy.warm): their compile-only rewards must differ, or a CPU
GRPO step sees equal rewards in every group and updates nothing."""

from __future__ import annotations

import pytest

from cudal2.policy.warm import VARIANTS, warm_answer
from cudal2.sandbox.evaluator import EvalOptions, Evaluator
from cudal2.sandbox.types import Status, Task


@pytest.mark.nvcc
def test_the_answers_compile_but_one(tmp_path):
    evaluator = Evaluator(EvalOptions(compile_only=True, arch="sm_80", cache_dir=tmp_path))
    statuses = [evaluator.prepare(v, [Task(64, 64, 64)]).final.shapes[0].status for v in VARIANTS]
    assert statuses == [Status.COMPILED] * (len(VARIANTS) - 1) + [Status.COMPILE_ERROR]
    assert len(set(VARIANTS)) == len(VARIANTS)
    assert all(warm_answer(v).startswith("```cuda\n") for v in VARIANTS)
