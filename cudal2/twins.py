"""sm90 host_cache twins: the same kernel with its host-side setup kept between calls.

An sm90 kernel's entry point builds CUTLASS's parameters (TMA descriptors, tile scheduler) on every call: a few us
of host time (on the H200 grid, a twin saves a median 4.8 us per wallclock call; RESULTS, twenty-eighth session).
Its twin is the same config with `host_cache` on: identical device code, and an entry point that keeps those
parameters between calls with the same pointers and shape. Offline (CUDA-graph replay) the two time
the same, so the tuner never proposes twins; in server and wallclock mode, where a call's host code is timed, a
twin can be faster. `cudal2 remeasure --host-cache-twins` times them; `cudal2 report --host-cache-twins` reports
them in their kernels' place; benchmarks/twins_gain.py compares the two.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cudal2.kernels.family import BadConfig
from cudal2.kernels.sm90 import FAMILY as SM90
from cudal2.sandbox.evaluator import source_hash
from cudal2.tune_log import ConfigRecord


@dataclass(frozen=True)
class Twin:
    """A stored kernel's host_cache twin: its sm90 config with host_cache on (same device code)."""

    source_hash: str
    source: str
    record: ConfigRecord  # what the tuner's log records for it, so that reports and progress lines name it


def host_cache_twin(record: ConfigRecord | None) -> Twin | None:
    """The twin of the kernel the tuner generated from `record`; None for another family, a source the tuner did not
    generate (no record), a config that already has host_cache, or stored parameters that no longer build an sm90
    config (a config of an older version of the space: tune.stored_candidates skips those too)."""
    if record is None or record.family != SM90.name or record.params.get("host_cache"):
        return None
    try:
        cfg = replace(SM90.make(record.params), host_cache=True)
    except BadConfig:
        return None
    source = SM90.render(cfg)
    return Twin(source_hash(source), source, ConfigRecord.of(SM90, cfg))
