"""make demo's choice of run: it must never need a download it cannot make."""

from __future__ import annotations

from cudal2 import demo


def test_without_a_gpu_the_demo_is_the_cpu_smoke_run():
    config, why = demo.choose_config(has_gpu=False)
    assert config.name == "smoke_cpu.yaml" and "no CUDA GPU" in why


def test_with_a_gpu_but_no_local_model_the_demo_uses_the_tiny_policy(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache: the small model is not there
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    config, why = demo.choose_config(has_gpu=True)
    assert config.name == "gpu_tiny.yaml" and "without a download" in why


def test_a_local_model_directory_counts_as_available(tmp_path):
    assert demo.model_available(str(tmp_path))
    assert not demo.model_available("no-such-org/no-such-model-anywhere")
