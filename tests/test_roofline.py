"""The per-call lower bound of cudal2.roofline: each term by hand, which term limits, and the GPU label match."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudal2.roofline import FIGURES, OFFLINE_MAX_SETS, Limit, bound, figures_for, offline_inputs_in_l2
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


@pytest.mark.parametrize(("m", "n", "k", "in_l2"), [
    (64, 64, 64, True),  # 24 KiB a set: 32 sets are 768 KiB of the H200's 60 MB
    (512, 512, 512, True),  # 1.5 MiB a set: 48 MiB for 32
    (1024, 1024, 64, False),  # 2.25 MiB a set: 72 MiB, over the L2
    (4096, 4096, 4096, False),
])
def test_offline_inputs_in_l2_by_hand(m, n, k, in_l2):
    assert offline_inputs_in_l2(Task(m, n, k, Acc.FP32), H200) is in_l2


def test_offline_set_count_is_the_harness_s():
    """The rule above holds only while the harness rotates at most OFFLINE_MAX_SETS sets."""
    harness = (Path(__file__).parents[1] / "cudal2" / "sandbox" / "harness" / "harness.cu").read_text()
    assert f"max_sets = {OFFLINE_MAX_SETS};" in harness
