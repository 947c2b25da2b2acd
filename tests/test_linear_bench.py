"""benchmarks/linear_bench.py on the CPU: the fit of the bias add's cost that cudal2.ops' constants come from."""

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
linear_bench = importlib.import_module("linear_bench")


def test_fit_recovers_launch_and_bandwidth() -> None:
    rows = [linear_bench.BiasRow(m, n, 896, 0.0, 0.0, 0.0, 1.5 + 4.0 * m * n / 2.0e6)
            for m in (1, 16, 512, 8192) for n in (128, 3584)]
    launch, bw = linear_bench.fit(rows)
    assert launch == pytest.approx(1.5) and bw == pytest.approx(2.0e6)


def test_fit_of_a_flat_penalty_has_no_bandwidth_term() -> None:
    rows = [linear_bench.BiasRow(m, 128, 896, 0.0, 0.0, 0.0, 2.0) for m in (1, 16, 128)]
    assert linear_bench.fit(rows) == (pytest.approx(2.0), float("inf"))
