"""The reward: an EvalResult (from the sandbox pool) and a completion's length become one float for GRPO.

    config.RewardConfig      every knob, flat (TrlParser turns the fields into YAML keys and CLI flags)
    terms                    one pure function per term: speed, accuracy, length, status, ptxas
    rubric.score             EvalResult | None -> RewardBreakdown (total, per-term values, statuses, speedup)
    trl_adapter              make_reward_function(pool, cfg, extract) -> async reward function for GRPOTrainer

Importable without torch, transformers or trl.
"""

from cudal2.reward.config import BASELINES, TERMS, RewardConfig, SpeedForm
from cudal2.reward.rubric import RewardBreakdown, score, tolerance
from cudal2.reward.trl_adapter import make_reward_function

__all__ = ["BASELINES", "TERMS", "RewardBreakdown", "RewardConfig", "SpeedForm", "make_reward_function", "score",
           "tolerance"]
