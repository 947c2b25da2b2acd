"""Shared fixtures for the policy tests: a word-level fake tokenizer (no torch) and one tiny policy per session."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


class WordTokenizer:
    """Counts words and punctuation marks as tokens; has no chat template (exercises the plain fallback)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [0] * len(_TOKEN_RE.findall(text))


@pytest.fixture
def word_tokenizer() -> WordTokenizer:
    return WordTokenizer()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random policy, built once for the session."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from cudal2.policy.model import build_tiny_policy

    return build_tiny_policy(tmp_path_factory.mktemp("policy") / "tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_dir: Path):
    from cudal2.policy.model import load_tokenizer

    return load_tokenizer(str(tiny_dir), local_only=True)
