"""A simulated GPU stage for CPU tests of `cudal2 tune`'s GPU path: the compile stage stays real (nvcc), and instead of
the harness each (source, shape) gets a deterministic timing that is written to the result store exactly as the
evaluator would write it, under the label of the fake GPU below.

The simulated kernel time depends only on the source and the shape, so the tuner's ranking, resumption and best-kernel
table can be checked. A stored result answers an evaluation as the evaluator's store lookup would. cuBLAS always
takes BASELINE_US (cuBLASLt autotuned 0.9 of it), and each result carries the paired speedups a steady GPU would give
(every repetition alike: the ratio of the times).
"""

from __future__ import annotations

import hashlib

from cudal2.sandbox.gpu import GpuInfo
from cudal2.sandbox.pool.local import open_store
from cudal2.sandbox.types import EVALUATOR_VERSION, EvalResult, Mode, PairedSpeedup, ShapeResult, Status, Timing

FAKE_GPU = GpuInfo(index=0, name="Simulated H200", compute_capability="9.0", memory_mib=0)
BASELINE_US = 10.0


def simulated_us(source_hash: str, mnk: str) -> float:
    """A kernel time in [5, 15) microseconds, fixed per (source, shape)."""
    return 5.0 + int(hashlib.sha256(f"{source_hash} {mnk}".encode()).hexdigest()[:8], 16) % 1000 / 100.0


def _timing(us: float) -> Timing:
    return Timing(us, us, us, us, us, 0.0, 10)


class SimulatedGpu:
    def __init__(self, options, gpu_index: int, db_path):
        self.store = open_store(db_path)
        self.mode = Mode(options.mode)  # results are stored under the pool's mode, as the evaluator stores them
        self.options = options

    def run(self, prepared) -> EvalResult:
        if prepared.final is not None:
            return prepared.final
        shapes, measured = [], []
        for t in prepared.tasks:
            # As the evaluator does: a stored result answers unless the options say to measure again (fresh, retry).
            stored = self.store.get_result(prepared.source_hash, t, FAKE_GPU.label, self.mode) if self.store else None
            if self.options.answers(stored):
                shapes.append(stored)
                continue
            us = simulated_us(prepared.source_hash, t.mnk)
            baselines = {"cublas": BASELINE_US, "cublaslt_autotuned": BASELINE_US * 0.9}
            timings = {"candidate": _timing(us), **{b: _timing(b_us) for b, b_us in baselines.items()}}
            paired = {b: PairedSpeedup(b_us / us, b_us / us, b_us / us, 10) for b, b_us in baselines.items()}
            measured.append(ShapeResult(t, Status.OK, "simulated", 1e-5, timings, paired=paired))
            shapes.append(measured[-1])
        if self.store is not None:
            self.store.put_source(prepared.source_hash, prepared.source)
            for s in measured:
                self.store.put_result(prepared.source_hash, FAKE_GPU.label, self.mode, s)
        return EvalResult(prepared.source_hash, FAKE_GPU.label, EVALUATOR_VERSION, prepared.compile, tuple(shapes))


def simulated_gpu(options, gpu_index: int, db_path) -> SimulatedGpu:
    return SimulatedGpu(options, gpu_index, db_path)
