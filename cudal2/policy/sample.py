"""`cudal2 sample`: draw kernels for one shape from a policy, evaluate them all through the pool, keep the best.

prompt (contract, shape, nearest best kernels) ─► model.generate, n samples in batches
  ─► last ```cuda block ─► pool (every result stored) ─► optional refinement turns: the failure reason or
     measured speedup is fed back and the model answers again ─► best by speedup vs cuBLAS, written to a file
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from cudal2.policy.config import PolicyConfig
from cudal2.policy.extract import extract_source
from cudal2.policy.prompt import build_messages, render_prompt, retrieve_examples
from cudal2.sandbox.types import EvalResult, Task


@dataclass(frozen=True)
class Sample:
    completion: str
    source: str | None
    result: EvalResult | None  # None: no usable code in the completion
    reason: str
    turn: int

    @property
    def status(self) -> str:
        return self.result.shapes[0].status.value if self.result else "format_error"

    @property
    def speedup(self) -> float | None:
        return self.result.shapes[0].speedup("cublas") if self.result else None


def _rank(s: Sample) -> tuple:
    """Best first: ok with the highest speedup, then compiled (compile-only), then the rest."""
    return ({"ok": 0, "compiled": 1}.get(s.status, 2), -(s.speedup or 0.0))


def feedback(result: EvalResult | None, reason: str) -> str:
    """What the model is told after an attempt (multi-turn refinement, in sampling and in training): the failure
    reason, or the measured speedup, with the ptxas figures."""
    if result is None:
        return f"Your answer had no usable code: {reason}. Answer with one ```cuda block holding the whole file."
    shape = result.shapes[0]
    kernels = result.compile.kernels if result.compile else ()
    ptxas = "; ".join(
        f"{k.name[:60]}: {k.registers} regs, {k.smem_bytes} B smem, {k.spill_store_bytes + k.spill_load_bytes} B spills"
        for k in kernels
    )
    if shape.status.value == "ok":
        speed = f"{shape.speedup('cublas'):.3f}x" if shape.speedup("cublas") else "not measured"
        return (
            f"Correct. Speedup vs cuBLAS: {speed}. ptxas: {ptxas or 'n/a'}. "
            "Make it faster; answer with the complete file."
        )
    return f"Evaluation: {shape.status.value}: {shape.reason}. ptxas: {ptxas or 'n/a'}. Fix it; answer with the complete file."


def generate(model, tokenizer, messages_list: list[list[dict]], temperature: float, max_new_tokens: int) -> list[str]:
    """One sampled completion per chat prompt (left-padded batch), tokenized as TRL does for generation."""
    import torch

    tokenizer.padding_side = "left"
    if tokenizer.chat_template:
        enc = tokenizer.apply_chat_template(messages_list, add_generation_prompt=True, tokenize=True, padding=True,
                                            return_dict=True, return_tensors="pt")
    else:
        enc = tokenizer([render_prompt(m, tokenizer) for m in messages_list], return_tensors="pt", padding=True)
    enc = enc.to(model.device)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, temperature=temperature, max_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id)
    return tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)


class Sampler:
    def __init__(self, cfg: PolicyConfig, pool, temperature: float = 0.8, batch: int = 8):
        from cudal2.policy.model import load_policy

        self.cfg, self.pool, self.temperature, self.batch = cfg, pool, temperature, batch
        self.model, self.tokenizer = load_policy(cfg, apply_lora=False)

    def generate(self, messages_list: list[list[dict]]) -> list[str]:
        return generate(self.model, self.tokenizer, messages_list, self.temperature, self.cfg.max_completion_tokens)

    def _evaluate(self, completions: list[str], task: Task, turn: int, progress) -> list[Sample]:
        extracted = [extract_source(c) for c in completions]
        futures = [self.pool.submit(e.source, [task], "sample") if e.source else None for e in extracted]
        samples = []
        for c, e, f in zip(completions, extracted, futures, strict=True):
            samples.append(Sample(c, e.source, f.result() if f else None, e.reason, turn))
            progress(samples[-1])
        return samples

    def run(self, task: Task, n: int, turns: int, store, gpu_label: str, progress=lambda s: None) -> list[Sample]:
        examples = retrieve_examples(store, task, gpu_label, self.cfg.n_examples)
        base = build_messages(task, self.cfg.gpu_name, examples, self.tokenizer, self.cfg.max_prompt_tokens)
        samples: list[Sample] = []
        for start in range(0, n, self.batch):
            k = min(self.batch, n - start)
            samples += self._evaluate(self.generate([base] * k), task, 1, progress)
        last = samples
        for turn in range(2, turns + 1):  # refine each attempt of the previous turn once
            convs = [
                base + [{"role": "assistant", "content": s.completion}, {"role": "user", "content": feedback(s.result, s.reason)}]
                for s in last
            ]
            last = []
            for start in range(0, len(convs), self.batch):
                last += self._evaluate(self.generate(convs[start : start + self.batch]), task, turn, progress)
            samples += last
        return sorted(samples, key=_rank)


def report(samples: list[Sample]) -> str:
    counts = Counter(s.status for s in samples)
    best = samples[0] if samples else None
    lines = [f"{len(samples)} samples: " + ", ".join(f"{k} {v}" for k, v in counts.most_common())]
    if best is not None:
        sp = f", {best.speedup:.3f}x vs cuBLAS" if best.speedup else ""
        lines.append(
            f"best: {best.status}{sp} (turn {best.turn}): {best.result.shapes[0].reason if best.result else best.reason}"
        )
    return "\n".join(lines)


def progress_printer(total: int):
    seen = Counter()

    def show(s: Sample) -> None:
        seen[s.status] += 1
        done = sum(seen.values())
        print(
            f"\r[{done}/{total}] " + " ".join(f"{k} {v}" for k, v in seen.most_common()),
            end="",
            file=sys.stderr,
            flush=True,
        )
        if done == total:
            print(file=sys.stderr)

    return show


def write_best(samples: list[Sample], path: Path) -> bool:
    best = next((s for s in samples if s.source), None)
    if best is None:
        return False
    path.write_text(best.source)
    return True
