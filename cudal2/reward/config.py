"""RewardConfig: every knob of the reward, flat and simply typed.

The fields become YAML keys and CLI flags through TRL's TrlParser, so they are plain float / int / str / bool and
one `drop: list[str]`; no nested dataclasses. The comment after each field is its help text. Rewards and penalties
are in reward units (dimensionless; the speed term of a 2x kernel is log(2) = 0.69 under the default form).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class SpeedForm(str, Enum):
    """How the (geometric-mean) speedup G over the baseline becomes the speed term."""

    LOG = "log"  # log(G): 0 at parity, symmetric in "twice as fast" / "twice as slow"
    MINUS_ONE = "minus_one"  # G - 1: 0 at parity, linear in speedup
    CLIPPED = "clipped"  # min(G, speed_clip) - 1, each shape's speedup clipped before averaging


# Timings the evaluator records beside the candidate's (keys of ShapeResult.timings).
BASELINES = ("cublas", "cublaslt_heuristic", "cublaslt_autotuned")

# Names of the reward terms; RewardConfig.drop takes a subset, and RewardBreakdown.terms is keyed by them.
TERMS = ("speed", "accuracy", "length", "status", "ptxas")


def _help(text: str) -> dict[str, str]:
    """Field metadata HfArgumentParser / TrlParser shows as the flag's help."""
    return {"help": text}


@dataclass(frozen=True)
class RewardConfig:
    """The reward's settings. Each field's help (units in brackets) is what --help prints."""

    speed_form: str = field(default="log", metadata=_help(
        "speed term shape: log (log speedup), minus_one (speedup - 1), clipped (min(speedup, clip) - 1)"))
    baseline: str = field(default="cublas", metadata=_help(
        "timing the speedup is measured against: cublas, cublaslt_heuristic or cublaslt_autotuned"))
    speed_weight: float = field(default=1.0, metadata=_help(
        "weight of the speed term"))
    speed_clip: float = field(default=8.0, metadata=_help(
        "largest per-shape speedup credited under speed_form=clipped [x baseline]"))
    accuracy_weight: float = field(default=0.1, metadata=_help(
        "penalty per unit of max_rel_err / tolerance on ok results (the ratio saturates at 1)"))
    length_weight: float = field(default=0.0, metadata=_help(
        "penalty per length_scale_tokens above length_free_tokens; off by default "
        "(Kevin-32B: length penalties can cause response collapse)"))
    length_free_tokens: int = field(default=2048, metadata=_help(
        "completions up to this long are not penalised [tokens]"))
    length_scale_tokens: int = field(default=4096, metadata=_help(
        "length_weight is charged once per this many tokens above the free allowance [tokens]"))
    penalty_format: float = field(default=-1.0, metadata=_help(
        "reward when the completion has no usable code (no code block / no entry point)"))
    penalty_static_reject: float = field(default=-1.0, metadata=_help(
        "reward per shape when a source or link rule forbids the candidate"))
    penalty_compile_error: float = field(default=-0.8, metadata=_help(
        "reward per shape when nvcc fails"))
    penalty_runtime_error: float = field(default=-0.6, metadata=_help(
        "reward per shape for a crash, CUDA error or missing report"))
    penalty_timeout: float = field(default=-0.6, metadata=_help(
        "reward per shape when compile or run exceeded its wall-clock limit"))
    penalty_wrong_answer: float = field(default=-0.5, metadata=_help(
        "reward per shape when the result is outside the tolerance"))
    penalty_rejected_behaviour: float = field(default=-1.0, metadata=_help(
        "reward per shape for right numbers with forbidden behaviour"))
    penalty_internal_error: float = field(default=0.0, metadata=_help(
        "reward per shape when the evaluator failed (not the policy's fault; counted in status/internal_error)"))
    correct_reward: float = field(default=0.5, metadata=_help(
        "reward per shape that is correct (status ok), so that a correct but slow kernel outscores every failure"))
    speed_floor: float = field(default=-0.8, metadata=_help(
        "lower bound of the speed term per unit weight: with correct_reward, a correct kernel however slow "
        "(-0.8 + 0.5 - accuracy <= 0.1 = -0.4) stays above a wrong answer (-0.5)"))
    compiled_reward: float = field(default=0.5, metadata=_help(
        "compile-only mode (no GPU, status compiled): reward for a candidate that compiles"))
    spill_penalty_per_kb: float = field(default=0.1, metadata=_help(
        "compile-only: penalty per KiB of register spill (stores + loads, all kernels) [1/KiB]"))
    register_limit: int = field(default=255, metadata=_help(
        "compile-only: a kernel using more registers per thread than this is penalised [registers]"))
    register_penalty: float = field(default=0.25, metadata=_help(
        "compile-only: penalty when any kernel exceeds register_limit"))
    drop: list[str] = field(default_factory=list, metadata=_help(
        "term names switched off for ablations: speed, accuracy, length, status, ptxas"))

    def __post_init__(self) -> None:
        if self.speed_form not in {f.value for f in SpeedForm}:
            raise ValueError(f"speed_form={self.speed_form!r}: expected one of {', '.join(f.value for f in SpeedForm)}")
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline={self.baseline!r}: expected one of {', '.join(BASELINES)}")
        unknown = [t for t in self.drop if t not in TERMS]
        if unknown:
            raise ValueError(f"drop={unknown!r}: unknown term(s); terms are {', '.join(TERMS)}")
        if self.length_scale_tokens <= 0:
            raise ValueError(f"length_scale_tokens={self.length_scale_tokens!r}: must be a positive number of tokens")
        if self.speed_clip <= 0:
            raise ValueError(f"speed_clip={self.speed_clip!r}: must be a positive speedup")

    @property
    def form(self) -> SpeedForm:
        return SpeedForm(self.speed_form)

    def active(self, term: str) -> bool:
        """Whether `term` counts toward the total (not dropped)."""
        return term not in self.drop
