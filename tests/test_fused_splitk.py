"""benchmarks/fused_splitk.py: each fused kernel has a valid twin in the sm90 family on the same decomposition, the
fused sources compile for sm_90a beside their twins, and the table pairs them per shape."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from cudal2.kernels.sm90 import Epilogue, Schedule, batched_split_k
from cudal2.sandbox.compiler import cutlass_include_dir


@pytest.fixture(scope="module")
def fused():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    return importlib.import_module("fused_splitk")


def test_each_twin_is_the_familys_batch_split_k_on_the_same_decomposition(fused):
    for v in fused.VARIANTS:
        t = fused.twin(v)
        assert fused.FAMILY.prune(t, "sm_90a") is None, v
        assert batched_split_k(t) and t.epilogue is Epilogue.NOSMEM and not t.pdl
        assert (t.bm, t.bn, t.bk, t.cluster_m, t.cluster_n, t.schedule, t.splits) == (
            v.bm, v.bn, v.bk, v.cluster_m, v.cluster_n, v.schedule, v.splits)


def test_a_fused_source_sums_in_its_epilogue_and_launches_one_kernel(fused):
    v = fused.VARIANTS[0]
    src = fused.fused_source(v)
    assert "TicketEpilogue" in src and f"constexpr int SPLITS = {v.splits};" in src
    assert "splitk_reduce" not in src and "__global__" not in src  # CUTLASS's kernel only: no second launch
    assert "splitk_reduce" in fused.sources()[(v, "twin")]
    labels = [v.label for v in fused.VARIANTS]
    assert len(set(labels)) == len(labels)


def test_a_staged_variant_differs_only_in_its_store_and_shares_its_siblings_twin(fused):
    staged = [v for v in fused.VARIANTS if v.staged]
    assert staged and all(fused.replace(v, staged=False) in fused.VARIANTS for v in staged)
    srcs = fused.sources()
    for v in staged:
        assert (v, "twin") not in srcs and (fused.replace(v, staged=False), "twin") in srcs
        assert f"{v.bm}, {v.bn}, {v.splits}, true>>;" in srcs[(v, "fused")]
        assert f"{v.bm}, {v.bn}, {v.splits}, false>>;" in srcs[(fused.replace(v, staged=False), "fused")]
    plain, staged0 = fused.VARIANTS[0], fused.replace(fused.VARIANTS[0], staged=True)
    evals = {(plain, "twin", "1_2_8"): [(20.0, 21.0)], (staged0, "fused", "1_2_8"): [(8.0, 21.0)]}
    assert fused.table(evals).splitlines()[2:] == [f"| {staged0.label} | 1_2_8 | 8.00 | 20.00 | 2.500x | 21.00 |"]


def test_pingpong_is_refused_with_its_reason(fused):
    v = fused.Variant(128, 128, 64, 1, 1, Schedule.PINGPONG, 2)
    with pytest.raises(ValueError, match="cooperative or basic only"):
        fused.fused_source(v)


@pytest.mark.nvcc
def test_every_fused_kernel_and_twin_compiles_for_sm90a(fused, capsys):
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


def test_the_table_pairs_fused_and_twin_per_shape(fused):
    a, b = fused.VARIANTS[:2]
    evals = {(a, "fused", "1_2_8"): [(10.0, 20.0), (12.0, 22.0)], (a, "twin", "1_2_8"): [(22.0, 21.0)],
             (b, "fused", "1_2_8"): [(5.0, 20.0)]}  # b has no twin timing on this shape: no row
    lines = fused.table(evals).splitlines()
    assert lines[2:] == [f"| {a.label} | 1_2_8 | 11.00 | 22.00 | 2.000x | 21.00 |"]
