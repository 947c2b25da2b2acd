"""Periodic evaluation on held-out shapes during training: best-of-n speedup and correctness rate.

Every `every` optimizer steps, the current policy samples `n` completions for each held-out shape; all go through
the pool (and so into the store). Logged through the trainer:
    heldout/correct_rate   fraction of samples that are ok (or compiled, in compile-only runs)
    heldout/best_speedup   geometric mean over shapes of the best sample's speedup vs cuBLAS (shapes with an ok
                           sample only; absent when none)
"""

from __future__ import annotations

import math

from transformers import TrainerCallback

from cudal2.policy.extract import extract_source
from cudal2.policy.sample import generate


class HeldOutEval(TrainerCallback):
    def __init__(self, tasks, prompts: list[list[dict]], pool, n: int, every: int, temperature: float,
                 max_new_tokens: int):
        self.tasks, self.prompts, self.pool = tasks, prompts, pool
        self.n, self.every, self.temperature, self.max_new_tokens = n, every, temperature, max_new_tokens
        self.trainer = None  # set after the trainer exists (it logs the metrics)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if self.every <= 0 or state.global_step % self.every or self.trainer is None:
            return
        metrics = self.evaluate(model, processing_class)
        self.trainer.log(metrics)

    def evaluate(self, model, tokenizer) -> dict[str, float]:
        was_training = model.training
        model.eval()
        correct = total = 0
        best_logs = []
        for task, prompt in zip(self.tasks, self.prompts, strict=True):
            completions = generate(model, tokenizer, [prompt] * self.n, self.temperature, self.max_new_tokens)
            sources = [e.source for e in map(extract_source, completions) if e.source]
            results = [f.result() for f in [self.pool.submit(s, [task], "heldout") for s in sources]]
            total += self.n
            shapes = [r.shapes[0] for r in results]
            correct += sum(s.status.value in ("ok", "compiled") for s in shapes)
            speedups = [s.speedup("cublas") for s in shapes if s.status.value == "ok" and s.speedup("cublas")]
            if speedups:
                best_logs.append(math.log(max(speedups)))
        if was_training:
            model.train()
        metrics = {"heldout/correct_rate": correct / total if total else 0.0}
        if best_logs:
            metrics["heldout/best_speedup"] = math.exp(sum(best_logs) / len(best_logs))
        return metrics
