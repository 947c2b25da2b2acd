"""The prompt: rules, task, accuracy and examples present; the token budget; retrieval from the result store."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudal2.policy.prompt import (
    RULES,
    SEED_KERNEL,
    SIGNATURE,
    Example,
    build_messages,
    count_tokens,
    render_prompt,
    retrieve_examples,
)
from cudal2.sandbox.store import ResultStore
from cudal2.sandbox.types import Acc, ShapeResult, Status, Task, Timing

GPU = "NVIDIA H200 (sm_90a)"
TASK = Task.parse("4096_4096_4096")
FAST = "// fast kernel\n" + "\n".join(f"int fast_{i} = {i};" for i in range(60)) + '\nextern "C" int cudal2_hgemm();\n'
SLOW = "// slow kernel\n" + "\n".join(f"int slow_{i} = {i};" for i in range(60)) + '\nextern "C" int cudal2_hgemm();\n'


def example(source: str, mnk: str, speedup: float | None) -> Example:
    return Example(source=source, mnk=mnk, speedup=speedup, note=f"best known kernel on {mnk}")


EXAMPLES = [example(FAST, "4096_4096_2048", 1.25), example(SLOW, "2048_2048_4096", 0.5)]


def prompt_text(messages: list[dict]) -> str:
    return "\n".join(m["content"] for m in messages)


# -- content --------------------------------------------------------------------------------------------------


def test_prompt_states_contract_rules_task_and_examples(word_tokenizer) -> None:
    msgs = build_messages(TASK, "NVIDIA H200", EXAMPLES, word_tokenizer, 100_000)
    assert [m["role"] for m in msgs] == ["system", "user"]
    text = prompt_text(msgs)
    assert SIGNATURE in text
    for rule in RULES:
        assert rule in text
    for phrase in [
        "No device memory allocation", "no synchronisation", "cuBLAS, cuBLASLt, cuDNN", "`dlopen`/`dlsym`",
        "never write into A or B", "cudaMemsetAsync", "cuTensorMapEncodeTiled", "undefined on entry",
        "legacy default stream", "L2 persistence", "no clocks",
    ]:  # fmt: skip
        assert phrase in text, phrase
    assert "NVIDIA H200" in text and "sm_90a" in text
    assert "M=4096, N=4096, K=4096" in text and "4096_4096_4096" in text
    assert "2.5e-4 x sqrt(K/1024) = 0.0005 at K=4096" in text
    assert "Answer with one ```cuda block containing the complete file" in text
    assert f"```cuda\n{FAST.rstrip()}\n```" in text and f"```cuda\n{SLOW.rstrip()}\n```" in text
    assert "### Example 1: best known kernel on 4096_4096_2048" in text
    assert "### Example 2: best known kernel on 2048_2048_4096" in text
    assert "Write a kernel faster than the references for M=4096, N=4096, K=4096" in text
    assert "Example 1 is the fastest relative to cuBLAS (1.25x) and Example 2 the slowest (0.50x)" in text


def test_fp16_task_states_its_accuracy(word_tokenizer) -> None:
    text = prompt_text(build_messages(Task.parse("64_4096_64", "fp16"), "NVIDIA H200", [], word_tokenizer, 100_000))
    assert "fp16 task" in text and "twice cuBLAS's fp16-accumulating GEMM" in text
    assert "Reference kernels" not in text and "Write a fast, correct kernel for M=64" in text


def test_plain_fallback_render(word_tokenizer) -> None:
    msgs = build_messages(TASK, "NVIDIA H200", [], word_tokenizer, 100_000)
    text = render_prompt(msgs, word_tokenizer)
    assert text.startswith("### System\n") and "### User\n" in text and text.endswith("### Assistant\n")


# -- budget ---------------------------------------------------------------------------------------------------


def test_budget_drops_examples_never_rules(word_tokenizer) -> None:
    base = count_tokens(
        render_prompt(build_messages(TASK, "H200", [], word_tokenizer, 100_000), word_tokenizer), word_tokenizer
    )
    full = count_tokens(
        render_prompt(build_messages(TASK, "H200", EXAMPLES, word_tokenizer, 100_000), word_tokenizer), word_tokenizer
    )
    assert full > base
    for budget in [base, base + 5, base + 150, base + 200, base + 400, full - 1, full]:
        msgs = build_messages(TASK, "H200", EXAMPLES, word_tokenizer, budget)
        assert count_tokens(render_prompt(msgs, word_tokenizer), word_tokenizer) <= budget
        text = prompt_text(msgs)
        assert all(rule in text for rule in RULES) and SIGNATURE in text and "K=4096" in text
    assert "int fast_59" in text and "int slow_59" in text  # the full budget holds both examples whole
    assert "Example" not in prompt_text(build_messages(TASK, "H200", EXAMPLES, word_tokenizer, base + 5))
    # The nearest example is kept whole, the farther one dropped...
    text = prompt_text(build_messages(TASK, "H200", EXAMPLES, word_tokenizer, base + 400))
    assert f"```cuda\n{FAST.rstrip()}\n```" in text and "int slow_0" not in text
    # ...or, on a smaller budget, cut in the middle (header first) before anything of the farther one is shown.
    text = prompt_text(build_messages(TASK, "H200", EXAMPLES, word_tokenizer, base + 200))
    assert "header comment omitted" in text and "lines omitted for length" in text
    assert "int fast_0 = 0;" in text and "int slow_0" not in text
    assert 'extern "C" int cudal2_hgemm();' in text  # the tail survives the cut
    assert "fastest relative to cuBLAS" not in text  # one example left: nothing to contrast


def test_budget_too_small_for_rules_raises(word_tokenizer) -> None:
    with pytest.raises(ValueError, match="too small"):
        build_messages(TASK, "H200", EXAMPLES, word_tokenizer, 50)


# -- retrieval ------------------------------------------------------------------------------------------------


def timing(us: float) -> Timing:
    return Timing(us, us * 0.9, us * 0.95, us * 1.1, us * 1.3, 0.15, 100)


def ok(task: Task, cand_us: float, cublas_us: float) -> ShapeResult:
    return ShapeResult(task, Status.OK, "", 1e-4, {"candidate": timing(cand_us), "cublas": timing(cublas_us)})


@pytest.fixture
def store(tmp_path: Path):
    with ResultStore(tmp_path / "results.sqlite") as s:
        # Inserted far first, so the order below comes from the distance, not from insertion.
        s.put_source("far", SLOW)
        s.put_result("far", GPU, "offline", ok(Task.parse("1024_1024_4096"), 20.0, 10.0))  # distance 2.83
        s.put_source("near", FAST)
        s.put_result("near", GPU, "offline", ok(Task.parse("4096_4096_2048"), 8.0, 10.0))  # distance 1
        s.put_source("bad", "// wrong\n")
        s.put_result("bad", GPU, "offline", ShapeResult(Task.parse("4096_4096_8192"), Status.WRONG_ANSWER, "err"))
        yield s


def test_retrieval_orders_by_distance_with_speedups(store: ResultStore) -> None:
    exs = retrieve_examples(store, TASK, GPU, 5)
    assert [(e.mnk, e.source) for e in exs] == [("4096_4096_2048", FAST), ("1024_1024_4096", SLOW)]
    assert exs[0].speedup == pytest.approx(1.25) and "faster than cuBLAS" in exs[0].note
    assert exs[1].speedup == pytest.approx(0.5) and "slower than cuBLAS" in exs[1].note
    assert [e.mnk for e in retrieve_examples(store, TASK, GPU, 1)] == ["4096_4096_2048"]
    assert retrieve_examples(store, TASK, GPU, 0) == []


def test_retrieval_puts_the_target_shape_first_and_dedups(store: ResultStore) -> None:
    store.put_result("far", GPU, "offline", ok(TASK, 9.0, 10.0))
    store.put_result("near", GPU, "offline", ok(Task.parse("2048_4096_4096"), 8.0, 10.0))  # same source again
    exs = retrieve_examples(store, TASK, GPU, 3)
    # distance ties go to the smaller shape; each source once
    assert [(e.mnk, e.source) for e in exs] == [("4096_4096_4096", SLOW), ("2048_4096_4096", FAST)]
    assert "target shape" in exs[0].note


def test_retrieval_falls_back_to_the_seed(tmp_path: Path, store: ResultStore) -> None:
    with ResultStore(tmp_path / "empty.sqlite") as empty:
        exs = retrieve_examples(empty, TASK, GPU, 2)
    assert len(exs) == 1 and exs[0].source == SEED_KERNEL.read_text() and exs[0].speedup is None
    assert "mma_multistage.cu" in exs[0].note
    # other gpu / other acc: nothing known there either
    assert retrieve_examples(store, TASK, "NVIDIA A100 (sm_80)", 2)[0].speedup is None
    assert retrieve_examples(store, Task(4096, 4096, 4096, Acc.FP16), GPU, 2)[0].speedup is None
    assert retrieve_examples(None, TASK, GPU, 2)[0].mnk == ""


def test_seed_prompt_with_real_tokenizer_fits(tiny_tokenizer) -> None:
    exs = retrieve_examples(None, TASK, GPU, 2)
    for budget in (1500, 3072, 8000):
        msgs = build_messages(TASK, "NVIDIA H200", exs, tiny_tokenizer, budget)
        text = render_prompt(msgs, tiny_tokenizer)
        assert count_tokens(text, tiny_tokenizer) <= budget
        assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
        assert all(rule in text for rule in RULES)
    assert "```cuda\n" + SEED_KERNEL.read_text().rstrip() + "\n```" in text  # 8000 holds the whole seed
