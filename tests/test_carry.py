"""`cudal2 carry`: family sources' results move to the current evaluator version, nothing else does."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cudal2 import carry
from cudal2.cli import main
from cudal2.kernels.family import config_name, config_params
from cudal2.kernels.small import SmallFamily
from cudal2.sandbox.evaluator import source_hash
from cudal2.sandbox.store import ResultStore
from cudal2.sandbox.types import EVALUATOR_VERSION, FAMILY_RESULTS_CARRY, Acc, Mode, ShapeResult, Status, Task
from cudal2.tune_log import CompileRecord, ConfigRecord, TuneLog

OLD = list(FAMILY_RESULTS_CARRY)[-1]  # the default --from
GPU = "NVIDIA H200 (sm_90a)"
TASK = Task(64, 64, 64, Acc.FP32)
FAMILY = SmallFamily()


def _result(status: Status = Status.OK) -> ShapeResult:
    return ShapeResult(TASK, status, "" if status is Status.OK else "wrong", max_rel_err=1e-4)


def _record(cfg) -> ConfigRecord:
    return ConfigRecord(FAMILY.name, config_name(FAMILY, cfg), json.loads(json.dumps(config_params(cfg))))


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """An old-version store: a family source (with a compile record), a source whose recorded config renders to
    something else today, one of an unknown family, and a source with no config at all (hand-written)."""
    path = tmp_path / "store.sqlite"
    cfg = FAMILY.default()
    other = dataclasses.replace(cfg, k_unroll=2)
    with ResultStore(path) as store, TuneLog(store) as log:
        family_hash = source_hash(FAMILY.render(cfg))
        for h, record in ((family_hash, _record(cfg)), ("f" * 64, _record(other)),
                          ("e" * 64, ConfigRecord("retired_family", "x", {}))):
            log.put_config(h, record)
            store.put_result(h, GPU, Mode.OFFLINE, _result(), evaluator_version=OLD)
        store.put_result("d" * 64, GPU, Mode.OFFLINE, _result(), evaluator_version=OLD)
        log._conn.execute(
            "INSERT INTO tune_compiles (source_hash, arch, evaluator_version, status, reason, registers, spill_bytes,"
            " seconds, created) VALUES (?, 'sm_90a', ?, 'compiled', '', 40, 0, 12.5, 1.0)", (family_hash, OLD))
    return path


def test_only_sources_the_family_renders_today_are_carried(db: Path) -> None:
    summary = carry.run(db)
    assert (summary.from_version, summary.to_version) == (OLD, EVALUATOR_VERSION)
    assert (summary.sources, summary.results, summary.compiles) == (1, 1, 1)
    assert dict(summary.skipped) == {"its config renders to another source today": 1,
                                     "family 'retired_family' is not in this cudal2": 1}
    family_hash = source_hash(FAMILY.render(FAMILY.default()))
    with ResultStore(db) as store, TuneLog(store) as log:
        assert store.get_result(family_hash, TASK, GPU, Mode.OFFLINE).status is Status.OK
        for h in ("f" * 64, "e" * 64, "d" * 64):
            assert store.get_result(h, TASK, GPU, Mode.OFFLINE) is None
            assert store.get_result(h, TASK, GPU, Mode.OFFLINE, evaluator_version=OLD) is not None
        assert log.compile_of(family_hash, "sm_90a") == CompileRecord(Status.COMPILED, "", 40, 0, 12.5)
    assert carry.run(db).results == 0  # a second carry copies nothing


def test_a_family_source_that_fails_todays_static_rules_stays_behind() -> None:
    """The rules of the new version have the last word even over a family's own output (a stand-in family whose
    render synchronises the device)."""

    @dataclasses.dataclass
    class SyncFamily:
        name: str = "sync_family"

        def make(self, params):
            return params

        def render(self, cfg):
            return FAMILY.render(FAMILY.default()).replace(
                "extern \"C\"", "static int sync = (cudaDeviceSynchronize(), 0);\nextern \"C\"", 1)

    fam = SyncFamily()
    h = source_hash(fam.render({}))
    assert carry.why_not_carried(h, ConfigRecord(fam.name, "x", {}), {fam.name: fam}) == "fails today's static rules"
    good = source_hash(FAMILY.render(FAMILY.default()))
    assert carry.why_not_carried(good, _record(FAMILY.default()), {FAMILY.name: FAMILY}) is None


def test_cli_carries_and_reports_bad_input_in_one_line(db: Path, tmp_path: Path, capsys) -> None:
    assert main(["carry", "--db", str(db)]) == 0
    assert f"carried 1 results and 1 compile records of 1 family sources from evaluator {OLD}" in capsys.readouterr().out
    assert main(["carry", "--db", str(tmp_path / "missing.sqlite")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no result store at" in err
    assert not (tmp_path / "missing.sqlite").exists()  # nothing created
    (tmp_path / "junk.sqlite").write_text("not a store")
    assert main(["carry", "--db", str(tmp_path / "junk.sqlite")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert (tmp_path / "junk.sqlite").read_text() == "not a store"
    assert main(["carry", "--db", str(db), "--from", "0.0.0"]) == 2
