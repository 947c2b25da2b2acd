"""`make demo`: the main job on the embedded default, a GRPO run.

Without a GPU: configs/smoke_cpu.yaml (a tiny policy built locally, warm-started, compile-only reward: static rules,
nvcc, link check, ptxas figures), then the evaluator on the seed kernels, compile-only. With a GPU:
configs/gpu_small.yaml (a small code model with the full reward; the model must be in the local Hugging Face cache or
given as a local path with --model), then the seed kernels fully evaluated against cuBLAS.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cudal2 import cli
from cudal2.sandbox.gpu import detect_gpu

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ("128_128_128", "1024_1024_1024", "4096_4096_4096")


def main() -> int:
    sys.path.insert(0, str(ROOT))
    import train

    gpu = detect_gpu()
    config = ROOT / "configs" / ("gpu_small.yaml" if gpu else "smoke_cpu.yaml")
    if gpu is None:
        print("demo: no CUDA GPU on this machine: GRPO with the tiny local policy and the compile-only reward "
              f"({config.name}); on a GPU machine the same command trains a small model with the full reward.\n")
    code = train.main(["--config", str(config)])
    if code != 0:
        return code
    seeds = sorted(str(p) for p in (ROOT / "kernels" / "seed").glob("*.cu"))
    argv = ["eval", *seeds] + [a for s in SHAPES for a in ("--mnk", s)] + ([] if gpu else ["--compile-only"])
    print("\ndemo: the seed kernels through the evaluator" + ("" if gpu else " (compile-only)"))
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
