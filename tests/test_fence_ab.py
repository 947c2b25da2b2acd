"""benchmarks/fence_ab.py's CPU parts: the acq_rel twin of a rendered kernel, which configs it takes, the maths."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from cudal2.kernels.cuda_parts import FENCE_GPU_ACQ_REL, FENCE_GPU_SC
from cudal2.sandbox.types import Task
from cudal2.tune import TuneInputError

GRID_K = "small-bm16-bn16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32-grid_k8"


@pytest.fixture(scope="module")
def fence_ab():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    return importlib.import_module("fence_ab")


def test_the_twin_differs_from_the_render_only_in_the_fence(fence_ab):
    (pair,) = fence_ab.pairs_for([GRID_K], [Task(64, 64, 4096)])
    sc, acq_rel = pair.sources["sc"], pair.sources["acq_rel"]
    assert FENCE_GPU_SC in sc and "fence.acq_rel.gpu" not in sc
    assert FENCE_GPU_ACQ_REL in acq_rel and FENCE_GPU_SC not in acq_rel
    assert acq_rel.replace(FENCE_GPU_ACQ_REL, FENCE_GPU_SC) == sc


def test_a_config_without_a_cut_is_refused_by_name(fence_ab):
    plain = "small-bm16-bn16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32"
    with pytest.raises(fence_ab.NoFence, match=plain):
        fence_ab.pairs_for([plain], [Task(64, 64, 4096)])
    with pytest.raises(TuneInputError):
        fence_ab.pairs_for(["small-bm17"], [Task(64, 64, 4096)])


def test_each_twin_is_summarised_by_its_median_over_repeats(fence_ab):
    T = fence_ab.Timed
    timed = [T("c", "64_64_64", "sc", r, us) for r, us in enumerate((4.0, 4.4, 9.0))]
    timed += [T("c", "64_64_64", "acq_rel", r, us) for r, us in enumerate((4.0, 3.9, 4.1))]
    timed += [T("c", "64_64_128", "sc", 0, 2.0)]  # no acq_rel twin timed: left out
    assert fence_ab.ratios(timed) == {("c", "64_64_64"): (4.4, 4.0, pytest.approx(1.1))}
    assert "all 1 (config, shape) pairs: geomean sc / acq_rel 1.100" in fence_ab.summary(timed)


def test_bad_arguments_get_one_line(fence_ab, capsys):
    assert fence_ab.main(["--configs", "nonsense", "--compile-only"]) == 2
    assert fence_ab.main(["--repeats", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("fence_ab.py: ") for line in err)


def test_both_twins_compile_for_sm90a(fence_ab, capsys):
    assert fence_ab.main(["--configs", GRID_K, "--mnk", "64_64_4096", "--compile-only"]) == 0
    assert "2 twins: 2 compiled" in capsys.readouterr().out
