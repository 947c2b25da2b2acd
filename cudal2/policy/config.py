"""Configuration of the policy LLM: which model, how it is loaded, LoRA, and the prompt/completion budgets.

Flat fields of simple types, each with a `help` string, so TRL's `TrlParser` (an `HfArgumentParser`) turns them
into YAML keys and `--flag`s as they stand. Validation happens in `__post_init__`: a bad value raises a
`ValueError` with a one-line message naming the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TINY_LOCAL = "tiny-local"  # special `model` value: the tiny random policy built locally (cudal2.policy.model)
DTYPES = ("float32", "bfloat16", "float16", "auto")
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
# The fixed part of the prompt (contract, rules, task) needs about 1k tokens with common tokenizers.
MIN_PROMPT_TOKENS = 256

_DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


@dataclass(frozen=True)
class PolicyConfig:
    """Policy model, loading and prompt settings (see each field's help)."""

    model: str = field(
        default=TINY_LOCAL,
        metadata={"help": "Hub name or local directory of a causal LM; 'tiny-local' = tiny random policy for tests."},
    )
    tiny_path: str = field(
        default="runs/tiny-policy",
        metadata={"help": "Directory where the tiny random policy is built (reused if present)."},
    )
    dtype: str = field(
        default="float32",
        metadata={"help": "Weight dtype: float32, bfloat16, float16 or auto (the checkpoint's own)."},
    )
    device: str = field(
        default="auto",
        metadata={"help": "auto (cuda:LOCAL_RANK if CUDA is available, else cpu), cpu, cuda, cuda:N or mps."},
    )
    lora: bool = field(default=False, metadata={"help": "Train LoRA adapters instead of all weights."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank (> 0)."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling alpha (> 0)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout probability, in [0, 1)."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: list(DEFAULT_LORA_TARGETS),
        metadata={"help": "Module names LoRA adapts (a list, or one comma-separated string)."},
    )
    max_prompt_tokens: int = field(
        default=3072,
        metadata={"help": "Prompt budget in tokens; retrieved examples are dropped or truncated to fit, never rules."},
    )
    max_completion_tokens: int = field(
        default=4096, metadata={"help": "Most tokens the policy may generate per completion."}
    )
    n_examples: int = field(
        default=2, metadata={"help": "Retrieved kernels (best known, nearest shapes) shown in the prompt (>= 0)."}
    )
    turns: int = field(
        default=1,
        metadata={"help": "Answers per prompt in training: after each, the evaluation's feedback is a user turn and the "
                          "policy answers again (TRL rollout_func; feedback tokens are masked out of the loss)."},
    )
    gpu_name: str = field(
        default="NVIDIA H200", metadata={"help": "Target GPU named in the prompt, e.g. 'NVIDIA H200'."}
    )

    def __post_init__(self) -> None:
        targets = self.lora_target_modules
        if isinstance(targets, str):  # "q_proj,k_proj" from a CLI flag or YAML scalar
            targets = [t.strip() for t in targets.split(",") if t.strip()]
        elif isinstance(targets, (list, tuple)):
            targets = list(targets)
        object.__setattr__(self, "lora_target_modules", targets)

        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        check(isinstance(self.model, str) and bool(self.model.strip()), "model must be a non-empty name or path")
        check(isinstance(self.tiny_path, str) and bool(self.tiny_path.strip()), "tiny_path must be a non-empty path")
        check(self.dtype in DTYPES, f"dtype={self.dtype!r} must be one of {', '.join(DTYPES)}")
        check(
            isinstance(self.device, str) and bool(_DEVICE_RE.match(self.device)),
            f"device={self.device!r} must be auto, cpu, mps, cuda or cuda:N",
        )
        check(isinstance(self.lora, bool), f"lora={self.lora!r} must be true or false")
        check(_is_int(self.lora_r) and self.lora_r > 0, f"lora_r={self.lora_r!r} must be an integer > 0")
        check(
            _is_int(self.lora_alpha) and self.lora_alpha > 0, f"lora_alpha={self.lora_alpha!r} must be an integer > 0"
        )
        check(
            isinstance(self.lora_dropout, (int, float))
            and not isinstance(self.lora_dropout, bool)
            and 0.0 <= self.lora_dropout < 1.0,
            f"lora_dropout={self.lora_dropout!r} must be in [0, 1)",
        )
        check(
            isinstance(targets, list) and bool(targets) and all(isinstance(t, str) and t.strip() for t in targets),
            f"lora_target_modules={self.lora_target_modules!r} must be a non-empty list of module names",
        )
        check(
            _is_int(self.max_prompt_tokens) and self.max_prompt_tokens >= MIN_PROMPT_TOKENS,
            f"max_prompt_tokens={self.max_prompt_tokens!r} must be an integer >= {MIN_PROMPT_TOKENS}",
        )
        check(
            _is_int(self.max_completion_tokens) and self.max_completion_tokens > 0,
            f"max_completion_tokens={self.max_completion_tokens!r} must be an integer > 0",
        )
        check(_is_int(self.n_examples) and self.n_examples >= 0, f"n_examples={self.n_examples!r} must be >= 0")
        check(_is_int(self.turns) and self.turns >= 1, f"turns={self.turns!r} must be an integer >= 1")
        check(isinstance(self.gpu_name, str) and bool(self.gpu_name.strip()), "gpu_name must be a non-empty string")

    @property
    def is_tiny(self) -> bool:
        return self.model == TINY_LOCAL


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
