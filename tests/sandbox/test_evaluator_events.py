"""The harness's "task" event as a ShapeResult (evaluator.shape_from_event): timings, paired speedups, the gate."""

from __future__ import annotations

from cudal2.sandbox.evaluator import shape_from_event
from cudal2.sandbox.types import PairedSpeedup, Status, Task


def timing(median_us: float) -> dict:
    return {"median_us": median_us, "min_us": median_us * 0.9, "p10_us": median_us * 0.95, "p90_us": median_us * 1.2,
            "p99_us": median_us * 1.3, "spread": 0.25, "reps": 10}


def event(cand_us: float, **extra) -> dict:
    """A task event as harness.cu's task_line writes it."""
    return {"event": "task", "m": 8192, "n": 8192, "k": 8192, "acc": "fp32", "status": "ok", "reason": "",
            "max_rel_err": 1e-4, "graph": True, "checks": ["random"], "algo_hex": "-",
            "timings": {"candidate": timing(cand_us), "cublas": timing(1300.0)}, **extra}


def test_paired_speedups_are_read_next_to_the_ratio_of_medians() -> None:
    task = Task(8192, 8192, 8192)
    ev = event(1200.0, paired={"cublas": {"median": 1.02, "p10": 0.99, "p90": 1.04, "reps": 10}})
    res = shape_from_event(task, ev, ())
    assert res.status == Status.OK
    assert res.paired == {"cublas": PairedSpeedup(1.02, 0.99, 1.04, 10)}
    assert res.paired_speedup("cublas") == 1.02
    assert abs(res.speedup("cublas") - 1300.0 / 1200.0) < 1e-12  # the two estimators stay separate
    assert res.paired_speedup("cublaslt_autotuned") is None


def test_an_event_without_paired_speedups_has_none() -> None:
    """Baseline-only runs and harness builds from before paired speedups send no "paired" key (or an empty one)."""
    for ev in (event(1200.0), event(1200.0, paired={})):
        res = shape_from_event(Task(8192, 8192, 8192), ev, ())
        assert res.paired == {} and res.paired_speedup("cublas") is None


def test_the_roofline_gate_still_rejects_an_impossible_time_with_paired_speedups() -> None:
    ev = event(0.001, paired={"cublas": {"median": 1.3e6, "p10": 1.2e6, "p90": 1.4e6, "reps": 10}})
    res = shape_from_event(Task(8192, 8192, 8192), ev, ())
    assert res.status == Status.REJECTED_BEHAVIOUR and "faster than any GPU" in res.reason
