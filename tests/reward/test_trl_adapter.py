"""The TRL adapter against a fake pool: FakePool stands in for the GPU (it returns hand-built EvalResults keyed by
the candidate source); what is tested is the adapter's logic (extraction, concurrency, scoring, metrics)."""

from __future__ import annotations

import asyncio
import inspect
import math
import subprocess
import sys

import pytest

from cudal2.reward import RewardConfig, make_reward_function
from cudal2.reward.terms import ALL_STATUSES
from cudal2.reward.trl_adapter import completion_text, row_tasks
from cudal2.sandbox.types import Acc, EvalResult, Status, Task

from .builders import ok_shape, result, shape

FAST = "// fast\n__global__ void k() {}"  # 2x faster than cuBLAS, exact
SLOW = "// slow\n__global__ void k() {}"  # 2x slower, exact
BROKEN = "// broken\n__global__ void k() {"  # compile error
BOOM = "// boom"  # the pool call raises


class FakePool:
    def __init__(self, expect_concurrent: int = 0):
        self.calls: list[tuple[str, tuple[Task, ...], str]] = []
        self.expect_concurrent = expect_concurrent
        self._started = 0
        self._all_started: asyncio.Event | None = None

    async def evaluate(self, source: str, tasks, caller: str = "default") -> EvalResult:
        self.calls.append((source, tuple(tasks), caller))
        if self.expect_concurrent:  # every call must be in flight at once, or this deadlocks (caught by wait_for)
            self._all_started = self._all_started or asyncio.Event()
            self._started += 1
            if self._started == self.expect_concurrent:
                self._all_started.set()
            await asyncio.wait_for(self._all_started.wait(), timeout=5)
        await asyncio.sleep(0)
        if source == FAST:
            return result(*(ok_shape(t, cand_us=5.0, cublas_us=10.0) for t in tasks))
        if source == SLOW:
            return result(*(ok_shape(t, cand_us=20.0, cublas_us=10.0) for t in tasks))
        if source == BROKEN:
            return result(*(shape(Status.COMPILE_ERROR, t) for t in tasks))
        raise ConnectionError("pool server went away")


def extract(text: str) -> tuple[str | None, str]:
    """Stand-in for the policy package's extractor: the body of the first ```cuda block."""
    start = text.find("```cuda\n")
    if start < 0:
        return None, "no ```cuda block"
    end = text.find("```", start + 8)
    return (text[start + 8:end].strip() if end > 0 else None), ("" if end > 0 else "unterminated block")


def wrap(src: str) -> str:
    return f"Here is my kernel.\n```cuda\n{src}\n```\n"


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def call(fn, completions, *, shapes=None, token_counts=None, log=None):
    n = len(completions)
    shapes = shapes or [(1024, 1024, 1024, "fp32")] * n
    M, N, K, acc = (list(col) for col in zip(*shapes, strict=True))
    ids = [[0] * c for c in (token_counts or [10] * n)]
    return asyncio.run(fn(prompts=["p"] * n, completions=completions, completion_ids=ids, M=M, N=N, K=K, acc=acc,
                          trainer_state=None, log_metric=log, extra_column=[None] * n))


@pytest.mark.parametrize("as_chat", [False, True], ids=["strings", "chat"])
def test_rewards_and_metrics(as_chat):
    pool = FakePool()
    fn = make_reward_function(pool, RewardConfig(), extract, caller="trainer-0")
    texts = [wrap(FAST), wrap(SLOW), wrap(BROKEN), "I could not write a kernel."]
    completions = [chat(t) for t in texts] if as_chat else texts
    logged: dict[str, float] = {}
    rewards = call(fn, completions, log=logged.__setitem__)

    # ok candidates also get correct_reward = 0.5; SLOW's log(0.5) = -0.69 is above speed_floor = -0.8
    assert rewards == pytest.approx([math.log(2) + 0.5, -math.log(2) + 0.5, -0.8, -1.0])
    # the extraction failure never reached the pool; the rest did, with the row's task and the caller name
    assert sorted(c[0] for c in pool.calls) == sorted([FAST, SLOW, BROKEN])
    assert all(c[1] == (Task(1024, 1024, 1024),) and c[2] == "trainer-0" for c in pool.calls)

    assert logged["reward/speed"] == pytest.approx(0.0)  # (log 2 - log 2 + 0 + 0) / 4
    assert logged["reward/status"] == pytest.approx((0.5 + 0.5 - 0.8 - 1.0) / 4)
    assert logged["reward/accuracy"] == logged["reward/length"] == logged["reward/ptxas"] == 0.0
    assert logged["status/ok"] == 2 and logged["status/compile_error"] == 1 and logged["status/format_error"] == 1
    assert logged["status/wrong_answer"] == 0 and logged["status/internal_error"] == 0
    assert logged["speedup/best"] == pytest.approx(2.0)
    expected = {f"reward/{t}" for t in ("speed", "accuracy", "length", "status", "ptxas")}
    expected |= {f"status/{s}" for s in ALL_STATUSES} | {"speedup/best"}
    assert set(logged) == expected

    assert [b.total for b in fn.last_breakdowns] == rewards
    assert [b.statuses for b in fn.last_breakdowns] == [("ok",), ("ok",), ("compile_error",), ("format_error",)]


def test_signature_name_and_no_logger():
    fn = make_reward_function(FakePool(), RewardConfig(), extract)
    assert fn.__name__ == "cudal2_reward" and inspect.iscoroutinefunction(fn)
    assert fn.last_breakdowns == []
    assert call(fn, [wrap(FAST)]) == pytest.approx([math.log(2) + 0.5])  # log_metric=None is fine


def test_evaluations_run_concurrently():
    pool = FakePool(expect_concurrent=6)
    fn = make_reward_function(pool, RewardConfig(), extract)
    rewards = call(fn, [wrap(FAST), wrap(SLOW), wrap(BROKEN)] * 2)
    assert len(pool.calls) == 6 and rewards[:3] == rewards[3:]


def test_pool_failure_becomes_reported_internal_error():
    fn = make_reward_function(FakePool(), RewardConfig(), extract)
    logged: dict[str, float] = {}
    rewards = call(fn, [wrap(BOOM), wrap(FAST)], log=logged.__setitem__)
    assert rewards == pytest.approx([0.0, math.log(2) + 0.5])  # penalty_internal_error = 0
    assert logged["status/internal_error"] == 1
    assert fn.last_breakdowns[0].statuses == ("internal_error",)


def test_drop_and_length_reach_the_adapter():
    cfg = RewardConfig(drop=["speed"], length_weight=1.0, length_free_tokens=100, length_scale_tokens=100)
    fn = make_reward_function(FakePool(), cfg, extract)
    logged: dict[str, float] = {}
    rewards = call(fn, [wrap(FAST), wrap(FAST)], token_counts=[100, 300], log=logged.__setitem__)
    assert rewards == pytest.approx([0.5, 0.5 - 2.0])  # correct_reward minus the length charge
    assert "reward/speed" not in logged and logged["reward/length"] == pytest.approx(-1.0)
    assert logged["reward/status"] == pytest.approx(0.5)
    assert logged["speedup/best"] == pytest.approx(2.0)


def test_per_row_tasks_and_multi_shape_rows():
    pool = FakePool()
    fn = make_reward_function(pool, RewardConfig(), extract)
    call(fn, [wrap(FAST), wrap(SLOW)], shapes=[(64, 4096, 64, "fp16"), ([8, 16], [32, 64], [128, 256], "fp32")])
    by_source = {c[0]: c[1] for c in pool.calls}
    assert by_source[FAST] == (Task(64, 4096, 64, Acc.FP16),)
    assert by_source[SLOW] == (Task(8, 32, 128), Task(16, 64, 256))
    assert fn.last_breakdowns[1].statuses == ("ok", "ok")


def test_no_speedup_logged_when_none_measured():
    fn = make_reward_function(FakePool(), RewardConfig(), extract)
    logged: dict[str, float] = {}
    call(fn, [wrap(BROKEN), "nothing"], log=logged.__setitem__)
    assert "speedup/best" not in logged


@pytest.mark.parametrize("completion, text", [
    ("plain", "plain"),
    ([{"role": "assistant", "content": "a"}], "a"),
    ([{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}], "ab"),
    ([{"role": "tool", "content": "x"}, {"role": "assistant", "content": "a"}], "a"),
    ([{"role": "assistant", "content": None}], ""),
    ({"role": "assistant", "content": "d"}, "d"),
])
def test_completion_text(completion, text):
    assert completion_text(completion) == text


def test_row_tasks():
    assert row_tasks(1, 2, 3, None) == (Task(1, 2, 3),)
    assert row_tasks(1, 2, 3, "fp16") == (Task(1, 2, 3, Acc.FP16),)
    assert row_tasks([1, 4], [2, 5], [3, 6], ["fp16", "fp32"]) == (Task(1, 2, 3, Acc.FP16), Task(4, 5, 6))


def test_importable_without_torch_transformers_trl():
    code = ("import sys\n"
            "for m in ('torch', 'transformers', 'trl', 'accelerate', 'datasets', 'numpy'): sys.modules[m] = None\n"
            "import cudal2.reward, cudal2.reward.trl_adapter\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr

