"""Every kernel of every corpus through the evaluator's compile-only path (static rules, nvcc, link check), on
the CPU. Attacks and faults decided at compile time get their final status here; everything else (legit kernels
and runtime attacks alike) must compile and pass the static layers, since a false rejection is a bug too."""

from __future__ import annotations

import pytest

from cudal2.sandbox.evaluator import EvalOptions, Evaluator
from cudal2.sandbox.types import Status, Task
from tests.sandbox.corpus import corpus, cpu_expected_status, ids

ALL = corpus("seed", "legit", "adversarial", "faults")


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("build")


@pytest.mark.nvcc
@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_compile_time_status(build_dir, path):
    want = cpu_expected_status(path)
    # A short limit where a compile timeout is the expected outcome; CuTe kernels need ~30 s on 2 cores.
    limit = 10 if want == Status.TIMEOUT else 180
    evaluator = Evaluator(EvalOptions(compile_only=True, compile_timeout_s=limit, cache_dir=build_dir))
    res = evaluator.evaluate(path.read_text(), [Task(256, 256, 1024)])
    got = res.shapes[0]
    assert got.status == want, f"{path.name}: want {want.value}, got {got.status.value}: {got.reason}"
    if want != Status.COMPILED:
        assert got.reason


def test_every_bad_kernel_declares_its_expected_status():
    for path in corpus("adversarial", "faults"):
        assert cpu_expected_status(path)  # raises when the `// expect:` header is missing
