"""benchmarks/timing_runs.py: sort_prepared (which prepared sources the GPU may time, and the lines that say why the
others may not: fence_ab.py, paired_noise.py and tiny_floor.py print them), and rotated_runs' order of evaluations."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from cudal2.sandbox.evaluator import EvalOptions, Evaluator
from cudal2.sandbox.types import Acc, ShapeResult, Status, Task

ROOT = Path(__file__).resolve().parents[1]
TASKS = (Task(64, 64, 64, Acc.FP32),)


@pytest.fixture(scope="module")
def timing_runs():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module("timing_runs")


@pytest.fixture(scope="module")
def seed() -> str:
    return sorted((ROOT / "kernels" / "seed").glob("*.cu"))[0].read_text()


def _prepared(timing_runs, seed: str, compile_only: bool, tmp_path: Path):
    evaluator = Evaluator(EvalOptions(fresh=True, compile_only=compile_only, arch="sm_90a", cache_dir=tmp_path))
    forked = seed + "\nstatic int x = (fork(), 0);\n"  # a static rule stops it before nvcc
    return timing_runs.prepare_all(evaluator, {("good", 1): (seed, TASKS), ("forks", 2): (forked, TASKS)})


@pytest.mark.nvcc
def test_compile_only_counts_the_compiled_and_names_the_rest(timing_runs, seed, tmp_path, capsys):
    ready = timing_runs.sort_prepared(_prepared(timing_runs, seed, True, tmp_path), what="sources",
                                      compile_only=True, name=lambda key: f"{key[0]}#{key[1]}")
    assert ready.runnable == {}
    assert list(ready.stopped) == [("forks", 2)] and ready.stopped["forks", 2].startswith("static_reject: ")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "2 sources: 1 compiled"
    assert out[1].startswith("forks#2: static_reject: ") and len(out) == 2


@pytest.mark.nvcc
def test_a_source_decided_on_the_cpu_is_not_runnable_and_says_why(timing_runs, seed, tmp_path, capsys):
    # Without --compile-only a compiled source goes on to the GPU; here there is none, so prepare decides it too.
    prepared = _prepared(timing_runs, seed, False, tmp_path)
    ready = timing_runs.sort_prepared(prepared, what="sources", compile_only=False)
    out = capsys.readouterr().out.splitlines()
    assert ready.stopped["forks", 2].startswith("static_reject: ")
    assert "not runnable: ('forks', 2): static_reject: " in "\n".join(out)
    runnable_on_this_machine = prepared["good", 1].final is None
    assert (("good", 1) in ready.runnable) == runnable_on_this_machine
    assert (("good", 1) in ready.stopped) != runnable_on_this_machine
    assert len(out) == len(ready.stopped)


class _Recorder:
    """Stands in for the evaluator's GPU step: answers each prepared source (here its name) with one ok result per task
    of its tasks, and records the order it was asked in."""

    def __init__(self) -> None:
        self.order: list[str] = []

    def run(self, prepared):
        name, tasks = prepared
        self.order.append(name)
        return type("Result", (), {"shapes": [ShapeResult(t, Status.OK, "") for t in tasks]})()


def test_rotated_runs_rotate_the_first_source_each_repeat_and_yield_every_shape(timing_runs):
    two = (Task(64, 64, 64), Task(64, 64, 128))
    runnable = {"a": ("a", two), "b": ("b", TASKS), "c": ("c", TASKS)}
    ev = _Recorder()
    got = [(key, repeat, (shape.task.m, shape.task.n, shape.task.k))
           for key, repeat, shape in timing_runs.rotated_runs(ev, runnable, repeats=4)]
    assert ev.order == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert got[:4] == [("a", 0, (64, 64, 64)), ("a", 0, (64, 64, 128)), ("b", 0, (64, 64, 64)), ("c", 0, (64, 64, 64))]
    assert len(got) == 4 * 4 and {r for _, r, _ in got} == {0, 1, 2, 3}
