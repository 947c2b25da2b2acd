"""Builders shared by the export, ops and CLI tests: evaluator results as the harness reports them, kernel entries
and manifests with chosen measurements."""

from __future__ import annotations

from pathlib import Path

from cudal2.export import TORCH_BASELINE, KernelEntry, Manifest, sha256_text
from cudal2.kernels.sm90 import FAMILY as SM90
from cudal2.sandbox.types import EVALUATOR_VERSION, Acc, Mode, ShapeResult, Status, Task, Timing

GPU = "NVIDIA H200 (sm_90a)"
# What the harness records after a full evaluation (runtime hardening checks on).
FULL_CHECKS = ("exact-integer check", "random normal check", "positive-mean random check", "repeat check",
               "timed-call re-verification (8 sets)")
NO_HARDENING = ("exact-integer check", "random normal check", "positive-mean random check")


def timing(median_us: float) -> Timing:
    return Timing(median_us, median_us * 0.9, median_us * 0.95, median_us * 1.1, median_us * 1.3, 0.15, 200)


def ok_result(task: Task, cand_us: float, cublas_us: float, checks: tuple[str, ...] = FULL_CHECKS) -> ShapeResult:
    """A full evaluation's ok result with all three baselines timed (cuBLASLt ones 5% faster than cuBLAS)."""
    timings = {"candidate": timing(cand_us), "cublas": timing(cublas_us),
               "cublaslt_heuristic": timing(cublas_us * 0.95), "cublaslt_autotuned": timing(cublas_us * 0.95)}
    return ShapeResult(task, Status.OK, "correct and timed", max_rel_err=1e-4, timings=timings, graph=True,
                       checks=checks)


def kernel_source(tag: str) -> str:
    """A distinct, contract-shaped source per tag (its text only matters for hashing and file contents)."""
    return (f"// {tag}\n#include <cuda_fp16.h>\n"
            'extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, '
            "void* w, size_t wb, cudaStream_t s) { return 0; }\n")


def entry(m: int, n: int, k: int, median_us: float, torch_us: float, gpu: str = GPU, tag: str = "") -> KernelEntry:
    task = Task(m, n, k)
    return KernelEntry(
        m=m, n=n, k=k, acc=Acc.FP32, file=f"{task.mnk}.cu", source_hash=sha256_text(kernel_source(tag or task.mnk)),
        evaluator_version=EVALUATOR_VERSION, gpu=gpu, mode=Mode.OFFLINE, median_us=median_us,
        baseline_us={TORCH_BASELINE: torch_us, "cublaslt_heuristic": torch_us * 0.95},
        speedups={TORCH_BASELINE: torch_us / median_us, "cublaslt_heuristic": torch_us * 0.95 / median_us},
        max_rel_err=1e-4, measured="2025-01-01T00:00:00Z",
    )  # fmt: skip


def manifest(*entries: KernelEntry, gpu: str = GPU, acc: Acc = Acc.FP32) -> Manifest:
    return Manifest(gpu=gpu, acc=acc, mode=Mode.OFFLINE, evaluator_version=EVALUATOR_VERSION,
                    baseline=TORCH_BASELINE, min_speedup=1.02, created="2025-01-02T00:00:00Z", kernels=entries)


# A small sm90 config the tuner could have generated (its host_cache twin is the same with host_cache on).
SM90_CFG = SM90.make(dict(bm=64, bn=16, bk=128, cluster_m=1, cluster_n=1, schedule="basic", scheduler="persistent",
                          epilogue="tma", stages=4, swizzle=1, acc="fp32", splits=1))


def write_fixture_library(directory: Path, m: Manifest) -> Path:
    """`m` saved in `directory` with a placeholder source per kernel: a library cudal2.ops and the CLI can open."""
    directory.mkdir(parents=True, exist_ok=True)
    for e in m.kernels:
        (directory / e.file).write_text(kernel_source(e.task.mnk))
    m.save(directory)
    return directory
