"""Warm start of the tiny local policy.

A randomly initialised policy only ever emits format errors: every completion gets the same reward, GRPO's
group-relative advantages are all zero and nothing is learnt, so a smoke run would test nothing. A few supervised
steps on (prompt -> a compact correct kernel) pairs make the tiny policy emit code-shaped answers that sometimes
compile and sometimes do not: rewards vary and the GRPO update is real. Done once per tiny policy directory
(marker file), in seconds on a CPU.
"""

from __future__ import annotations

from pathlib import Path

# The answers the tiny policy is fit to: complete candidates, short enough for a CPU smoke run (~260 tokens with the
# tiny tokenizer), in a few variants so that sampling gives different kernels with different rewards: two block
# sizes (correct, unequally fast), one that accumulates in half precision (fails the fp32-accuracy check once K is
# large) and one that does not compile (an undeclared name). GRPO then has something to learn even on the GPU, where
# every correct naive kernel is equally slow, and on the CPU's compile-only reward, where the three others score
# alike: without the broken one, a tiny policy that had learnt its answers well got the same reward on all of them,
# so zero advantages and no update.
_KERNEL = """#include <cuda_fp16.h>
#include <cuda_runtime.h>
__global__ void k(const half* A, const half* B, half* C, int M, int N, int K) {
  int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
  if (m >= M || n >= N) return;
  {acc} s = 0.f;
  for (int i = 0; i < K; ++i) s += {a} * {b};
  C[(size_t)m * N + n] = __float2half_rn(s);
}
extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* w, size_t wb,
                            cudaStream_t stream) {
  k<<<dim3((N + {threads_m1}) / {threads}, M), {threads}, 0, stream>>>(A, B, C, M, N, K);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
"""
_A, _B = "A[(size_t)m * K + i]", "B[(size_t)n * K + i]"


def compact_kernel(threads: int = 128, half_accumulate: bool = False, compiles: bool = True) -> str:
    """The naive one-output-per-thread kernel with `threads` per block; fp32 (or half) accumulation; with
    compiles=False the loop adds into `sum`, which is never declared."""
    if half_accumulate:
        acc, a, b = "half", _A, _B
    else:
        acc, a, b = "float", f"__half2float({_A})", f"__half2float({_B})"
    source = (_KERNEL.replace("{acc}", acc).replace("{a}", a).replace("{b}", b)
              .replace("{threads_m1}", str(threads - 1)).replace("{threads}", str(threads)))
    return source if compiles else source.replace("i) s +=", "i) sum +=")


COMPACT_KERNEL = compact_kernel()  # the plain, correct one
VARIANTS = (compact_kernel(128), compact_kernel(256), compact_kernel(128, half_accumulate=True),
            compact_kernel(256, compiles=False))
MARKER = "cudal2_warm_started"
WARM_VERSION = "4"  # bump when the answers change: a policy warmed on other answers is warmed again
WARM_STEPS = 150 * len(VARIANTS)  # optimizer steps; fewer leave the tiny model mixing the answers up


def warm_answer(source: str = COMPACT_KERNEL) -> str:
    return f"```cuda\n{source}```"


def warm_start(model, tokenizer, prompts: list[list[dict]], steps: int = WARM_STEPS, lr: float = 5e-3) -> float:
    """Fit `model` to answer each chat prompt with each compact kernel variant in turn (loss on the answer tokens
    only), so that it samples among them. Prompts are tokenized exactly as TRL tokenizes them for generation.
    Returns the last loss (nats per token)."""
    import torch

    prompt_ids = [list(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True,
                                                     return_dict=True)["input_ids"]) for p in prompts]
    batches = []
    for variant in VARIANTS:
        answer_ids = tokenizer(warm_answer(variant) + (tokenizer.eos_token or ""), add_special_tokens=False)["input_ids"]
        for prompt in prompt_ids:
            ids = torch.tensor([prompt + answer_ids], device=model.device)
            labels = ids.clone()
            labels[0, : len(prompt)] = -100  # learn the answer, not the prompt
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


def ensure_warm(path: str | Path, prompts: list[list[dict]], steps: int = WARM_STEPS) -> Path:
    """Build the tiny policy at `path` if needed and warm-start it once (idempotent)."""
    from transformers import AutoModelForCausalLM

    from cudal2.policy.model import build_tiny_policy, load_tokenizer

    path = build_tiny_policy(path)
    marker = path / MARKER
    if marker.exists() and marker.read_text().startswith(f"v{WARM_VERSION} "):
        return path
    tokenizer = load_tokenizer(str(path), True)
    model = AutoModelForCausalLM.from_pretrained(path)
    loss = warm_start(model, tokenizer, prompts, steps)
    model.save_pretrained(path)
    marker.write_text(f"v{WARM_VERSION} warm-started for {steps} steps on {len(VARIANTS)} answers, final loss "
                      f"{loss:.4f}\n")
    return path
