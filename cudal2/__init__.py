"""cudal2: RL for fast CUDA HGEMM kernels, with a strict evaluator."""

__version__ = "0.1.0"
