"""benchmarks/tiny_floor.py's candidates: the lean 64^3 kernels are right (CPU emulator), refuse every other shape, and
compile beside the small family's winner."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import pytest

from cudal2.sandbox.types import Acc
from tests.kernels import emulator


@pytest.fixture(scope="module")
def tiny_floor():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    return importlib.import_module("tiny_floor")


def _run(source: str, workdir: Path, *shapes):
    if shutil.which("g++") is None:
        pytest.skip("g++ not on PATH (the CPU emulator needs it)")
    exe = emulator.build(source, Acc.FP32, workdir)
    return [emulator.run(exe, *shape) for shape in shapes]


@pytest.mark.nvcc  # the emulator compiles against the CUDA headers
@pytest.mark.parametrize(("warps", "generality"), [(4, 0), (1, 0), (32, 0), (4, 1), (4, 2), (4, 3)])
def test_each_lean_kernel_is_exact_at_64_cubed_and_refuses_the_rest(tiny_floor, tmp_path, warps, generality):
    exact, long_k, misaligned = _run(tiny_floor.lean_source(warps, generality), tmp_path, (64, 64, 64),
                                     (64, 64, 128), (64, 64, 64, (1, 0, 0)))
    assert exact.rc == 0 and exact.rel_err <= 2e-3 and exact.nonfinite == 0 and exact.guard_bad == 0, exact
    assert long_k.rc != 0 and misaligned.rc != 0  # refused, not computed wrongly


@pytest.mark.nvcc
def test_a_lean_kernel_with_a_wrong_fragment_fails_the_emulator(tiny_floor, tmp_path):
    # The same kernel with the last K step's B fragment halves swapped: the check above must see it.
    wrong = tiny_floor.lean_source(4).replace("k3[2] = {b1.z, b1.w}", "k3[2] = {b1.w, b1.z}")
    assert wrong != tiny_floor.lean_source(4)
    (result,) = _run(wrong, tmp_path, (64, 64, 64))
    assert result.rc == 0 and result.rel_err > 2e-3, result


def test_the_winner_is_the_family_render_and_the_lean_kernels_follow(tiny_floor):
    # Each generality step changes the lean source only in its GENERALITY constant.
    labels = list(tiny_floor.sources())
    steps = len(tiny_floor.GENERALITY)
    assert labels[:2] == ["winner (small family)", "winner with exact"]
    assert len(labels) == 2 + len(tiny_floor.LEAN_WARPS) + steps
    assert labels[-1] == "lean 4x8 + runtime M, N, K + a K loop + bounds checks"
    winner, exact = (tiny_floor.sources()[label] for label in labels[:2])
    assert "small_hgemm_kernel" in winner and "LOAD_EXACT" not in winner and "LOAD_EXACT" in exact
    for step in range(1, steps + 1):
        lean = tiny_floor.lean_source(4, step)
        assert lean.replace(f"GENERALITY = {step};", "GENERALITY = 0;") == tiny_floor.lean_source(4), step


@pytest.mark.nvcc
def test_every_candidate_compiles_for_sm90a(tiny_floor, capsys):
    assert tiny_floor.main(["--compile-only"]) == 0
    assert "8 candidates: 8 compiled" in capsys.readouterr().out


def test_repeats_below_one_are_refused_in_one_line(tiny_floor, capsys):
    assert tiny_floor.main(["--repeats", "0"]) == 2
    assert capsys.readouterr().err.strip() == "tiny_floor.py: --repeats must be >= 1"


def test_the_table_pairs_each_candidate_with_the_cublas_of_its_own_evaluation(tiny_floor):
    # Two evaluations of each side on a drifting GPU: cuBLAS 2.0 then 2.2 us. The winner's median time is 1.5 us; its
    # speedup per evaluation 2.0 / 1.4 and 2.2 / 1.6, median 1.402.
    evals = [("winner", 1.4, 2.0), ("lean", 1.3, 2.2), ("lean", 1.2, 2.0), ("winner", 1.6, 2.2)]
    lines = tiny_floor.table(evals).splitlines()
    assert lines[2] == "| winner | 1.500 | 1.400 | 1.600 | 1.402x |"
    assert lines[3] == "| lean | 1.250 | 1.200 | 1.300 | 1.679x |"
    assert lines[4] == f"| {tiny_floor.CUBLAS} | 2.100 | 2.000 | 2.200 | |"
