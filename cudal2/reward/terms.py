"""One small pure function per reward term; each takes only the fields it uses.

Signs: every function returns its signed contribution per unit weight (speed can be either sign; accuracy and
length are <= 0). status_term and ptxas_term are already in reward units (their magnitudes are config fields), so
the rubric adds them as they are.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from cudal2.reward.config import RewardConfig, SpeedForm
from cudal2.sandbox.types import KernelResources, Status

# Pseudo-status of a completion from which no source could be extracted (never reached the pool).
FORMAT_ERROR = "format_error"

# Every status the rubric can report, in a stable order (for per-status metrics).
ALL_STATUSES = tuple(s.value for s in Status) + (FORMAT_ERROR,)


def speed_term(speedups: Sequence[float], form: SpeedForm | str, clip: float) -> float:
    """Speed credit from per-shape speedups (baseline time / candidate time, x).

    The shapes are averaged in log space: G = exp(mean(log s_i)), the geometric mean. Then
      log:       log(G)            (= mean of the per-shape log speedups)
      minus_one: G - 1
      clipped:   G' - 1, G' the geometric mean of min(s_i, clip)
    Parity (every s_i = 1) gives 0 in every form. No speedups -> 0. Values that are not finite and positive
    (unmeasurable) are skipped.
    """
    form = SpeedForm(form)
    logs = [math.log(min(s, clip) if form is SpeedForm.CLIPPED else s)
            for s in speedups if math.isfinite(s) and s > 0]
    if not logs:
        return 0.0
    mean_log = sum(logs) / len(logs)
    return mean_log if form is SpeedForm.LOG else math.exp(mean_log) - 1.0


def accuracy_term(errors_over_tol: Sequence[float]) -> float:
    """-mean(min(1, e_i)) over shapes, e_i = max_rel_err / tolerance (dimensionless). In [-1, 0].

    Exact results cost nothing; a result at (or past) the tolerance costs the full weight. A non-finite ratio
    counts as saturated. No errors -> 0.
    """
    if not errors_over_tol:
        return 0.0
    clipped = [min(1.0, max(0.0, e)) if math.isfinite(e) else 1.0 for e in errors_over_tol]
    return -sum(clipped) / len(clipped)


def length_term(n_tokens: int, free: int, scale: int) -> float:
    """-max(0, n_tokens - free) / scale: minus one per `scale` tokens beyond the free allowance (tokens)."""
    return -max(0, n_tokens - free) / scale


def status_penalty(status: str, cfg: RewardConfig) -> float:
    """Reward of one shape's outcome: correct_reward for ok, 0 for compiled (compile-only; the ptxas term rewards
    it), the configured penalty otherwise."""
    if status == Status.OK.value:
        return cfg.correct_reward
    if status == Status.COMPILED.value:
        return 0.0
    if status == FORMAT_ERROR:
        return cfg.penalty_format
    penalties = {
        Status.STATIC_REJECT.value: cfg.penalty_static_reject,
        Status.COMPILE_ERROR.value: cfg.penalty_compile_error,
        Status.RUNTIME_ERROR.value: cfg.penalty_runtime_error,
        Status.TIMEOUT.value: cfg.penalty_timeout,
        Status.WRONG_ANSWER.value: cfg.penalty_wrong_answer,
        Status.REJECTED_BEHAVIOUR.value: cfg.penalty_rejected_behaviour,
        # The machine could not run the evaluation: like internal_error, not the candidate's doing.
        Status.NO_GPU.value: cfg.penalty_internal_error,
        Status.INTERNAL_ERROR.value: cfg.penalty_internal_error,
    }
    if status not in penalties:
        raise ValueError(f"unknown status {status!r}: expected one of {', '.join(ALL_STATUSES)}")
    return penalties[status]


def status_term(statuses: Sequence[str], cfg: RewardConfig) -> float:
    """Mean status reward over shapes (ok: correct_reward, compiled: 0). A format error is one status,
    `format_error`, costing penalty_format. No statuses -> 0."""
    if not statuses:
        return 0.0
    return sum(status_penalty(s, cfg) for s in statuses) / len(statuses)


def spill_bytes(kernels: Iterable[KernelResources]) -> int:
    """Register spill traffic ptxas reports, stores plus loads, summed over kernels (bytes)."""
    return sum(k.spill_store_bytes + k.spill_load_bytes for k in kernels)


def ptxas_term(kernels: Sequence[KernelResources], cfg: RewardConfig) -> float:
    """Compile-only reward from ptxas -v figures:

        compiled_reward - spill_penalty_per_kb * spill_bytes / 1024 - register_penalty * [any registers > limit]

    floored at 0 (or at compiled_reward, if that is set below 0), so spills never push a candidate that compiles
    below a failing one (the status penalties are <= 0).
    """
    spill_kib = spill_bytes(kernels) / 1024.0
    over_limit = any(k.registers > cfg.register_limit for k in kernels)
    value = cfg.compiled_reward - cfg.spill_penalty_per_kb * spill_kib - (cfg.register_penalty if over_limit else 0.0)
    return max(min(0.0, cfg.compiled_reward), value)
