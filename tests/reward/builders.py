"""Hand-built EvalResults for reward tests (no GPU, no compiler: the reward only reads these records)."""

from __future__ import annotations

from cudal2.sandbox.types import (
    EVALUATOR_VERSION,
    CompileResult,
    EvalResult,
    KernelResources,
    ShapeResult,
    Status,
    Task,
    Timing,
)

TASK = Task(1024, 1024, 1024)


def timing(median_us: float) -> Timing:
    return Timing(median_us, median_us, median_us, median_us, median_us, 0.0, 10)


def ok_shape(task: Task = TASK, cand_us: float = 10.0, cublas_us: float = 10.0, err: float | None = 0.0,
             **baselines_us: float) -> ShapeResult:
    timings = {"candidate": timing(cand_us), "cublas": timing(cublas_us)}
    timings.update({name: timing(us) for name, us in baselines_us.items()})
    return ShapeResult(task, Status.OK, "", max_rel_err=err, timings=timings)


def shape(status: Status, task: Task = TASK) -> ShapeResult:
    return ShapeResult(task, status, f"{status.value} (test)")


def kernel(registers: int = 128, spill_store: int = 0, spill_load: int = 0) -> KernelResources:
    return KernelResources("k", "sm_90a", registers, 0, 0, spill_store, spill_load)


def result(*shapes: ShapeResult, kernels: tuple[KernelResources, ...] = ()) -> EvalResult:
    comp = CompileResult(Status.COMPILED, "", "key", "sm_90a", "/tmp/x.so", 0.0, True, "", kernels)
    return EvalResult("hash", "test gpu", EVALUATOR_VERSION, comp, tuple(shapes))
