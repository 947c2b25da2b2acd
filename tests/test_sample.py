"""`cudal2 sample` with the tiny local policy, compile-only (no GPU): samples, evaluates, stores, writes the best."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from cudal2 import cli  # noqa: E402

pytestmark = pytest.mark.nvcc


def test_sample_compile_only_writes_best(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    from cudal2.policy.config import PolicyConfig
    from cudal2.policy.model import build_tiny_policy, load_tokenizer
    from cudal2.policy.prompt import build_messages
    from cudal2.policy.warm import ensure_warm
    from cudal2.sandbox.types import Task

    # The default tiny policy directory, warm-started as train.py would do it.
    tiny = PolicyConfig().tiny_path
    monkeypatch.chdir(tmp_path)
    tok = load_tokenizer(str(build_tiny_policy(tiny)), True)
    ensure_warm(tiny, [build_messages(Task(64, 64, 64), "NVIDIA H200", [], tok, 3072)])
    out = tmp_path / "best.cu"
    code = cli.main(["sample", "--mnk", "64_64_64", "--n", "4", "--compile-only", "--max-new-tokens", "320",
                     "--temperature", "0.7", "--out", str(out), "--db", str(tmp_path / "r.sqlite")])
    text = capsys.readouterr().out
    assert "4 samples:" in text and "best:" in text
    if code == 0:  # at least one sample compiled: it is the one written
        assert "cudal2_hgemm" in out.read_text() and "best: compiled" in text
    else:
        assert code == 1


def test_sample_without_gpu_needs_compile_only(capsys, monkeypatch):
    monkeypatch.setenv("CUDAL2_NO_GPU", "1")
    assert cli.main(["sample", "--mnk", "64_64_64"]) == 2
    assert "--compile-only" in capsys.readouterr().err
