"""The per-call lower bound of cudal2.roofline: each term by hand, which term limits, and the GPU label match."""

from __future__ import annotations

import pytest

from cudal2.roofline import FIGURES, Limit, bound, figures_for
from cudal2.sandbox.types import Acc, Task

H200 = figures_for("NVIDIA H200 (sm_90a)")


def test_each_term_of_the_bound_by_hand():
    b = bound(Task(4096, 4096, 4096, Acc.FP32), H200)
    assert b.compute_us == pytest.approx(2 * 4096**3 / 989.4e6)  # 138.9 us at 989.4 TFLOP/s
    assert b.memory_us == pytest.approx(2 * 3 * 4096**2 / 4.8e6)  # 3 x 32 MiB at 4.8 TB/s: 21.0 us
    assert b.node_us == 0.541 and b.us == b.compute_us and b.limit is Limit.COMPUTE


@pytest.mark.parametrize(("m", "n", "k", "limit"), [
    (64, 64, 64, Limit.LAUNCH),  # 2^19 flops and 24 KiB: a graph node outweighs both
    (1, 4096, 4096, Limit.MEMORY),  # a matrix-vector product: 32 MiB of B for 2^25 flops
    (16384, 16384, 16384, Limit.COMPUTE),
])
def test_the_largest_term_limits(m, n, k, limit):
    b = bound(Task(m, n, k, Acc.FP32), H200)
    assert b.limit is limit and b.us == max(b.node_us, b.compute_us, b.memory_us)


def test_gpu_labels_match_the_most_specific_figures():
    assert figures_for("NVIDIA H100 PCIe (sm_90a)").name == "H100 PCIe"
    assert figures_for("NVIDIA H100 80GB HBM3 (sm_90a)").name == "H100"
    assert figures_for("NVIDIA A100-SXM4-80GB (sm_80)") is None
    names = [f.name for f in FIGURES]
    assert names.index("H100 PCIe") < names.index("H100")  # else "H100" would match a PCIe card first
