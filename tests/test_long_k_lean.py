"""benchmarks/long_k_lean.py's lean kernels: right on the CPU emulator (pipeline wrap, uneven and empty K runs, cluster
and workspace sums, repeated calls bit-identical), refuse what they do not handle, compile beside the H200 winners
they are timed against, and are correct on a GPU."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import pytest

from cudal2.sandbox.compiler import cutlass_include_dir
from cudal2.sandbox.evaluator import EvalOptions, Evaluator
from cudal2.sandbox.types import Acc, Status, Task
from tests.kernels import emulator


@pytest.fixture(scope="module")
def lean():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    return importlib.import_module("long_k_lean")


def _emulate(source: str, workdir: Path, *shapes, calls: int = 2):
    if shutil.which("g++") is None:
        pytest.skip("g++ not on PATH (the CPU emulator needs it)")
    exe = emulator.build(source, Acc.FP32, workdir)
    return [emulator.run(exe, *shape, calls=calls) for shape in shapes]


def _exact(r) -> bool:
    return r.rc == 0 and r.rel_err <= 2e-3 and r.nonfinite == 0 and r.guard_bad == 0 and r.mismatch == 0


@pytest.mark.nvcc  # the emulator compiles against the CUDA headers
@pytest.mark.parametrize(("cl", "groups", "stages", "shapes"), [
    (4, 2, 3, [(64, 64, 512), (128, 64, 1024)]),  # one chunk per CTA; two tiles along M
    (2, 1, 3, [(64, 128, 640)]),  # 5 chunks a CTA through 3 stages: the ring wraps; two tiles along N
    (16, 1, 2, [(64, 64, 64 * 17)]),  # 17 chunks over 16 CTAs: one CTA takes two
    (4, 4, 2, [(64, 64, 64 * 5)]),  # 16 CTAs, 5 chunks: most CTAs run no chunk and add zeros
])
def test_each_variant_is_right_and_repeatable_on_the_emulator(lean, tmp_path, cl, groups, stages, shapes):
    for shape, r in zip(shapes, _emulate(lean.lean_source(cl, groups, stages), tmp_path, *shapes), strict=True):
        assert _exact(r), (shape, r)
        assert r.workspace_bytes == (0 if groups == 1 else shape[0] * shape[1] * groups * 4), (shape, r)
        assert r.bank_conflicts == 0, (shape, r)  # the 144-byte row pitch keeps ldmatrix's phases apart


@pytest.mark.nvcc
def test_shapes_off_the_64_grid_and_misaligned_pointers_are_refused(lean, tmp_path):
    results = _emulate(lean.lean_source(4, 2, 3), tmp_path, (64, 64, 96), (96, 64, 512), (64, 64, 512, (1, 0, 0)),
                       calls=1)
    assert all(r.rc != 0 for r in results), results  # refused, not computed wrongly


@pytest.mark.nvcc
def test_a_cluster_sum_in_the_wrong_slot_fails_the_emulator(lean, tmp_path):
    # Every push into the owner's slot 0 instead of the pusher's: the other slots keep the emulator's NaN poison.
    good = lean.lean_source(4, 1, 3)
    wrong = good.replace("inbox + (int(rank) * RPR + row % RPR) * BN + col", "inbox + (row % RPR) * BN + col")
    assert wrong != good
    (r,) = _emulate(wrong, tmp_path, (64, 64, 512), calls=1)
    assert r.rc == 0 and not _exact(r) and r.nonfinite > 0, r


def test_candidates_time_every_variant_on_every_shape_and_each_winner_on_its_own(lean):
    shapes = [(64, 64, 4096), (64, 128, 8192)]
    cands = lean.candidates(shapes)
    variants = [label for label in cands if not label.startswith(lean.WINNER)]
    assert len(variants) == len(lean.VARIANTS)
    assert all([(t.m, t.n, t.k) for t in cands[v][1]] == shapes for v in variants)
    assert [(t.m, t.n, t.k) for t in cands[f"{lean.WINNER} 64x128x8192"][1]] == [(64, 128, 8192)]
    assert "small_hgemm_kernel" in cands[f"{lean.WINNER} 64x64x4096"][0]  # the family's own render


@pytest.mark.nvcc
def test_every_candidate_compiles_for_sm90a(lean, capsys):
    if cutlass_include_dir() is None:
        pytest.skip("no CUTLASS/CuTe headers (pip install nvidia-cutlass)")
    assert lean.main(["--compile-only", "--shapes", "64_64_4096", "64_128_8192"]) == 0
    n = len(lean.VARIANTS) + 2
    assert f"{n} candidates: {n} compiled" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "why"), [(["--shapes", "64_64"], "--shapes: '64_64' is not one of"),
                                           (["--shapes", "a_b_c"], "--shapes: 'a_b_c' is not one of"),
                                           (["--shapes", "64_64_64"], "--shapes: '64_64_64' is not one of"),
                                           (["--repeats", "0"], "--repeats must be >= 1")])
def test_bad_arguments_are_refused_in_one_line(lean, capsys, argv, why):
    assert lean.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"long_k_lean.py: {why}") and "\n" not in err


def test_the_table_sets_each_candidate_against_its_shapes_winner(lean):
    win = f"{lean.WINNER} 64x64x4096"
    evals = [(win, (64, 64, 4096), 4.0, 6.0), ("lean a", (64, 64, 4096), 2.0, 6.2), (win, (64, 64, 4096), 4.4, 6.4),
             ("lean a", (64, 64, 4096), 2.2, 6.0), ("lean a", (64, 64, 8192), 3.0, 7.0)]  # no winner timed at 8192
    lines = lean.table(evals).splitlines()
    assert lines[2] == "| 64x64x4096 | lean a | 2.10 | 2.914x | 2.000x |"  # speedups 3.1, 2.727: median 2.914
    assert lines[3] == f"| 64x64x4096 | {lean.WINNER} | 4.20 | 1.477x | 1.000x |"
    assert lines[4] == f"| 64x64x4096 | {lean.CUBLAS} | 6.10 | | |"  # 6.0, 6.2, 6.4, 6.0
    assert lines[5] == "| 64x64x8192 | lean a | 3.00 | 2.333x | - |"


@pytest.mark.gpu
def test_every_variant_is_correct_on_the_gpu(lean, tmp_path):
    ev = Evaluator(EvalOptions(target_ms=5, baselines=False, cache_dir=tmp_path / "build"))  # correctness only
    for variant in lean.VARIANTS:
        res = ev.evaluate(lean.lean_source(*variant), [Task(64, 64, 4096), Task(128, 64, 8192), Task(64, 128, 1088)])
        for s in res.shapes:
            assert s.status == Status.OK, (variant, s.task.mnk, s.status.value, s.reason)
