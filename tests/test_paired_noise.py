"""benchmarks/paired_noise.py's CPU parts: which shapes and kernels it times, and how it compares the estimators."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from cudal2.sandbox.store import ResultStore
from cudal2.sandbox.types import Mode, PairedSpeedup, ShapeResult, Status, Task, Timing

GPU = "NVIDIA H200 (sm_90a)"


@pytest.fixture(scope="module")
def paired_noise():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    return importlib.import_module("paired_noise")


def timing(us: float) -> Timing:
    return Timing(us, us, us, us, us, 0.0, 10)


def result(task: Task, cand_us: float, cublas_us: float, paired: float | None) -> ShapeResult:
    return ShapeResult(task, Status.OK, "", timings={"candidate": timing(cand_us), "cublas": timing(cublas_us)},
                       paired={"cublas": PairedSpeedup(paired, paired, paired, 10)} if paired else {})


def test_shapes_are_spread_over_the_range_in_mnk_order_ends_included(paired_noise):
    tasks = [Task(64, 64, 64 * i) for i in range(10, 0, -1)]
    picked = paired_noise.spread_evenly(tasks, 4)
    assert [t.k for t in picked] == [64, 256, 448, 640]
    assert paired_noise.spread_evenly(tasks[:3], 5) == sorted(tasks[:3], key=lambda t: t.k)


def test_each_shape_gets_its_fastest_kernel_and_shapes_without_one_are_skipped(paired_noise, tmp_path):
    a, b = Task(8192, 8192, 8192), Task(4096, 8192, 8192)
    with ResultStore(tmp_path / "s.sqlite") as store:
        for h, us in (("slow", 900.0), ("fast", 800.0)):
            store.put_source(h, f"// {h}")
            store.put_result(h, GPU, Mode.OFFLINE, result(a, us, 1000.0, None))
        assert paired_noise.chosen_kernels(store, [a, b], GPU) == [(a, "// fast")]


def test_the_summary_shows_which_estimator_varies_less_between_repeats(paired_noise):
    tasks = [Task(8192, 8192, 8192), Task(16384, 8192, 8192)]
    # ratio of medians jumps 10% between the repeats of each shape; the paired median moves 1%
    estimates = [paired_noise.estimate(result(t, 1000.0, cublas, paired), r)
                 for t in tasks for r, (cublas, paired) in enumerate([(1000.0, 1.00), (1100.0, 1.01)])]
    text = paired_noise.summary(estimates)
    rows = {line.split("|")[2].strip(): line.split("|") for line in text.splitlines() if line.startswith("| cublas")}
    assert float(rows["ratio of medians"][4]) == pytest.approx(9.53, abs=0.01)  # 100 ln(1.1)
    assert float(rows["paired median"][4]) == pytest.approx(1.00, abs=0.01)  # 100 ln(1.01)
    assert "geomean over 4 evaluations: 0.9582" in text  # sqrt(1.00/1.00 * 1.01/1.10)


def test_a_failed_evaluation_gives_no_estimate(paired_noise):
    failed = ShapeResult(Task(8192, 8192, 8192), Status.WRONG_ANSWER, "bad")
    assert paired_noise.estimate(failed, 0) is None


def test_bad_arguments_are_one_line_errors(paired_noise, capsys):
    assert paired_noise.main(["--repeats", "1"]) == 2
    assert paired_noise.main(["--db", "/nonexistent/store.sqlite", "--compile-only"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("paired_noise.py: ") for line in err)
