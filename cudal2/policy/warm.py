"""Warm start of the tiny local policy.

A randomly initialised policy only ever emits format errors: every completion gets the same reward, GRPO's
group-relative advantages are all zero and nothing is learnt, so a smoke run would test nothing. A few supervised
steps on (prompt -> a compact correct kernel) pairs make the tiny policy emit code-shaped answers that sometimes
compile and sometimes do not: rewards vary and the GRPO update is real. Done once per tiny policy directory
(marker file), in seconds on a CPU.
"""

from __future__ import annotations

from pathlib import Path

# The answer the tiny policy is fit to: a complete, correct candidate, short enough for a CPU smoke run (~260 tokens
# with the tiny tokenizer).
COMPACT_KERNEL = """#include <cuda_fp16.h>
#include <cuda_runtime.h>
__global__ void k(const half* A, const half* B, half* C, int M, int N, int K) {
  int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
  if (m >= M || n >= N) return;
  float s = 0.f;
  for (int i = 0; i < K; ++i) s += __half2float(A[(size_t)m * K + i]) * __half2float(B[(size_t)n * K + i]);
  C[(size_t)m * N + n] = __float2half_rn(s);
}
extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* w, size_t wb,
                            cudaStream_t stream) {
  k<<<dim3((N + 127) / 128, M), 128, 0, stream>>>(A, B, C, M, N, K);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""
MARKER = "cudal2_warm_started"


def warm_answer() -> str:
    return f"```cuda\n{COMPACT_KERNEL}```"


def warm_start(model, tokenizer, prompts: list[list[dict]], steps: int = 200, lr: float = 5e-3) -> float:
    """Fit `model` to answer each chat prompt with the compact kernel (loss on the answer tokens only). Prompts are
    tokenized exactly as TRL tokenizes them for generation. Returns the last loss (nats per token)."""
    import torch

    answer_ids = tokenizer(warm_answer() + (tokenizer.eos_token or ""), add_special_tokens=False)["input_ids"]
    batches = []
    for p in prompts:
        prompt_ids = list(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True,
                                                        return_dict=True)["input_ids"])
        ids = torch.tensor([prompt_ids + answer_ids], device=model.device)
        labels = ids.clone()
        labels[0, : len(prompt_ids)] = -100  # learn the answer, not the prompt
        batches.append((ids, labels))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        ids, labels = batches[step % len(batches)]
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return float(loss.detach())


def ensure_warm(path: str | Path, prompts: list[list[dict]], steps: int = 200) -> Path:
    """Build the tiny policy at `path` if needed and warm-start it once (idempotent)."""
    from transformers import AutoModelForCausalLM

    from cudal2.policy.model import build_tiny_policy, load_tokenizer

    path = build_tiny_policy(path)
    if (path / MARKER).exists():
        return path
    tokenizer = load_tokenizer(str(path), True)
    model = AutoModelForCausalLM.from_pretrained(path)
    loss = warm_start(model, tokenizer, prompts, steps)
    model.save_pretrained(path)
    (path / MARKER).write_text(f"warm-started for {steps} steps, final loss {loss:.4f}\n")
    return path
