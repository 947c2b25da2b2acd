"""The policy's prompt: the candidate contract and its rules, the task, and retrieved reference kernels.

`build_messages` returns chat messages (system: role, contract, every rule, output format; user: target GPU,
shape, accuracy requirement, reference kernels with their measured speedups vs cuBLAS, the request). The
reference kernels come from the result store (`retrieve_examples`): the best known kernel on the target shape
and on the nearest other shapes, with their speedups so the policy can contrast faster and slower ones (as in
CUDA-L1's contrastive prompting); on an empty store, the seed kernel `kernels/seed/mma_multistage.cu`.

Budget: the rendered prompt must fit `max_prompt_tokens` (counted with the policy's tokenizer). Examples are
shortened (header comment first, then lines from the middle) or dropped, farthest first; the rules and the task are
never cut (a budget too small for them is a ValueError).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cudal2.sandbox.store import ResultStore, log2_distance
from cudal2.sandbox.types import Acc, ShapeResult, Task

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
SEED_KERNEL = REPO_ROOT / "kernels" / "seed" / "mma_multistage.cu"
BASELINE = "cublas"  # speedups in the prompt are over cuBLAS (the path torch.matmul takes)
TOL_FP32 = 2.5e-4  # at K=1024, scaled by sqrt(K/1024); as in cudal2.sandbox.evaluator.EvalOptions
TOL_FP16 = 5e-3
MIN_EXAMPLE_LINES = 24  # a reference kernel shorter than this after truncation is dropped instead

SYSTEM_INTRO = (
    "You are an expert CUDA performance engineer. You write one self-contained CUDA C++ file implementing a "
    "half-precision GEMM (HGEMM). A strict evaluator checks it statically, compiles it with nvcc (-O3 -std=c++17), "
    "runs it in a sandbox, verifies the result on random inputs and times it with CUDA events against cuBLAS. "
    "Your goal: correct first, then as fast as possible relative to cuBLAS on the target GPU and shape."
)

SIGNATURE = """\
// C[M,N] = A[M,K] * B[N,K]^T ("TN", torch.nn.functional.linear's layout); all row-major, half in memory.
extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K,
                            void* workspace, size_t workspace_bytes, cudaStream_t stream);
// optional: scratch bytes needed for this shape (default 0); the evaluator allocates it, timed calls reuse it.
extern "C" size_t cudal2_workspace_bytes(int M, int N, int K);"""

# What the contract forbids and allows (README.md, "The candidate contract"). Never shortened for the budget.
RULES: tuple[str, ...] = (
    "One self-contained CUDA C++ file; it may include CUDA headers and the pinned CUTLASS/CuTe headers, nothing "
    'else. Define `cudal2_hgemm` with exactly the signature above (extern "C"); return 0 on success, non-zero '
    "for a shape you do not support.",
    "All device work goes on `stream`: no other stream (no created stream, no legacy default stream "
    "`<<<grid, block>>>` without the stream argument, no per-thread default stream), no host threads or "
    "callbacks, no work left running after the call returns.",
    "No device memory allocation, no synchronisation (device, stream or event), no CUDA graph or stream-capture "
    "calls, no L2 persistence (access-policy windows, persisting-L2 limits). Padding is done inside the call, "
    "on `stream`.",
    "The workspace's contents are undefined on entry; initialise what you read. Do not write outside C and the "
    "workspace; never write into A or B.",
    "No vendor GEMM libraries (cuBLAS, cuBLASLt, cuDNN), no `dlopen`/`dlsym`, no file, socket or environment "
    "access, no `/proc`, no clocks, no `fork`/`exec`/`system`, no `exit`/`abort`, no raw syscalls.",
    "Allowed runtime calls, and only these: kernel launches (on `stream`), `cudaFuncSetAttribute`, "
    "`cudaGetLastError`, `cudaGetDevice`, `cudaDeviceGetAttribute`, `cudaOccupancy*`, `cudaMemsetAsync` on "
    "`stream`, and `cuTensorMapEncodeTiled` for TMA descriptors. No copies in any form (no cudaMemcpy*): pad "
    "with a kernel.",
    "Accuracy: for fp32 tasks (the default) fp32-accumulation accuracy: the relative error against the fp32 "
    "reference rounded to half must stay under 2.5e-4 x sqrt(K/1024). fp16 tasks may be no worse than twice "
    "cuBLAS's fp16-accumulating GEMM on the same inputs.",
    "A candidate that breaks any rule, returns wrong numbers or crashes is rejected, however fast it is.",
)

OUTPUT_FORMAT = (
    'Answer with one ```cuda block containing the complete file (includes, kernels and the extern "C" entry '
    "points). Only the last ```cuda block of your answer is evaluated; keep any explanation short and outside it."
)

_HOPPER_RE = re.compile(r"\bG?H(100|200|800|20)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Example:
    """A reference kernel shown in the prompt."""

    source: str
    mnk: str  # the shape it was measured on, e.g. "4096_4096_2048" ("" for the unmeasured seed)
    speedup: float | None  # cuBLAS median time / its median time on `mnk` (>1: faster than cuBLAS); None: unknown
    note: str  # one line: where it comes from and how it compares


# -- retrieval ------------------------------------------------------------------------------------------------


def _speedup_note(speedup: float | None) -> str:
    if speedup is None:
        return "speedup vs cuBLAS unknown"
    if speedup >= 1.0:
        return f"{speedup:.2f}x cuBLAS: faster than cuBLAS"
    return f"{speedup:.2f}x cuBLAS: slower than cuBLAS ({1 / speedup:.1f}x its time)"


def seed_example(seed_path: Path = SEED_KERNEL) -> Example | None:
    """The seed kernel as an example (speedup unknown), or None when the file is missing."""
    try:
        source = Path(seed_path).read_text()
    except OSError:
        log.warning("seed kernel %s not readable; the prompt will carry no reference kernel", seed_path)
        return None
    note = f"seed kernel {Path(seed_path).name} (correct; its speed on this GPU is not measured here)"
    return Example(source=source, mnk="", speedup=None, note=note)


def retrieve_examples(
    store: ResultStore | None, task: Task, gpu: str, k: int, *, seed_path: Path = SEED_KERNEL
) -> list[Example]:
    """Up to `k` reference kernels for `task` on `gpu` (the store's gpu label, e.g. "NVIDIA H200 (sm_90a)").

    The best known kernel on the task's own shape first (if any), then the best kernel on each nearest other shape
    (log2 distance over M, N, K; same acc), nearest first, each source at most once; every one with its measured
    speedup over cuBLAS. When the store has none (or is None), the seed kernel with speedup unknown.
    """
    if k <= 0:
        return []
    found: list[tuple[str, ShapeResult]] = []
    if store is not None:
        found = store.best(task, gpu, baseline=BASELINE, limit=1)
        found += store.nearest_best(task, gpu, k=3 * k, baseline=BASELINE)  # extra: some may repeat a source
    examples: list[Example] = []
    seen: set[str] = set()
    for source_hash, result in found:
        if len(examples) >= k:
            break
        if source_hash in seen:
            continue
        source = store.get_source(source_hash) if store is not None else None
        if not source:
            continue
        seen.add(source_hash)
        speedup = result.speedup(BASELINE)
        t = result.task
        where = "the target shape" if t == task else f"{t.mnk} (log2 distance {log2_distance(task, t):.1f})"
        note = f"best known kernel on {where}: {_speedup_note(speedup)}"
        examples.append(Example(source=source, mnk=t.mnk, speedup=speedup, note=note))
    if not examples:
        seed = seed_example(seed_path)
        return [seed] if seed is not None else []
    return examples


# -- prompt text ----------------------------------------------------------------------------------------------


def accuracy_requirement(task: Task) -> str:
    """The accuracy rule for this task, with its numeric bound at the task's K."""
    scale = math.sqrt(task.k / 1024)
    if task.acc is Acc.FP16:
        return (
            f"Accuracy (fp16 task): fp16 accumulation is allowed; the relative error against the fp32 reference "
            f"rounded to half may be no worse than twice cuBLAS's fp16-accumulating GEMM on the same inputs "
            f"(and up to 5e-3 x sqrt(K/1024) = {TOL_FP16 * scale:.3g} at K={task.k} is always accepted)."
        )
    return (
        f"Accuracy (fp32 task): fp32-accumulation accuracy is required: the relative error against the fp32 "
        f"reference rounded to half must stay under 2.5e-4 x sqrt(K/1024) = {TOL_FP32 * scale:.3g} at K={task.k}. "
        "Accumulate in fp32 (fp16 accumulators generally fail this bound)."
    )


def gpu_line(gpu_name: str) -> str:
    if _HOPPER_RE.search(gpu_name):
        return (
            f"Target GPU: {gpu_name} (Hopper, compiled for sm_90a: wgmma, TMA and thread-block clusters are available)."
        )
    return f"Target GPU: {gpu_name}."


def system_message() -> str:
    rules = "\n".join(f"- {r}" for r in RULES)
    return (
        f"{SYSTEM_INTRO}\n\n## The contract\n\n```cuda\n{SIGNATURE}\n```\n\n"
        f"## Rules (forbidden and allowed)\n\n{rules}\n\n## Output format\n\n{OUTPUT_FORMAT}"
    )


def _task_text(task: Task, gpu_name: str) -> str:
    return (
        f"{gpu_line(gpu_name)}\n"
        f"Task: M={task.m}, N={task.n}, K={task.k} (shape {task.mnk}), C[M,N] = A[M,K] * B[N,K]^T, half in memory, "
        f"{task.acc.value} accumulation. Your file is evaluated on exactly this shape; specialising for it is allowed.\n"
        f"{accuracy_requirement(task)}"
    )


def _example_text(i: int, ex: Example, source: str) -> str:
    return f"### Example {i}: {ex.note}\n\n```cuda\n{source.rstrip()}\n```"


def _contrast(examples: list[Example]) -> str:
    """One line saying which reference kernel is faster (relative to cuBLAS), when at least two were measured."""
    measured = [(ex.speedup, i) for i, ex in enumerate(examples, 1) if ex.speedup is not None]
    if len(measured) < 2:
        return ""
    (hi, i_hi), (lo, i_lo) = max(measured), min(measured)
    if i_hi == i_lo or hi == lo:
        return "The measured examples are equally fast relative to cuBLAS."
    return (
        f"Example {i_hi} is the fastest relative to cuBLAS ({hi:.2f}x) and Example {i_lo} the slowest ({lo:.2f}x): "
        "work out what makes the faster one faster and go beyond it."
    )


def _user_message(task: Task, gpu_name: str, shown: list[tuple[Example, str]]) -> str:
    parts = [_task_text(task, gpu_name)]
    if shown:
        parts.append("## Reference kernels (correct under this contract; speedup = cuBLAS time / kernel time)")
        parts += [_example_text(i, ex, src) for i, (ex, src) in enumerate(shown, 1)]
        contrast = _contrast([ex for ex, _ in shown])
        if contrast:
            parts.append(contrast)
    goal = "a kernel faster than the references" if shown else "a fast, correct kernel"
    parts.append(f"Write {goal} for M={task.m}, N={task.n}, K={task.k}. {OUTPUT_FORMAT}")
    return "\n\n".join(parts)


def _messages(task: Task, gpu_name: str, shown: list[tuple[Example, str]]) -> list[dict]:
    return [
        {"role": "system", "content": system_message()},
        {"role": "user", "content": _user_message(task, gpu_name, shown)},
    ]


# -- token budget ---------------------------------------------------------------------------------------------


def count_tokens(text: str, tokenizer: Any) -> int:
    """Tokens in `text` under `tokenizer` (no special tokens added)."""
    return len(tokenizer.encode(text, add_special_tokens=False))


def _strip_header(source: str) -> str:
    """The source without its leading comment block (often long prose), marked as omitted."""
    lines = source.splitlines()
    i = 0
    while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("//")):
        i += 1
    if i == 0:
        return source
    return "// (header comment omitted)\n" + "\n".join(lines[i:])


def _cut(source: str, n: int) -> str:
    """`n` lines of `source`: the first two thirds and the last third (the entry points usually sit at the end)."""
    lines = source.splitlines()
    if n >= len(lines):
        return source
    head = (2 * n + 2) // 3
    tail = n - head
    marker = f"// ... ({len(lines) - n} lines omitted for length) ..."
    return "\n".join([*lines[:head], marker, *(lines[len(lines) - tail :] if tail else [])])


def _fit_example(fits, ex: Example) -> str | None:
    """The longest form of `ex.source` for which `fits(text)` holds: whole, without header, or cut in the middle."""
    if fits(ex.source):
        return ex.source
    body = _strip_header(ex.source)
    if body != ex.source and fits(body):
        return body
    lines = body.splitlines()
    lo, hi = MIN_EXAMPLE_LINES, len(lines) - 1  # largest n in [lo, hi] with fits(_cut(body, n))
    if hi < lo or not fits(_cut(body, lo)):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(_cut(body, mid)):
            lo = mid
        else:
            hi = mid - 1
    return _cut(body, lo)


def build_messages(
    task: Task, gpu_name: str, examples: list[Example], tokenizer: Any, max_prompt_tokens: int
) -> list[dict]:
    """System + user chat messages for `task`, fitting `max_prompt_tokens` once rendered with `tokenizer`.

    Examples are taken in order (nearest first); each is shown whole, else without its header comment, else
    cut in the middle (head and tail kept), else dropped. Raises ValueError when the rules and the task alone do not fit.
    """

    def size(shown: list[tuple[Example, str]]) -> int:
        return count_tokens(render_prompt(_messages(task, gpu_name, shown), tokenizer), tokenizer)

    base = size([])
    if base > max_prompt_tokens:
        raise ValueError(
            f"max_prompt_tokens={max_prompt_tokens} is too small: the rules and the task alone need {base} tokens"
        )
    shown: list[tuple[Example, str]] = []
    for ex in examples:
        text = _fit_example(lambda src, ex=ex: size([*shown, (ex, src)]) <= max_prompt_tokens, ex)
        if text is None:
            log.debug("prompt budget %d: dropped example on %s", max_prompt_tokens, ex.mnk or "seed")
            continue
        shown.append((ex, text))
    return _messages(task, gpu_name, shown)


def render_prompt(messages: list[dict], tokenizer: Any) -> str:
    """The prompt text the model sees: the tokenizer's chat template (with the generation prompt), or plain text."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    parts = [f"### {m['role'].capitalize()}\n{m['content']}" for m in messages]
    return "\n\n".join(parts) + "\n\n### Assistant\n"
