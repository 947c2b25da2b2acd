"""What the evaluator tells the harness (CPU: the spec lines, no harness run)."""

from __future__ import annotations

from cudal2.sandbox.evaluator import EvalOptions, Evaluator
from cudal2.sandbox.types import Task


def test_spec_says_whether_the_source_spells_pdl() -> None:
    """The harness demands capturable calls of a source that spells programmatic dependent launch (it checks their
    graph for PDL between calls), so the spec must carry the static scan's answer, and `pdl 0` otherwise."""
    evaluator = Evaluator(EvalOptions(compile_only=True))
    assert "pdl 1" in evaluator._spec([Task(64, 64, 64)], pdl=True)
    plain = evaluator._spec([Task(64, 64, 64)])
    assert "pdl 0" in plain and "pdl 1" not in plain
