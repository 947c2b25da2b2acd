"""make_reward_function(pool, cfg, extract) -> the async reward function GRPOTrainer (TRL 1.16) calls.

Per batch: extract a source from every completion (the policy package's `extract`), evaluate all sources
concurrently on the pool (`asyncio.gather`; completions without a source skip the pool), score each with the
rubric, and log per-batch metrics through TRL's `log_metric(name, value)`:

    reward/<term>     mean of each active term over the batch (reward units)
    status/<status>   how many (completion, shape) outcomes had each status, format_error included (count)
    speedup/best      best geometric-mean speedup over the baseline in the batch (x; only when one was measured)

The dataset rows carry the task in columns M, N, K, acc (TRL passes each as a list, one entry per completion);
an entry may also be a list, for a row of several shapes. Nothing here imports torch, transformers or trl.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from cudal2.reward.config import RewardConfig
from cudal2.reward.rubric import RewardBreakdown, score
from cudal2.reward.terms import ALL_STATUSES
from cudal2.sandbox.types import EVALUATOR_VERSION, Acc, EvalResult, ShapeResult, Status, Task

log = logging.getLogger(__name__)

Extract = Callable[[str], tuple[str | None, str]]  # text -> (source or None, reason)
LogMetric = Callable[[str, float], None]


class Evaluator(Protocol):
    """What the adapter needs of a pool: SandboxPool and PoolClient both fit."""

    def evaluate(self, source: str, tasks: Sequence[Task], caller: str = ...) -> Awaitable[EvalResult]: ...


def completion_text(completion: Any) -> str:
    """The text of one completion: a plain string, or a chat message list ([{"role": "assistant", "content": ...}],
    whose assistant contents are joined)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    parts = [m.get("content") or "" for m in completion if m.get("role", "assistant") == "assistant"]
    return "".join(str(p) for p in parts)


def row_tasks(m: Any, n: Any, k: Any, acc: Any) -> tuple[Task, ...]:
    """The task(s) of one dataset row: scalars give one Task; equal-length lists give one Task per shape."""
    if isinstance(m, (list, tuple)):
        accs = acc if isinstance(acc, (list, tuple)) else [acc] * len(m)
        return tuple(Task(int(a), int(b), int(c), Acc(d or Acc.FP32)) for a, b, c, d in zip(m, n, k, accs, strict=True))
    return (Task(int(m), int(n), int(k), Acc(acc or Acc.FP32)),)


def _failed(source: str, tasks: Sequence[Task], reason: str) -> EvalResult:
    """An internal_error result for a pool call that raised (reported; not the candidate's fault)."""
    shapes = tuple(ShapeResult(t, Status.INTERNAL_ERROR, reason) for t in tasks)
    return EvalResult("", "unknown", EVALUATOR_VERSION, None, shapes)


def batch_metrics(breakdowns: Sequence[RewardBreakdown]) -> dict[str, float]:
    """The metrics logged per batch (see the module docstring)."""
    if not breakdowns:
        return {}
    out: dict[str, float] = {}
    for term in breakdowns[0].terms:
        out[f"reward/{term}"] = sum(b.terms[term] for b in breakdowns) / len(breakdowns)
    counts = Counter(s for b in breakdowns for s in b.statuses)
    for status in ALL_STATUSES:
        out[f"status/{status}"] = float(counts.get(status, 0))
    speedups = [b.speedup for b in breakdowns if b.speedup is not None]
    if speedups:
        out["speedup/best"] = max(speedups)
    return out


def make_reward_function(pool: Evaluator, cfg: RewardConfig, extract: Extract,
                         caller: str = "trainer") -> Callable[..., Awaitable[list[float]]]:
    """The async reward function for GRPOTrainer(reward_funcs=[...]). Its `last_breakdowns` attribute holds the
    previous batch's RewardBreakdowns (for tests and ablation reports)."""

    async def evaluate(source: str | None, tasks: tuple[Task, ...]) -> EvalResult | None:
        if source is None:
            return None
        try:
            return await pool.evaluate(source, tasks, caller)
        except Exception as exc:  # a pool that raises (e.g. a lost server) must not stop training
            log.warning("pool.evaluate failed: %s: %s", type(exc).__name__, exc)
            return _failed(source, tasks, f"pool call failed: {type(exc).__name__}: {exc}")

    async def cudal2_reward(prompts, completions, completion_ids, M, N, K, acc, trainer_state=None,
                            log_metric: LogMetric | None = None, **kwargs) -> list[float]:
        texts = [completion_text(c) for c in completions]
        tasks = [row_tasks(m, n, k, a) for m, n, k, a in zip(M, N, K, acc, strict=True)]
        sources = [extract(t)[0] for t in texts]
        results = await asyncio.gather(*(evaluate(s, t) for s, t in zip(sources, tasks, strict=True)))
        n_tokens = [len(ids) for ids in completion_ids] if completion_ids is not None else [0] * len(texts)
        breakdowns = [score(r, n, cfg) for r, n in zip(results, n_tokens, strict=True)]
        cudal2_reward.last_breakdowns = breakdowns
        if log_metric is not None:
            for name, value in batch_metrics(breakdowns).items():
                log_metric(name, value)
        return [b.total for b in breakdowns]

    cudal2_reward.__name__ = cudal2_reward.__qualname__ = "cudal2_reward"
    cudal2_reward.last_breakdowns = []
    return cudal2_reward
