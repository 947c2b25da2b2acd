"""The evaluator's GPU stage against its result store (CPU: the harness run is replaced by a counter that returns
`ok`, so what is served from the store and what is measured again can be seen without a GPU)."""

from __future__ import annotations

import pytest

from cudal2.kernels.sm90 import FAMILY as SM90
from cudal2.sandbox import evaluator as evaluator_module
from cudal2.sandbox.evaluator import EvalOptions, Evaluator, Prepared, source_hash
from cudal2.sandbox.store import ResultStore
from cudal2.sandbox.types import CompileResult, Mode, ShapeResult, Status, Task, Timing
from tests.tune_fakes import FAKE_GPU

SOURCE = "// any candidate: nothing here is compiled or run\n"
TASK = Task(64, 1024, 256)


class CountingHarness:
    """Stands in for the harness run: every task it is given comes back ok, and it remembers which it was given."""

    def __init__(self) -> None:
        self.runs: list[list[Task]] = []

    def __call__(self, lib: str, tasks: list[Task], pdl: bool = False) -> list[ShapeResult]:
        self.runs.append(list(tasks))
        return [ShapeResult(t, Status.OK, "", 1e-5, {"candidate": Timing(3.0, 3.0, 3.0, 3.0, 3.0, 0.0, 10)})
                for t in tasks]


@pytest.fixture
def on_fake_gpu(monkeypatch):
    monkeypatch.setattr(evaluator_module, "detect_gpu", lambda index=0: FAKE_GPU)


def _evaluator(store: ResultStore, **options) -> tuple[Evaluator, CountingHarness]:
    ev = Evaluator(EvalOptions(**options), store)
    harness = CountingHarness()
    ev._run_harness_tasks = harness  # the one stage replaced: no GPU here
    return ev, harness


def test_a_stored_run_failure_is_served_unless_retry_names_its_status(tmp_path, on_fake_gpu):
    built = CompileResult(Status.COMPILED, "", "key", "sm_90a", str(tmp_path / "never-loaded.so"), 0.0, True, "")
    prepared = Prepared(SOURCE, source_hash(SOURCE), (TASK,), built, None)
    stale = ShapeResult(TASK, Status.REJECTED_BEHAVIOUR, "GPU work still running 0.60 ms after the call's stream "
                        "finished")
    with ResultStore(tmp_path / "r.sqlite") as store:
        store.put_result(prepared.source_hash, FAKE_GPU.label, Mode.OFFLINE, stale)
        plain, harness = _evaluator(store)
        assert plain.run(prepared).shapes == (stale,) and harness.runs == []  # served, nothing run
        other, harness = _evaluator(store, retry=frozenset({Status.WRONG_ANSWER}))
        assert other.run(prepared).shapes == (stale,) and harness.runs == []
        retried, harness = _evaluator(store, retry=frozenset({Status.REJECTED_BEHAVIOUR}))
        fresh = retried.run(prepared).shapes[0]
        assert fresh.status == Status.OK and harness.runs == [[TASK]]
        assert store.get_result(prepared.source_hash, TASK, FAKE_GPU.label, Mode.OFFLINE) == fresh
        again, harness = _evaluator(store, retry=frozenset({Status.REJECTED_BEHAVIOUR}))
        assert again.run(prepared).shapes == (fresh,) and harness.runs == []  # an ok result is never retried
        measured, harness = _evaluator(store, fresh=True)
        measured.run(prepared)
        assert harness.runs == [[TASK]]  # --fresh measures whatever is stored


def test_a_cutlass_source_without_the_headers_is_an_internal_error_that_is_not_stored(tmp_path, monkeypatch):
    """Without the pinned CUTLASS/CuTe headers a CuTe kernel cannot compile: the machine's fault, so internal_error,
    never stored (a stored compile_error would bar the kernel from every later run, on machines with the headers)."""
    monkeypatch.setenv("CUDAL2_CUTLASS_INCLUDE", "")  # '' disables the headers (compiler.cutlass_include_dir)
    source, task = SM90.render(SM90.default()), Task(256, 256, 256)
    with ResultStore(tmp_path / "r.sqlite") as store:
        res = Evaluator(EvalOptions(arch="sm_90a"), store).evaluate(source, [task])
        assert [(s.status, s.reason) for s in res.shapes] == [(Status.INTERNAL_ERROR,
                                                               evaluator_module.NO_CUTLASS_HEADERS)]
        assert store.counts_by_status() == {}  # nothing stored
