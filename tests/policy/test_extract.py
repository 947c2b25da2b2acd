"""Extraction of the candidate file from a completion: which block wins, truncation, failures as values."""

from __future__ import annotations

import pytest

from cudal2.policy.extract import ExtractStatus, extract_for_reward, extract_source

KERNEL = (
    'extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K,\n'
    "                            void* ws, size_t wsb, cudaStream_t s) { return 0; }"
)
DRAFT = '// draft\nextern "C" int cudal2_hgemm() { return 1; }'


def fenced(body: str, lang: str = "cuda") -> str:
    return f"```{lang}\n{body}\n```"


def test_single_cuda_block() -> None:
    ex = extract_source(f"Here it is:\n\n{fenced(KERNEL)}\n\nThis is fast.")
    assert ex.status is ExtractStatus.OK and ex.ok
    assert ex.source == KERNEL
    assert "unterminated" not in ex.reason


def test_several_blocks_last_wins() -> None:
    text = f"First try:\n{fenced(DRAFT)}\nBetter:\n{fenced(KERNEL, 'cu')}\nUsage:\n{fenced('x = 1', 'python')}\n"
    ex = extract_source(text)
    assert ex.ok and ex.source == KERNEL


@pytest.mark.parametrize("lang", ["cuda", "cu", "c++", "cpp", "CUDA", "cuda title=gemm.cu"])
def test_accepted_labels(lang: str) -> None:
    assert extract_source(fenced(KERNEL, lang)).source == KERNEL


def test_labelled_block_beats_later_unlabelled_one() -> None:
    ex = extract_source(f"{fenced(KERNEL)}\nCompile with:\n{fenced('nvcc -O3 x.cu cudal2_hgemm', '')}")
    assert ex.ok and ex.source == KERNEL


def test_unlabelled_block_when_no_labelled_one() -> None:
    ex = extract_source(f"{fenced(DRAFT, '')}\n{fenced(KERNEL, '')}\n{fenced('print(1)', 'python')}")
    assert ex.ok and ex.source == KERNEL


def test_unterminated_final_fence() -> None:
    ex = extract_source(f"{fenced(DRAFT)}\nFinal:\n```cuda\n{KERNEL}\n__global__ void k() {{")
    assert ex.ok
    assert ex.source.startswith('extern "C" int cudal2_hgemm(') and ex.source.endswith("__global__ void k() {")
    assert "unterminated" in ex.reason


def test_no_code_block() -> None:
    ex = extract_source("I would use wgmma and TMA with cudal2_hgemm, but here is no code.")
    assert ex.status is ExtractStatus.NO_CODE_BLOCK and ex.source is None


def test_only_other_languages_is_no_code_block() -> None:
    ex = extract_source(fenced("def cudal2_hgemm(): pass", "python"))
    assert ex.status is ExtractStatus.NO_CODE_BLOCK and "python" in ex.reason


def test_no_entry_point() -> None:
    ex = extract_source(fenced("__global__ void gemm(const half* A) {}"))
    assert ex.status is ExtractStatus.NO_ENTRY_POINT and ex.source is None
    assert "cudal2_hgemm" in ex.reason


def test_entry_point_must_be_a_whole_word() -> None:
    assert extract_source(fenced("int my_cudal2_hgemm_v2() { return 0; }")).status is ExtractStatus.NO_ENTRY_POINT


@pytest.mark.parametrize("text", ["", "   \n\t", fenced("   \n"), "```cuda\n"])
def test_empty(text: str) -> None:
    ex = extract_source(text)
    assert ex.status is ExtractStatus.EMPTY and ex.source is None


def test_answer_after_think_wins() -> None:
    ex = extract_source(f"<think>maybe\n{fenced(DRAFT)}\n</think>\nAnswer:\n{fenced(KERNEL)}")
    assert ex.source == KERNEL


def test_never_raises_and_reasons_are_one_line() -> None:
    for text in [None, 42, b"bytes", "```", "````\n```\n", "```cuda\n```\n```"]:
        ex = extract_source(text)  # type: ignore[arg-type]
        assert "\n" not in ex.reason


def test_extract_for_reward() -> None:
    assert extract_for_reward(fenced(KERNEL)) == (KERNEL, "last ```cuda block of 1")
    src, reason = extract_for_reward("no code")
    assert src is None and reason.startswith("no_code_block")
    # TRL's conversational completions: a list of messages
    assert extract_for_reward([{"role": "assistant", "content": fenced(KERNEL)}])[0] == KERNEL
    assert extract_for_reward(object())[0] is None
