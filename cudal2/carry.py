"""`cudal2 carry`: keep a store's measurements of kernel-family sources across an evaluator version that cannot
change them.

    cudal2 carry --db STORE [--from VERSION]     (default: the newest version listed)

A new evaluator version hides every older result (the store keys results by version), so a store of tuned family
kernels would otherwise be measured again on the GPU. `types.FAMILY_RESULTS_CARRY` lists the older versions whose
results stand for family sources, each with the reason. A source is carried when

    the tune log records its config,
    the family of that name (in this cudal2) renders that config to the very same source (same hash), and
    that source passes today's static rules (what the new version may have added);

then its newest result per (shape, GPU, mode) and its compile records are copied to the current version, keeping
their original times. Anything else (policy or hand-written kernels, configs of an older family space) is left to be
measured again. Carrying twice copies nothing new.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from cudal2.kernels.family import BadConfig, KernelFamily
from cudal2.sandbox.evaluator import source_hash
from cudal2.sandbox.static_check import check_source
from cudal2.sandbox.store import ResultStore
from cudal2.sandbox.types import EVALUATOR_VERSION, FAMILY_RESULTS_CARRY
from cudal2.tune import FAMILIES
from cudal2.tune_log import ConfigRecord, TuneLog


class CarryError(Exception):
    """Bad input (no store, a version that cannot be carried); one line for the user."""


@dataclass(frozen=True)
class CarrySummary:
    from_version: str
    to_version: str
    sources: int  # family sources carried
    results: int  # result rows copied
    compiles: int  # compile records copied
    skipped: tuple[tuple[str, int], ...]  # (why not carried, how many sources), most frequent first

    def render(self) -> str:
        lines = [f"carried {self.results} results and {self.compiles} compile records of {self.sources} family "
                 f"sources from evaluator {self.from_version} to {self.to_version}"]
        lines += [f"  not carried: {n} source(s): {why}" for why, n in self.skipped]
        return "\n".join(lines)


def why_not_carried(h: str, record: ConfigRecord, families: dict[str, KernelFamily]) -> str | None:
    """None when source `h` is exactly what its recorded family config renders today and passes the static rules."""
    family = families.get(record.family)
    if family is None:
        return f"family {record.family!r} is not in this cudal2"
    try:
        source = family.render(family.make(record.params))
    except BadConfig:
        return "its config is outside the family's space"
    if source_hash(source) != h:
        return "its config renders to another source today"
    if check_source(source):
        return "fails today's static rules"
    return None


def run(db: Path, from_version: str | None = None) -> CarrySummary:
    if from_version is None:  # the newest listed: the version just before this one
        from_version = list(FAMILY_RESULTS_CARRY)[-1]
    if from_version not in FAMILY_RESULTS_CARRY:
        known = ", ".join(FAMILY_RESULTS_CARRY) or "none"
        raise CarryError(f"evaluator {from_version} results cannot be carried to {EVALUATOR_VERSION} "
                         f"(versions that can: {known})")
    if not db.is_file():
        raise CarryError(f"no result store at {db}")
    families = {f.name: f for f in FAMILIES}
    with ResultStore(db) as store, TuneLog(store) as log:
        keep, skipped = [], Counter()
        for h, record in log.family_sources():
            why = why_not_carried(h, record, families)
            if why is None:
                keep.append(h)
            else:
                skipped[why] += 1
        results = store.carry_forward(from_version, EVALUATOR_VERSION, keep)
        compiles = log.carry_compiles(from_version, EVALUATOR_VERSION, keep)
    return CarrySummary(from_version, EVALUATOR_VERSION, len(keep), results, compiles,
                        tuple(skipped.most_common()))
