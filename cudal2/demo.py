"""`make demo`: the main job on the embedded default.

Until the trainer lands, the main job is the evaluator on the seed kernels (kernels/seed/*.cu) over a few shapes:
a full evaluation (correctness, timing, speedups vs cuBLAS) where a GPU is visible, compile-only (static checks,
nvcc, link check, ptxas figures) with a clear note where none is.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cudal2 import cli
from cudal2.sandbox.gpu import detect_gpu

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ("128_128_128", "1024_1024_1024", "4096_4096_4096")


def main() -> int:
    seeds = sorted(str(p) for p in (ROOT / "kernels" / "seed").glob("*.cu"))
    if not seeds:
        print("demo: no seed kernels under kernels/seed/", file=sys.stderr)
        return 2
    argv = ["eval", *seeds]
    for s in SHAPES:
        argv += ["--mnk", s]
    if detect_gpu() is None:
        print("demo: no CUDA GPU on this machine, so the seed kernels are checked and compiled only "
              "(static rules, nvcc for sm_90a, link check, ptxas figures). On a GPU machine the same command "
              "verifies and times them against cuBLAS.\n")
        argv.append("--compile-only")
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
