"""Multi-turn refinement in training, through TRL's `rollout_func`.

    turn 1: the policy answers the prompt
    ─► the pool evaluates the last ```cuda block ─► feedback (failure reason, or speedup, and ptxas figures) as a
       user turn ─► turn 2: the policy answers again ... (`turns` answers in all)

Returned to TRL as one completion per prompt: the model's tokens of every turn with the feedback tokens between them.
`env_mask` is 1 on the model's tokens and 0 on feedback and chat-template tokens, so feedback stays out of the loss;
`logprobs` are the sampling log-probabilities (0 where masked). The reward then scores the last attempt (the reward
extracts the last ```cuda block of the whole completion).
"""

from __future__ import annotations

from cudal2.policy.extract import extract_source
from cudal2.policy.sample import feedback
from cudal2.sandbox.types import Acc, Task


class TemplateMismatch(ValueError):
    """The chat template does not render an assistant message verbatim after the generation prompt."""


def feedback_ids(tokenizer, conversation: list[dict], answer: str, message: str) -> list[int]:
    """Token ids of what follows the model's answer: end of the assistant turn, the feedback user turn, and the
    next generation prompt, as the chat template renders them."""
    before = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    after = tokenizer.apply_chat_template(
        conversation + [{"role": "assistant", "content": answer}, {"role": "user", "content": message}],
        add_generation_prompt=True, tokenize=False)
    if not after.startswith(before + answer):
        raise TemplateMismatch("the chat template does not render the assistant's answer verbatim")
    return tokenizer(after[len(before) + len(answer):], add_special_tokens=False)["input_ids"]


def _sample(model, tokenizer, sequences: list[list[int]], temperature: float, max_new_tokens: int):
    """Sample one continuation per token sequence; returns (token ids, log-probs) per sequence, up to EOS."""
    import torch

    pad = tokenizer.pad_token_id
    width = max(len(s) for s in sequences)
    ids = torch.tensor([[pad] * (width - len(s)) + s for s in sequences], device=model.device)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences], device=model.device)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature,
                             max_new_tokens=max_new_tokens, pad_token_id=pad, output_scores=True,
                             return_dict_in_generate=True)
    new = out.sequences[:, width:]
    logps = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in out.scores], dim=1)  # [batch, steps, vocab]
    chosen = logps.gather(-1, new.unsqueeze(-1)).squeeze(-1)
    result = []
    for row_ids, row_lp in zip(new.tolist(), chosen.tolist(), strict=True):
        end = next((i + 1 for i, t in enumerate(row_ids) if t == tokenizer.eos_token_id), len(row_ids))
        result.append((row_ids[:end], row_lp[:end]))
    return result


def make_rollout(pool, turns: int, temperature: float, max_new_tokens: int):
    """A TRL rollout_func doing `turns` answers per prompt with evaluation feedback in between."""

    def rollout(prompts: list[list[dict]], trainer) -> dict:
        model = trainer.accelerator.unwrap_model(trainer.model)
        tokenizer = trainer.processing_class
        prompt_ids = [list(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True,
                                                         return_dict=True)["input_ids"]) for p in prompts]
        convs = [list(p) for p in prompts]
        completion = [[] for _ in prompts]
        logprobs = [[] for _ in prompts]
        env_mask = [[] for _ in prompts]
        for turn in range(turns):
            contexts = [p + c for p, c in zip(prompt_ids, completion, strict=True)]
            for i, (ids, lps) in enumerate(_sample(model, tokenizer, contexts, temperature, max_new_tokens)):
                completion[i] += ids
                logprobs[i] += lps
                env_mask[i] += [1] * len(ids)
                answer = tokenizer.decode(ids, skip_special_tokens=True)
                if turn + 1 < turns:
                    message = _evaluate_for_feedback(pool, answer, prompts[i])
                    fb = feedback_ids(tokenizer, convs[i], answer, message)
                    convs[i] += [{"role": "assistant", "content": answer}, {"role": "user", "content": message}]
                    completion[i] += fb
                    logprobs[i] += [0.0] * len(fb)
                    env_mask[i] += [0] * len(fb)
        return {"prompt_ids": prompt_ids, "completion_ids": completion, "logprobs": logprobs, "env_mask": env_mask}

    return rollout


def _task_of(prompt: list[dict]) -> Task:
    """The task as cudal2.policy.prompt states it in the user message ("Task: M=.., N=.., K=.." and "(fp16 task)");
    TRL hands rollout_func the prompts only, not the dataset's shape columns."""
    import re

    text = prompt[-1]["content"]
    m = re.search(r"Task: M=(\d+), N=(\d+), K=(\d+)", text)
    acc = Acc.FP16 if "(fp16 task)" in text else Acc.FP32
    if not m:
        raise ValueError("prompt does not state M=, N=, K=")
    return Task(int(m.group(1)), int(m.group(2)), int(m.group(3)), acc)


def _evaluate_for_feedback(pool, answer: str, prompt: list[dict]) -> str:
    ext = extract_source(answer)
    if not ext.source:
        return feedback(None, ext.reason)
    return feedback(pool.submit(ext.source, [_task_of(prompt)], "trainer").result(), ext.reason)
