"""benchmarks/fused_splitk.py: each reduction=last config and its two twins are valid configs of the sm90 family on
the same decomposition, they compile for sm_90a, and the table pairs them per shape."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from cudal2.kernels.sm90 import Epilogue, Reduction, batched_split_k
from cudal2.sandbox.compiler import cutlass_include_dir


@pytest.fixture(scope="module")
def fused():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    return importlib.import_module("fused_splitk")


def test_each_config_and_its_twins_split_the_same_tiles_and_differ_in_the_reduction(fused):
    decomposition = ("bm", "bn", "bk", "cluster_m", "cluster_n", "schedule", "splits", "ctas_per_sm")
    for c in fused.CONFIGS:
        last, workspace, pdl = (fused.variant(c, kind) for kind in fused.KINDS)
        for v in (last, workspace, pdl):
            assert fused.FAMILY.prune(v, "sm_90a") is None, v
            assert batched_split_k(v) and [getattr(v, f) for f in decomposition] == [getattr(c, f) for f in decomposition]
        assert last.reduction is Reduction.LAST and workspace.reduction is pdl.reduction is Reduction.ORDERED
        assert (workspace.epilogue, workspace.pdl, pdl.epilogue, pdl.pdl) == (Epilogue.NOSMEM, False, Epilogue.TMA, True)
    labels = [fused.label(c) for c in fused.CONFIGS]
    assert len(set(labels)) == len(labels)


def test_only_the_twins_launch_a_reduction_kernel(fused):
    for (c, kind), src in fused.sources().items():
        assert ("splitk_reduce" in src) == (kind != "last"), (fused.label(c), kind)
        assert ("TicketEpilogue" in src) == (kind == "last")


@pytest.mark.nvcc
def test_every_config_and_twin_compiles_for_sm90a(fused, capsys):
    if cutlass_include_dir() is None:
        pytest.skip("no CUTLASS/CuTe headers (pip install nvidia-cutlass)")
    assert fused.main(["--compile-only"]) == 0
    n = len(fused.sources())
    assert f"{n} kernels: {n} compiled" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--shapes", "64_64"], ["--shapes", "a_b_c"], ["--shapes", "0_64_64"],
                                  ["--repeats", "0"]])
def test_bad_arguments_are_refused_in_one_line(fused, capsys, argv):
    assert fused.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fused_splitk.py: ") and "\n" not in err


def test_the_table_pairs_last_with_its_twins_per_shape(fused):
    a, b, c = fused.CONFIGS[:3]
    evals = {(a, "last", "1_2_8"): [(10.0, 20.0), (12.0, 22.0)], (a, "workspace", "1_2_8"): [(22.0, 21.0)],
             (a, "pdl", "1_2_8"): [(16.5, 21.0)],
             (b, "last", "1_2_8"): [(5.0, 20.0)],  # b has no twin timing on this shape: no row
             (c, "last", "1_2_8"): [(5.0, 20.0)], (c, "pdl", "1_2_8"): [(4.0, 20.0)]}  # c's workspace twin failed
    lines = fused.table(evals).splitlines()
    assert lines[2:] == [f"| {fused.label(a)} | 1_2_8 | 11.00 | 22.00 | 16.50 | 2.000x | 1.500x | 21.00 |",
                         f"| {fused.label(c)} | 1_2_8 | 5.00 | - | 4.00 | - | 0.800x | 20.00 |"]
