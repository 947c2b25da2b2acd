"""score(EvalResult | None, n_completion_tokens, RewardConfig) -> RewardBreakdown: the reward of one completion.

Formula (every term that is in cfg.drop is left out of `terms` and of the total):

    total = speed + accuracy + length + status + ptxas

    status   = mean over shapes of the status's reward (ok: +correct_reward; compiled: 0; any other status: its
               penalty; format_error: penalty_format, one shape)
    -- the following only when the candidate succeeded on every shape (all ok, or all compiled); otherwise 0 --
    length   = -length_weight * max(0, n_tokens - length_free_tokens) / length_scale_tokens
    accuracy = -accuracy_weight * mean over ok shapes of min(1, max_rel_err / tolerance(task))
    speed    = speed_weight * max(speed_floor, f(s_1..s_n))   (all shapes ok; s_i = baseline / candidate median)
               f = log(G) | G - 1 | G' - 1, G the geometric mean of s_i, G' that of min(s_i, speed_clip)
    ptxas    = compiled_reward - spill_penalty_per_kb * spill_bytes / 1024
               - register_penalty * [some kernel uses > register_limit registers]   (all shapes compiled),
               floored at min(0, compiled_reward): spilling never scores below failing

So a failing candidate (any shape not ok/compiled, or no usable code) gets its status term and nothing else:
no speed credit, no accuracy or length charge (its ok shapes still add correct_reward to the status mean).
`None` for the result means the completion had no usable code.

Caveat of the defaults: a correct kernel, however slow, scores at least
correct_reward + speed_weight * speed_floor - accuracy_weight = 0.5 - 0.8 - 0.1 = -0.4, above a wrong answer (-0.5)
and every other whole-candidate failure. The price is that speed stops being rewarded below the floor: under log
every kernel slower than exp(-0.8) = 0.45x cuBLAS gets the same speed term (minus_one / clipped: below 0.2x).
The ordering holds per candidate, not per shape: one that is ok on some shapes and fails others averages
correct_reward into its status term (ok + wrong_answer: 0.0), which can beat a correct kernel that is slow.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cudal2.reward.config import TERMS, RewardConfig
from cudal2.reward.terms import FORMAT_ERROR, accuracy_term, length_term, ptxas_term, speed_term, status_term
from cudal2.sandbox.types import Acc, EvalResult, Status, Task

# Relative-error limits at K=1024, scaled by sqrt(K/1024). They mirror the evaluator's defaults
# (EvalOptions.tol_fp32 / tol_fp16, and the harness's tolerance()); a test keeps them in step.
TOL_FP32 = 2.5e-4
TOL_FP16 = 5e-3


def tolerance(task: Task) -> float:
    """The evaluator's default relative-error limit for `task` (dimensionless).

    fp32 accumulation: 2.5e-4 * sqrt(K/1024); fp16 accumulation: 5e-3 * sqrt(K/1024). For fp16 the harness may
    allow more (twice cuBLAS's own fp16 error on the inputs), so an ok result's ratio can pass 1; it saturates.
    """
    base = TOL_FP16 if task.acc is Acc.FP16 else TOL_FP32
    return base * math.sqrt(task.k / 1024.0)


@dataclass(frozen=True)
class RewardBreakdown:
    """One completion's reward and where it came from."""

    total: float  # the reward handed to the trainer: sum of `terms`
    terms: dict[str, float]  # signed, weighted contribution of each active (not dropped) term
    statuses: tuple[str, ...]  # per shape, Status values; ("format_error",) when no code was extracted
    speedup: float | None  # geometric-mean speedup over the baseline when every shape is ok and timed, else None


def geomean(values: Sequence[float]) -> float | None:
    """Geometric mean of the finite positive values; None when there are none."""
    logs = [math.log(v) for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None


def score(result: EvalResult | None, n_completion_tokens: int, cfg: RewardConfig,
          tolerance_of: Callable[[Task], float] = tolerance) -> RewardBreakdown:
    """Reward of one completion (see the module docstring for the formula)."""
    if result is None:
        statuses: tuple[str, ...] = (FORMAT_ERROR,)
    elif not result.shapes:  # nothing was evaluated: the evaluator's failure, not the candidate's
        statuses = (Status.INTERNAL_ERROR.value,)
    else:
        statuses = tuple(s.status.value for s in result.shapes)

    values = dict.fromkeys(TERMS, 0.0)
    values["status"] = status_term(statuses, cfg)
    speedup = None
    if result is not None and result.ok:
        shapes = result.shapes
        values["length"] = cfg.length_weight * length_term(n_completion_tokens, cfg.length_free_tokens,
                                                           cfg.length_scale_tokens)
        ratios = [s.max_rel_err / tolerance_of(s.task) for s in shapes
                  if s.status is Status.OK and s.max_rel_err is not None]
        values["accuracy"] = cfg.accuracy_weight * accuracy_term(ratios)
        if all(s.status is Status.OK for s in shapes):
            speedups = [x for s in shapes if (x := s.speedup(cfg.baseline)) is not None]
            values["speed"] = cfg.speed_weight * max(cfg.speed_floor, speed_term(speedups, cfg.form, cfg.speed_clip))
            speedup = geomean(speedups)
        if all(s.status is Status.COMPILED for s in shapes):
            values["ptxas"] = ptxas_term(result.compile.kernels if result.compile else (), cfg)

    terms = {t: v + 0.0 for t, v in values.items() if cfg.active(t)}  # + 0.0: no "-0.0" in logs
    return RewardBreakdown(total=sum(terms.values()), terms=terms, statuses=statuses, speedup=speedup)
