"""The policy LLM: configuration, loading (or a tiny random stand-in), prompts and extraction of its answer.

Importing this package does not import torch or transformers; `load_policy` and `build_tiny_policy` do.
"""

from cudal2.policy.config import PolicyConfig
from cudal2.policy.extract import Extraction, ExtractStatus, extract_for_reward, extract_source
from cudal2.policy.model import PolicyLoadError, build_tiny_policy, load_policy, lora_config
from cudal2.policy.prompt import Example, build_messages, render_prompt, retrieve_examples

__all__ = [
    "Example",
    "ExtractStatus",
    "Extraction",
    "PolicyConfig",
    "PolicyLoadError",
    "build_messages",
    "build_tiny_policy",
    "extract_for_reward",
    "extract_source",
    "load_policy",
    "lora_config",
    "render_prompt",
    "retrieve_examples",
]
