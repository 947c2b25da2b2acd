"""Loading the policy LLM (and building a tiny random one for tests and CPU smoke runs).

`load_policy(cfg)` returns `(model, tokenizer)`. Nothing is ever downloaded unless the caller explicitly sets
`HF_HUB_OFFLINE=0`: a hub name is resolved from the local Hugging Face cache only, so a missing model fails at
once with a one-line `PolicyLoadError` instead of hanging on a network that is not there.

`cfg.model == "tiny-local"` builds (once; reused afterwards) a tiny random `Qwen2ForCausalLM` with a byte-level
BPE tokenizer trained in-process on the seed kernels and the prompt's text, and a Qwen-style chat template. It knows
nothing; it exists so that the whole pipeline (prompt -> generate -> extract -> reward -> GRPO step) runs on a
CPU in seconds.

torch, transformers, tokenizers and peft are imported lazily, so importing this module costs nothing.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from cudal2.policy.config import PolicyConfig

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_MARKER = "cudal2-tiny-policy.json"  # written last: a directory without it is an unfinished build
TINY_VERSION = 2  # bump when the tiny model or its tokenizer's corpus changes: cached builds are then rebuilt
TINY_VOCAB = 2000
TINY_MAX_POSITIONS = 8192
TINY_SEED = 1234

BOS, EOS, PAD = "<|endoftext|>", "<|im_end|>", "<|endoftext|>"
IM_START = "<|im_start|>"
SPECIAL_TOKENS = [BOS, IM_START, EOS]
# transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Qwen-style ChatML: <|im_start|>role\ncontent<|im_end|>\n ... ending with "<|im_start|>assistant\n" when asked.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class PolicyLoadError(Exception):
    """The policy model or tokenizer cannot be loaded as configured (one-line message)."""


def _one_line(e: BaseException, limit: int = 200) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- tiny random policy ---------------------------------------------------------------------------------------


def _tiny_corpus() -> list[str]:
    """Training text for the tiny tokenizer: the seed kernels and the prompt's own text. Not the README (it was, up to
    TINY_VERSION 1): every README edit then retrained the tokenizer, and with it changed what the tiny policy writes
    in the CPU smoke runs and tests."""
    from cudal2.policy import prompt

    texts = [p.read_text(errors="replace") for p in sorted((REPO_ROOT / "kernels" / "seed").glob("*.cu"))]
    texts.append(prompt.SYSTEM_INTRO + "\n" + prompt.SIGNATURE + "\n" + "\n".join(prompt.RULES))
    # Line-sized pieces: the BPE trainer counts words per item, and many items train as fast as few.
    return [line for text in texts for line in text.splitlines(keepends=True) if line.strip()]


def _is_tiny_built(path: Path) -> bool:
    marker = path / TINY_MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("version") == TINY_VERSION
    except (OSError, ValueError, AttributeError):
        return False


def build_tiny_tokenizer() -> Any:
    """A byte-level BPE (vocab ~2000) trained in-process, wrapped as a transformers fast tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    # Exactly Qwen2Tokenizer's pipeline: AutoTokenizer rebuilds a qwen2 model's tokenizer as that class, and the
    # ids must not change on the way through save_pretrained / from_pretrained.
    tok = Tokenizer(
        models.BPE(continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False, byte_fallback=False)
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=TINY_MAX_POSITIONS,
        padding_side="left",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_policy(path: str | os.PathLike[str]) -> Path:
    """Create the tiny random policy (model + tokenizer) at `path` unless already there; returns the directory.

    Built in a sibling temporary directory and renamed into place, so a crash never leaves a half-built policy
    that a later call would reuse. The weights are seeded (same files every time) without touching the caller's
    random state.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    path = Path(path).expanduser()
    if _is_tiny_built(path):
        return path
    if path.exists() and any(path.iterdir()):
        raise PolicyLoadError(f"{path}: exists, is not empty and is not a tiny policy; remove it or pick another path")
    path.parent.mkdir(parents=True, exist_ok=True)

    tokenizer = build_tiny_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (BOS, EOS, PAD)}
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=TINY_MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=ids[BOS],
        eos_token_id=ids[EOS],
        pad_token_id=ids[PAD],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=ids[BOS], eos_token_id=ids[EOS], pad_token_id=ids[PAD], do_sample=True, temperature=1.0
    )

    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        n_params = sum(p.numel() for p in model.parameters())
        (tmp / TINY_MARKER).write_text(
            json.dumps({"version": TINY_VERSION, "vocab": len(tokenizer), "params": n_params})
        )
        if path.exists():
            path.rmdir()  # empty (checked above)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if _is_tiny_built(path):  # a concurrent builder won the race: its result is as good as ours
            return path
        raise
    log.info("built tiny random policy at %s (%d parameters, vocab %d)", path, n_params, len(tokenizer))
    return path


# -- loading --------------------------------------------------------------------------------------------------


def _torch_dtype(name: str) -> Any:
    import torch

    return (
        "auto"
        if name == "auto"
        else {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    )


def resolve_device(device: str) -> str:
    """'auto' -> cuda:LOCAL_RANK when CUDA is available, else cpu; anything else as given."""
    if device != "auto":
        return device
    import torch

    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0') or 0)}"
    return "cpu"


def _local_only() -> bool:
    """Hub lookups stay in the local cache unless the user explicitly allowed downloads (HF_HUB_OFFLINE=0)."""
    return os.environ.get("HF_HUB_OFFLINE") != "0"


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def _resolve_source(cfg: PolicyConfig) -> str:
    """The directory or hub name to load from; PolicyLoadError for a path that is not a model directory."""
    if cfg.is_tiny:
        try:
            return str(build_tiny_policy(cfg.tiny_path))
        except PolicyLoadError:
            raise
        except Exception as e:
            raise PolicyLoadError(f"cannot build the tiny policy at {cfg.tiny_path}: {_one_line(e)}") from e
    p = Path(cfg.model).expanduser()
    if p.exists():
        if not p.is_dir():
            raise PolicyLoadError(f"{cfg.model}: not a directory (expected a model directory with config.json)")
        if not (p / "config.json").is_file():
            raise PolicyLoadError(f"{cfg.model}: no config.json (not a Hugging Face model directory)")
        return str(p)
    if _looks_like_path(cfg.model):
        raise PolicyLoadError(f"{cfg.model}: no such model directory")
    return cfg.model


def _load_config(source: str, local_only: bool) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, local_files_only=local_only)
    except Exception as e:
        if local_only and not Path(source).exists():
            raise PolicyLoadError(
                f"{source}: no such directory, and not in the local Hugging Face cache with downloads off; "
                "pass a local model directory, or set HF_HUB_OFFLINE=0 where the hub is reachable"
            ) from e
        raise PolicyLoadError(f"{source}: cannot read the model config: {_one_line(e)}") from e


def load_tokenizer(source: str, local_only: bool | None = None) -> Any:
    """The tokenizer at `source` with a pad token (the eos token when it has none) and left padding."""
    from transformers import AutoTokenizer

    local_only = _local_only() if local_only is None else local_only
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
    except Exception as e:
        raise PolicyLoadError(f"{source}: cannot load the tokenizer: {_one_line(e)}") from e
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise PolicyLoadError(f"{source}: the tokenizer has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # decoder-only generation pads on the left
    return tokenizer


def lora_config(cfg: PolicyConfig) -> Any:
    """The peft `LoraConfig` for `cfg` (for TRL's `GRPOTrainer(peft_config=...)`), or None when LoRA is off."""
    if not cfg.lora:
        return None
    from peft import LoraConfig

    return LoraConfig(
        task_type="CAUSAL_LM",
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_target_modules),
        bias="none",
    )


def load_policy(cfg: PolicyConfig, *, apply_lora: bool = True) -> tuple[Any, Any]:
    """(model, tokenizer) for `cfg`; raises PolicyLoadError (one line) when that is impossible.

    With `cfg.lora` and `apply_lora`, the model comes back wrapped by peft's `get_peft_model`. A caller that hands
    LoRA to TRL instead passes `apply_lora=False` and `peft_config=lora_config(cfg)`.
    """
    from transformers import AutoModelForCausalLM

    source = _resolve_source(cfg)
    local_only = _local_only()
    config = _load_config(source, local_only)
    if type(config) not in AutoModelForCausalLM._model_mapping:
        raise PolicyLoadError(f"{source}: model type {getattr(config, 'model_type', '?')!r} is not a causal LM")
    tokenizer = load_tokenizer(source, local_only)
    device = resolve_device(cfg.device)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=_torch_dtype(cfg.dtype), local_files_only=local_only)
        model.to(device)
    except Exception as e:
        raise PolicyLoadError(f"{source}: cannot load the model on {device}: {_one_line(e)}") from e
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if cfg.lora and apply_lora:
        from peft import get_peft_model

        try:
            model = get_peft_model(model, lora_config(cfg))
        except Exception as e:
            raise PolicyLoadError(f"{source}: cannot apply LoRA to {cfg.lora_target_modules}: {_one_line(e)}") from e
    return model, tokenizer
