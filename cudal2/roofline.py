"""How far a kernel is from what the GPU allows: a lower bound on the time of one HGEMM call, per GPU.

    bound_us(M, N, K) = max(node_us, 2 M N K / tensor peak, 2 (M K + K N + M N) bytes / HBM bandwidth)

- node_us: one kernel node in CUDA-graph replay, the offline timing's own floor (an empty one-CTA kernel took
  0.541 us per node on the H200: `benchmarks/graph_gap.cu`, RESULTS).
- compute: the dense fp16 tensor-core peak with fp32 accumulation (the datasheet's figure; no kernel reaches it).
- memory: A, B and C (fp16, 2 bytes) each moved once between HBM and the SMs at the datasheet's bandwidth. Offline
  timing rotates at most 32 input sets, so a shape whose sets are under ~L2 / 31 bytes (~2 MB with the H200's 60 MB)
  finds them in L2 instead; the bound still holds there, since such a shape's memory term (< 0.42 us at 4.8 TB/s)
  is under the node term. Cold mode flushes L2 before each replay, so its inputs always come from HBM.

It is a bound, not a prediction: each term alone is a floor, and a real call pays them partly in sequence (a kernel
cannot start its stores before its loads). So kernel / bound says how far a kernel is from the floor, and cuBLAS /
bound is the largest speedup over cuBLAS that any kernel could show on that shape: the ceiling a target is judged
under. A shape where both run many times over the bound loses its time to latency (launch, dependent loads, a
split-K reduction), not to bandwidth or flops.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from cudal2.sandbox.types import Task

HALF_BYTES = 2  # fp16 A, B and C


@dataclass(frozen=True)
class GpuFigures:
    """What one GPU allows. `name` is matched against the evaluator's GPU label ('NVIDIA H200 (sm_90a)')."""

    name: str
    tensor_flop_per_us: float  # dense fp16 tensor-core peak, fp32 accumulate
    hbm_bytes_per_us: float
    node_us: float  # one kernel node in CUDA-graph replay
    l2_bytes: int  # the L2 the device reports (cudaDeviceProp.l2CacheSize)


# Datasheet peaks (dense, no sparsity). The node cost was measured on the H200 only; the H100 runs the same launch
# path on the same SM count and is given the same figure. L2 as PyTorch reported it on the lent machines (H200 60 MB,
# H100 50 MB; the device library's KINDS.md). More specific names first: "H100 PCIe" before "H100".
MB = 1 << 20
FIGURES = (
    GpuFigures("H200", 989.4e6, 4.8e6, 0.541, 60 * MB),
    GpuFigures("H100 PCIe", 756.0e6, 2.0e6, 0.541, 50 * MB),
    GpuFigures("H100", 989.4e6, 3.35e6, 0.541, 50 * MB),
)
OFFLINE_MAX_SETS = 32  # the harness's max_sets: input sets an offline replay rotates through at most


def figures_for(gpu_label: str) -> GpuFigures | None:
    """The figures of the GPU a label names, or None for a GPU without figures."""
    return next((f for f in FIGURES if f.name.lower() in gpu_label.lower()), None)


class Limit(str, Enum):
    """Which term of the bound is the largest."""

    LAUNCH = "launch"
    COMPUTE = "compute"
    MEMORY = "memory"


@dataclass(frozen=True)
class Bound:
    """The three floors of one call, microseconds."""

    node_us: float
    compute_us: float
    memory_us: float

    @property
    def us(self) -> float:
        return max(self.node_us, self.compute_us, self.memory_us)

    @property
    def limit(self) -> Limit:
        terms = {Limit.LAUNCH: self.node_us, Limit.COMPUTE: self.compute_us, Limit.MEMORY: self.memory_us}
        return max(terms, key=terms.__getitem__)


def set_bytes(task: Task) -> int:
    """Bytes of one input set, A, B and C: what a call moves at the least, and what offline timing rotates."""
    return HALF_BYTES * (task.m * task.k + task.k * task.n + task.m * task.n)


def bound(task: Task, gpu: GpuFigures) -> Bound:
    """The lower bound on one call of `task` (C[M,N] = A[M,K] @ B[K,N], fp16) on `gpu`."""
    return Bound(gpu.node_us, 2.0 * task.m * task.n * task.k / gpu.tensor_flop_per_us,
                 set_bytes(task) / gpu.hbm_bytes_per_us)


def offline_inputs_in_l2(task: Task, gpu: GpuFigures) -> bool:
    """Does offline timing find this shape's inputs in L2? The replay rotates OFFLINE_MAX_SETS sets, so between two
    turns of one set the other 31 pass through L2; when they fit with it, the set is still there (LRU, ignoring
    the L2's two partitions). Cold mode flushes L2 first, so there the answer is always no."""
    return OFFLINE_MAX_SETS * set_bytes(task) <= gpu.l2_bytes
