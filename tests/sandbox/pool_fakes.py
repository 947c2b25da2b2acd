"""A stand-in for the GPU stage in CPU tests of the pool (no GPU on CI). The compile stage stays real (nvcc, static
rules, link check); only what would happen on the GPU is simulated, driven by markers in the candidate source:

    // fake: sleep 1.5     the GPU stage takes 1.5 s
    // fake: hang          the GPU stage never returns (the pool's job deadline must catch it)
    // fake: die           the worker process exits mid-job (the pool must replace it and retry)

Every run appends one line to $CUDAL2_FAKE_LOG (when set), so tests can count how often a job really ran.
"""

from __future__ import annotations

import os
import re
import time

from cudal2.policy.warm import COMPACT_KERNEL
from cudal2.sandbox.types import EVALUATOR_VERSION, EvalResult, ShapeResult, Status

_MARK = re.compile(r"//\s*fake:\s*(\w+)\s*([\d.]*)")


class FakeGpuRunner:
    def __init__(self, options, gpu_index: int, db_path):
        self.gpu_index = gpu_index

    def run(self, prepared) -> EvalResult:
        if prepared.final is not None:
            return prepared.final
        log = os.environ.get("CUDAL2_FAKE_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{prepared.source_hash} {os.getpid()}\n")
        for action, arg in _MARK.findall(prepared.source):
            if action == "sleep":
                time.sleep(float(arg))
            elif action == "hang":
                time.sleep(3600)
            elif action == "die":
                os._exit(17)
        shapes = tuple(ShapeResult(t, Status.OK, f"simulated on GPU slot {self.gpu_index}") for t in prepared.tasks)
        return EvalResult(prepared.source_hash, f"fake gpu {self.gpu_index}", EVALUATOR_VERSION, prepared.compile,
                          shapes)


def fake_runner(options, gpu_index: int, db_path) -> FakeGpuRunner:
    return FakeGpuRunner(options, gpu_index, db_path)


def kernel(variant: int | str, marker: str = "") -> str:
    """A small valid candidate; `variant` makes distinct sources, `marker` adds a `// fake:` directive."""
    return f"// variant {variant}\n{marker}\n{COMPACT_KERNEL}"
