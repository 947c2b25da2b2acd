"""`make demo`: the main job on the embedded default, a GRPO run.

Without a GPU: configs/smoke_cpu.yaml (a tiny policy built locally, warm-started, compile-only reward: static rules,
nvcc, link check, ptxas figures), then the evaluator on the seed kernels, compile-only. With a GPU:
configs/gpu_small.yaml (a small code model with the full reward) when its model is a local directory or in the local
Hugging Face cache, else configs/gpu_tiny.yaml (the tiny local policy with the full reward: no download); then the
seed kernels fully evaluated against cuBLAS.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cudal2 import cli
from cudal2.sandbox.gpu import detect_gpu

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ("128_128_128", "1024_1024_1024", "4096_4096_4096")


def model_available(model: str) -> bool:
    """Whether `model` (a local path or a hub name) can be loaded without a download."""
    if Path(model).is_dir():
        return True
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(model, "config.json"), str)


def choose_config(has_gpu: bool) -> tuple[Path, str]:
    """The demo's config and a line saying why it was chosen."""
    import yaml

    if not has_gpu:
        return (ROOT / "configs" / "smoke_cpu.yaml", "no CUDA GPU on this machine: GRPO with the tiny local policy "
                "and the compile-only reward; on a GPU machine the same command runs the full reward.")
    small = ROOT / "configs" / "gpu_small.yaml"
    model = str(yaml.safe_load(small.read_text())["model"])
    if model_available(model):
        return small, f"GPU found and {model} is available locally: GRPO with it and the full reward."
    return (ROOT / "configs" / "gpu_tiny.yaml", f"GPU found, but {model} is not available without a download: GRPO "
            "with the tiny local policy and the full reward (train.py --config configs/gpu_small.yaml --model "
            "/path/to/model for the real one).")


def main() -> int:
    sys.path.insert(0, str(ROOT))
    import train

    gpu = detect_gpu()
    config, why = choose_config(gpu is not None)
    print(f"demo: {why} ({config.name})\n")
    code = train.main(["--config", str(config)])
    if code != 0:
        return code
    seeds = sorted(str(p) for p in (ROOT / "kernels" / "seed").glob("*.cu"))
    argv = ["eval", *seeds] + [a for s in SHAPES for a in ("--mnk", s)] + ([] if gpu else ["--compile-only"])
    print("\ndemo: the seed kernels through the evaluator" + ("" if gpu else " (compile-only)"))
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
