"""TRL's GRPOTrainer with each optimizer step's wall time split into generation, evaluation and update.

Per optimizer step (all gradient-accumulation micro-steps together), logged with TRL's own metrics, in seconds:

    time/generation_s    the policy producing completions (`_generate`; with multi-turn refinement this includes the
                         evaluations between turns, which the rollout awaits)
    time/evaluation_s    the reward: awaiting the sandbox pool (compile, verify, time) and scoring (`_calculate_rewards`)
    time/update_s        the rest of the step: log-probabilities, loss, backward, optimizer
    time/evaluation_share   evaluation_s / (generation_s + evaluation_s + update_s)

Generation and evaluation happen once per generation batch (every `steps_per_generation` micro-steps), so a step
that reuses buffered completions shows 0 for both. Importing this module imports trl.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from trl import GRPOTrainer


class TimedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that logs where each step's time goes (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._phase_s = {"generation": 0.0, "evaluation": 0.0}  # seconds accumulated within the current step
        self._step_wall_s = 0.0

    @contextmanager
    def _timed(self, phase: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._phase_s[phase] += time.perf_counter() - t0

    def _generate(self, prompts):
        with self._timed("generation"):
            return super()._generate(prompts)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        with self._timed("evaluation"):
            return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def training_step(self, model, inputs, num_items_in_batch):
        t0 = time.perf_counter()
        out = super().training_step(model, inputs, num_items_in_batch)  # advances self._step
        self._step_wall_s += time.perf_counter() - t0
        if self._step % self.current_gradient_accumulation_steps == 0:
            self._log_split()
        return out

    def _log_split(self) -> None:
        gen, ev = self._phase_s["generation"], self._phase_s["evaluation"]
        total = self._step_wall_s
        metrics = self._metrics["train"]
        metrics["time/generation_s"].append(gen)
        metrics["time/evaluation_s"].append(ev)
        metrics["time/update_s"].append(max(total - gen - ev, 0.0))
        metrics["time/evaluation_share"].append(ev / total if total > 0 else 0.0)
        self._phase_s = {"generation": 0.0, "evaluation": 0.0}
        self._step_wall_s = 0.0
