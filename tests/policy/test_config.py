"""PolicyConfig: defaults, validation with one-line errors, and parsing through TRL's TrlParser."""

from __future__ import annotations

import pytest

from cudal2.policy.config import PolicyConfig


def test_defaults() -> None:
    cfg = PolicyConfig()
    assert cfg.model == "tiny-local" and cfg.is_tiny and cfg.dtype == "float32" and not cfg.lora
    assert cfg.lora_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert (cfg.max_prompt_tokens, cfg.max_completion_tokens, cfg.n_examples) == (3072, 4096, 2)
    assert cfg.gpu_name == "NVIDIA H200"


def test_comma_separated_targets() -> None:
    assert PolicyConfig(lora_target_modules="q_proj, v_proj").lora_target_modules == ["q_proj", "v_proj"]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"model": ""}, "model"),
        ({"dtype": "float8"}, "dtype"),
        ({"device": "gpu0"}, "device"),
        ({"lora_r": 0}, "lora_r"),
        ({"lora_alpha": -1}, "lora_alpha"),
        ({"lora_dropout": 1.0}, "lora_dropout"),
        ({"lora_target_modules": []}, "lora_target_modules"),
        ({"max_prompt_tokens": 10}, "max_prompt_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"n_examples": -1}, "n_examples"),
        ({"gpu_name": " "}, "gpu_name"),
    ],
)
def test_validation(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError) as info:
        PolicyConfig(**kwargs)
    message = str(info.value)
    assert field in message and "\n" not in message


def test_trl_parser_flags_and_yaml(tmp_path) -> None:
    trl = pytest.importorskip("trl")
    parser = trl.TrlParser((PolicyConfig,))
    (cfg,) = parser.parse_args_and_config(
        ["--model", "Qwen/Qwen2.5-Coder-1.5B-Instruct", "--lora", "true", "--lora_target_modules", "q_proj", "v_proj"]
    )
    assert (
        cfg.model == "Qwen/Qwen2.5-Coder-1.5B-Instruct" and cfg.lora and cfg.lora_target_modules == ["q_proj", "v_proj"]
    )
    yaml_path = tmp_path / "policy.yaml"
    yaml_path.write_text("dtype: bfloat16\nn_examples: 3\nlora_target_modules: [q_proj, k_proj]\n")
    (cfg,) = parser.parse_args_and_config(["--config", str(yaml_path)])
    assert (cfg.dtype, cfg.n_examples, cfg.lora_target_modules) == ("bfloat16", 3, ["q_proj", "k_proj"])


def test_no_flag_clashes_with_grpo_config() -> None:
    trl = pytest.importorskip("trl")
    import dataclasses

    ours = {f.name for f in dataclasses.fields(PolicyConfig)}
    assert not ours & {f.name for f in dataclasses.fields(trl.GRPOConfig)}
