"""The tiny random policy, loading (offline only), LoRA, and one-line load errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402

from cudal2.policy.config import PolicyConfig  # noqa: E402
from cudal2.policy.model import (  # noqa: E402
    TINY_MARKER,
    PolicyLoadError,
    build_tiny_policy,
    build_tiny_tokenizer,
    load_policy,
    lora_config,
)
from cudal2.policy.prompt import build_messages, render_prompt, retrieve_examples  # noqa: E402
from cudal2.sandbox.types import Task  # noqa: E402


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No network, and an empty Hugging Face cache: nothing a test does may reach or depend on the hub."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


def test_tiny_policy_files_and_idempotence(tiny_dir: Path) -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", TINY_MARKER):
        assert (tiny_dir / name).is_file(), name
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["hidden_size"] == 64 and config["num_hidden_layers"] == 2
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]) == (4, 2, 128)
    assert 1500 <= config["vocab_size"] <= 2000
    before = {p.name: p.stat().st_mtime_ns for p in tiny_dir.iterdir()}
    assert build_tiny_policy(tiny_dir) == tiny_dir  # reused, not rebuilt
    assert {p.name: p.stat().st_mtime_ns for p in tiny_dir.iterdir()} == before


def test_tiny_tokenizer_round_trips_through_save(tiny_tokenizer) -> None:
    text = 'extern "C" int cudal2_hgemm(const half* A) {\n\treturn 0;  // é\n}\n'
    fresh = build_tiny_tokenizer()
    assert tiny_tokenizer.encode(text) == fresh.encode(text)  # AutoTokenizer keeps the trained ids
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text)) == text
    assert tiny_tokenizer.eos_token == "<|im_end|>" and tiny_tokenizer.pad_token is not None
    assert tiny_tokenizer.padding_side == "left"


def test_chat_template_renders(tiny_tokenizer) -> None:
    msgs = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "write it"},
        {"role": "assistant", "content": "```cuda\nx\n```"},
    ]
    text = tiny_tokenizer.apply_chat_template(msgs, tokenize=False)
    assert text == (
        "<|im_start|>system\nrules<|im_end|>\n<|im_start|>user\nwrite it<|im_end|>\n"
        "<|im_start|>assistant\n```cuda\nx\n```<|im_end|>\n"
    )
    prompt = render_prompt(msgs[:2], tiny_tokenizer)
    assert prompt.endswith("<|im_start|>assistant\n")


def test_load_and_generate(tiny_dir: Path) -> None:
    model, tokenizer = load_policy(PolicyConfig(tiny_path=str(tiny_dir), device="cpu"))
    assert model.dtype == torch.float32 and model.device.type == "cpu"
    assert model.config.pad_token_id == tokenizer.pad_token_id
    task = Task.parse("64_4096_64")
    msgs = build_messages(task, "NVIDIA H200", retrieve_examples(None, task, "gpu", 1), tokenizer, 3072)
    prompt = render_prompt(msgs, tokenizer)
    batch = tokenizer([prompt, "short"], return_tensors="pt", padding=True)
    assert batch["input_ids"].shape[1] <= 3072
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=4, do_sample=False)
    assert out.shape[0] == 2 and batch["input_ids"].shape[1] < out.shape[1] <= batch["input_ids"].shape[1] + 4
    assert isinstance(tokenizer.decode(out[0, batch["input_ids"].shape[1] :]), str)


def test_bfloat16_and_path_given_as_model(tiny_dir: Path) -> None:
    model, _ = load_policy(PolicyConfig(model=str(tiny_dir), dtype="bfloat16", device="cpu"))
    assert model.dtype == torch.bfloat16


def test_lora_wraps_the_tiny_policy(tiny_dir: Path) -> None:
    pytest.importorskip("peft")
    cfg = PolicyConfig(tiny_path=str(tiny_dir), device="cpu", lora=True, lora_r=4, lora_alpha=8)
    model, _ = load_policy(cfg)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    assert 0 < trainable < total
    assert any("lora_A" in name for name, _ in model.named_parameters())
    lc = lora_config(cfg)
    assert lc.r == 4 and lc.lora_alpha == 8 and set(lc.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert lora_config(PolicyConfig()) is None
    plain, _ = load_policy(cfg, apply_lora=False)  # for GRPOTrainer(peft_config=lora_config(cfg))
    assert all(p.requires_grad for p in plain.parameters())


def _load_error(model: str) -> str:
    with pytest.raises(PolicyLoadError) as info:
        load_policy(PolicyConfig(model=model, device="cpu"))
    message = str(info.value)
    assert "\n" not in message and len(message) < 300
    return message


def test_bad_paths_are_one_line_errors(tmp_path: Path) -> None:
    assert "no such model directory" in _load_error(str(tmp_path / "nowhere" / "model"))
    (tmp_path / "empty").mkdir()
    assert "no config.json" in _load_error(str(tmp_path / "empty"))
    (tmp_path / "file.bin").write_bytes(b"\0")
    assert "not a directory" in _load_error(str(tmp_path / "file.bin"))


def test_not_a_causal_lm(tmp_path: Path) -> None:
    from transformers import ViTConfig

    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32).save_pretrained(
        tmp_path / "vit"
    )
    assert "not a causal LM" in _load_error(str(tmp_path / "vit"))


def test_hub_name_without_network_fails_fast() -> None:
    message = _load_error("cudal2-test/definitely-not-cached")
    assert "not in the local Hugging Face cache" in message and "HF_HUB_OFFLINE=0" in message


def test_hub_offline_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from cudal2.policy import model as model_mod

    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert model_mod._local_only()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert not model_mod._local_only()


def test_tiny_path_occupied_by_something_else(tmp_path: Path) -> None:
    (tmp_path / "occupied").mkdir()
    (tmp_path / "occupied" / "notes.txt").write_text("mine")
    with pytest.raises(PolicyLoadError, match="not empty"):
        load_policy(PolicyConfig(tiny_path=str(tmp_path / "occupied"), device="cpu"))
    assert os.listdir(tmp_path / "occupied") == ["notes.txt"]


def test_tiny_tokenizer_corpus_does_not_follow_the_readme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny policy must not change when the README is edited: its tokenizer (and so every CPU smoke run's
    samples) once did, and a README edit left GRPO with 16 alike rewards and nothing to learn."""
    from cudal2.policy import model

    expected = model._tiny_corpus()
    (tmp_path / "kernels").symlink_to(model.REPO_ROOT / "kernels")
    (tmp_path / "README.md").write_text("an edited README: words the tokenizer must not learn\n" * 50)
    monkeypatch.setattr(model, "REPO_ROOT", tmp_path)
    assert model._tiny_corpus() == expected
