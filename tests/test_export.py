"""`cudal2 export`: what qualifies from a result store, the library layout, the manifest format and the CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cudal2.export import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    ExportError,
    ExportRequest,
    Manifest,
    ManifestError,
    plan_export,
    render,
    resolve_gpu,
    sha256_text,
    write_library,
)
from cudal2.kernels.sm90 import FAMILY as SM90
from cudal2.sandbox.store import ResultStore
from cudal2.sandbox.types import Acc, Mode, ShapeResult, Status, Task
from cudal2.tune_log import ConfigRecord, TuneLog
from cudal2.twins import host_cache_twin
from tests.library_fixtures import GPU, NO_HARDENING, SM90_CFG, entry, kernel_source, manifest, ok_result
from tests.test_cli import run

OTHER_GPU = "NVIDIA A100-SXM4-80GB (sm_80)"
FAST, SLOW, MARGINAL, UNCHECKED, NO_SOURCE, FP16 = (kernel_source(t) for t in
                                                    ("fast", "slow", "marginal", "unchecked", "nosource", "fp16"))
T128, T256, T512, T1K, T2K, T4K = (Task(s, s, s) for s in (128, 256, 512, 1024, 2048, 4096))


def put(store: ResultStore, source: str, result: ShapeResult, gpu: str = GPU, *, stored: bool = True, **kw) -> None:
    if stored:
        store.put_source(sha256_text(source), source)
    store.put_result(sha256_text(source), gpu, Mode.OFFLINE, result, **kw)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A store with one shape per way of (not) qualifying; see the comments."""
    path = tmp_path / "results.sqlite"
    with ResultStore(path) as s:
        put(s, FAST, ok_result(T128, 5.0, 10.0))  # T128: two ok sources, the faster one wins
        put(s, SLOW, ok_result(T128, 8.0, 10.0))
        put(s, MARGINAL, ok_result(T256, 10.0, 10.1))  # T256: 1.01x, under the default --min-speedup 1.02
        put(s, FAST, ok_result(T512, 20.0, 30.0))  # T512: newest row of the only source is a wrong answer
        put(s, FAST, ShapeResult(T512, Status.WRONG_ANSWER, "max rel err 0.3"))
        put(s, UNCHECKED, ok_result(T1K, 50.0, 100.0, checks=NO_HARDENING))  # T1K: hardening checks off
        put(s, NO_SOURCE, ok_result(T2K, 50.0, 100.0), stored=False)  # T2K: result without its source text
        put(s, FAST, ShapeResult(T4K, Status.COMPILED, "compiled; not run"))  # T4K: compile-only, never ok
        put(s, FAST, ok_result(Task(64, 64, 64), 1.0, 9.0), gpu=OTHER_GPU)  # another GPU
        put(s, FAST, ok_result(Task(96, 96, 96), 1.0, 9.0), evaluator_version="0.0.1")  # an older evaluator
        put(s, FP16, ok_result(Task(128, 128, 128, Acc.FP16), 1.0, 9.0))  # another accumulation
    return path


def plan(db: Path, **kw):
    with ResultStore(db) as s:
        return plan_export(s, ExportRequest(GPU, **kw))


def test_only_verified_fast_kernels_are_exported(db: Path) -> None:
    p = plan(db)
    assert [(e.task.mnk, e.source_hash) for e in p.manifest.kernels] == [("128_128_128", sha256_text(FAST))]
    skipped = {s.task.mnk: s.reason for s in p.skipped}
    assert set(skipped) == {"256_256_256", "512_512_512", "1024_1024_1024", "2048_2048_2048"}  # T4K: never ok
    assert "1.010x" in skipped["256_256_256"] and "--min-speedup 1.02" in skipped["256_256_256"]
    assert "newest result here is ok" in skipped["512_512_512"]
    assert "hardening checks" in skipped["1024_1024_1024"]
    assert "not in the store" in skipped["2048_2048_2048"]


def test_min_speedup_zero_exports_every_verified_kernel(db: Path) -> None:
    p = plan(db, min_speedup=0.0)
    assert [e.task.mnk for e in p.manifest.kernels] == ["128_128_128", "256_256_256"]
    with pytest.raises(ExportError, match="finite number >= 0"):
        plan(db, min_speedup=-1.0)


def test_entry_records_the_measurement(db: Path) -> None:
    e = plan(db).manifest.kernel(128, 128, 128)
    assert (e.file, e.gpu, e.mode, e.acc, e.median_us) == ("128_128_128.cu", GPU, Mode.OFFLINE, Acc.FP32, 5.0)
    assert e.baseline_us == {"cublas": 10.0, "cublaslt_heuristic": 9.5, "cublaslt_autotuned": 9.5}
    assert e.speedups == pytest.approx({"cublas": 2.0, "cublaslt_heuristic": 1.9, "cublaslt_autotuned": 1.9})
    assert e.measured.endswith("Z") and e.measured[:2] == "20"


def test_write_library_layout_and_round_trip(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "lib"
    p = plan(db, min_speedup=0.0)
    assert write_library(out, p) == out / MANIFEST_NAME
    assert sorted(f.name for f in out.iterdir()) == ["128_128_128.cu", "256_256_256.cu", MANIFEST_NAME]
    assert (out / "128_128_128.cu").read_text() == FAST
    loaded = Manifest.load(out)
    assert loaded == p.manifest and loaded.format_version == FORMAT_VERSION
    assert json.loads((out / MANIFEST_NAME).read_text())["format_version"] == FORMAT_VERSION


def test_reexport_removes_stale_kernels_only(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "lib"
    write_library(out, plan(db, min_speedup=0.0))
    (out / "notes.txt").write_text("mine")
    write_library(out, plan(db))  # 256_256_256 no longer qualifies
    assert sorted(f.name for f in out.iterdir()) == ["128_128_128.cu", MANIFEST_NAME, "notes.txt"]


def test_refuses_a_foreign_non_empty_directory(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "photos"
    out.mkdir()
    (out / "cat.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(ExportError, match="not empty and not a readable cudal2 kernel library"):
        write_library(out, plan(db))
    assert [f.name for f in out.iterdir()] == ["cat.jpg"]


@pytest.mark.parametrize("wanted, machine, expected", [
    ("h200", None, GPU), (GPU, None, GPU), (None, GPU, GPU), (None, None, ExportError), ("nvidia", None, ExportError),
    ("v100", None, ExportError), (None, "NVIDIA V100 (sm_80)", ExportError),
])
def test_resolve_gpu(wanted, machine, expected) -> None:
    stored = [OTHER_GPU, GPU]
    if expected is ExportError:
        with pytest.raises(ExportError):
            resolve_gpu(stored, wanted, machine)
    else:
        assert resolve_gpu(stored, wanted, machine) == expected
    assert resolve_gpu([GPU], None, None) == GPU


# -- the manifest format ---------------------------------------------------------------------------------------


def _valid() -> dict:
    return manifest(entry(128, 128, 128, 5.0, 10.0), entry(256, 256, 256, 9.0, 10.0)).to_json()


def _edit(path: tuple, value) -> dict:
    d = _valid()
    target = d
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return d


_DELETE = object()


@pytest.mark.parametrize("doc, message", [
    (_edit(("format_version",), 2), "format_version 2 is not supported"),
    (_edit(("gpu",), _DELETE), "missing field 'gpu'"),
    (_edit(("kernels",), {}), "kernels: expected a list"),
    (_edit(("kernels", 0, "m"), "128"), "kernels[0].m: expected an integer"),
    (_edit(("kernels", 0, "m"), 0), "kernels[0].m: expected an integer"),
    (_edit(("kernels", 1, "median_us"), -1), "kernels[1].median_us: expected a positive number"),
    (_edit(("kernels", 1, "file"), "../../etc/passwd.cu"), "kernels[1].file"),
    (_edit(("kernels", 1, "source_hash"), "abc"), "kernels[1].source_hash"),
    (_edit(("kernels", 1, "baseline_us"), {"cublaslt_heuristic": 9.0}), "no 'cublas' time"),
    (_edit(("kernels", 1, "gpu"), OTHER_GPU), "kernels[1].gpu"),
    (_edit(("kernels", 1, "file"), "128_128_128.cu"), "listed twice"),
    (_edit(("acc",), "bf16"), "acc: expected fp32 or fp16"),
    ([1, 2], "expected a JSON object"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_malformed_manifest_is_one_line_error(tmp_path: Path, doc, message) -> None:
    path = tmp_path / MANIFEST_NAME
    path.write_text(json.dumps(doc))
    with pytest.raises(ManifestError) as info:
        Manifest.load(tmp_path)
    assert message in str(info.value) and str(path) in str(info.value) and "\n" not in str(info.value)


def test_unreadable_manifests(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no such manifest"):
        Manifest.load(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ManifestError, match="not JSON"):
        Manifest.load(tmp_path / MANIFEST_NAME)


def test_manifest_round_trip_through_json() -> None:
    m = manifest(entry(128, 128, 128, 5.0, 10.0))
    assert Manifest.from_json(json.loads(json.dumps(m.to_json()))) == m
    assert dataclasses.replace(m, kernels=()).kernel(128, 128, 128) is None


def test_host_cache_twins_go_in_their_kernels_place_only_where_verified(tmp_path: Path) -> None:
    """An sm90 kernel wins two shapes; its twin has an ok wallclock result on one and a wrong answer on the other.
    With host_cache_twins the twin is exported on the first only, with the kernel's figures; a kernel the tuner
    did not generate (no config record) has no twin."""
    sm90 = SM90.render(SM90_CFG)
    twin = host_cache_twin(ConfigRecord.of(SM90, SM90_CFG))
    with ResultStore(tmp_path / "r.sqlite") as s, TuneLog(s) as log:
        put(s, sm90, ok_result(T128, 5.0, 10.0))
        put(s, sm90, ok_result(T256, 6.0, 10.0))
        put(s, FAST, ok_result(T512, 6.0, 10.0))  # hand-written: no config record, no twin
        log.put_config(sha256_text(sm90), ConfigRecord.of(SM90, SM90_CFG))
        s.put_result(twin.source_hash, GPU, Mode.WALLCLOCK, ok_result(T128, 9.0, 12.0))
        s.put_result(twin.source_hash, GPU, Mode.WALLCLOCK, ShapeResult(T256, Status.WRONG_ANSWER, "max rel err 0.3"))
        p = plan_export(s, ExportRequest(GPU, host_cache_twins=True))
        plain = plan_export(s, ExportRequest(GPU))
    by_shape = {e.task: e for e in p.manifest.kernels}
    assert (by_shape[T128].source_hash, by_shape[T128].timed_as) == (twin.source_hash, sha256_text(sm90))
    assert p.sources["128_128_128.cu"] == twin.source and by_shape[T128].median_us == 5.0  # the kernel's figures
    assert (by_shape[T256].source_hash, by_shape[T256].timed_as) == (sha256_text(sm90), None)
    assert (by_shape[T512].source_hash, by_shape[T512].timed_as) == (sha256_text(FAST), None)
    assert all(e.timed_as is None for e in plain.manifest.kernels) and plain.sources["128_128_128.cu"] == sm90
    assert Manifest.from_json(json.loads(json.dumps(p.manifest.to_json()))) == p.manifest
    assert "timed_as" not in plain.manifest.to_json()["kernels"][0]  # absent when unused: older readers agree
    assert "128_128_128.cu" in render(p) and "(host_cache twin)" in render(p).splitlines()[2]


# -- the CLI ---------------------------------------------------------------------------------------------------


@pytest.fixture
def no_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDAL2_NO_GPU", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_cli_export(capsys, no_gpu, db: Path, tmp_path: Path) -> None:
    code, out, err = run(capsys, "export", "--gpu", "h200", "--out", str(tmp_path / "lib"), "--db", str(db))
    assert code == 0, err
    assert "128_128_128.cu" in out and "4 shape(s) not exported" in out and "library written" in out
    assert [e.file for e in Manifest.load(tmp_path / "lib").kernels] == ["128_128_128.cu"]


def test_cli_nothing_to_export_exits_1_and_writes_nothing(capsys, no_gpu, db: Path, tmp_path: Path) -> None:
    code, _, err = run(capsys, "export", "--out", str(tmp_path / "lib"), "--db", str(db), "--gpu", GPU,
                       "--min-speedup", "100")
    assert code == 1 and "nothing to export" in err and not (tmp_path / "lib").exists()


@pytest.mark.parametrize("argv, message", [
    (["--gpu", "h200", "--db", "{tmp}/missing.sqlite"], "no result store there"),
    (["--gpu", "v100"], "matches none"),
    (["--gpu", "h200", "--min-speedup", "-1"], "must be a finite number >= 0"),
    (["--gpu", "h200", "--min-speedup", "nan"], "must be a finite number >= 0"),
    (["--gpu", "h200", "--out", "{db}"], "exists and is not a directory"),
    (["--gpu", "h200", "--db", "{tmp}/garbage.sqlite"], "cannot open as a cudal2 result store"),
])
def test_cli_bad_input_one_line_exit_2(capsys, no_gpu, db: Path, tmp_path: Path, argv, message) -> None:
    (tmp_path / "garbage.sqlite").write_bytes(b"not a database" * 50)
    argv = [a.format(tmp=tmp_path, db=db) for a in argv]
    defaults = {"--db": str(db), "--out": str(tmp_path / "lib")}
    for flag, value in defaults.items():
        if flag not in argv:
            argv += [flag, value]
    code, _, err = run(capsys, "export", *argv)
    assert code == 2 and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "missing.sqlite").exists()


@pytest.mark.parametrize("argv", [["--acc", "bf16"], ["--mode", "batch"], ["--baseline", "numpy"], []])
def test_cli_argparse_errors_exit_2(capsys, no_gpu, argv) -> None:
    code, _, err = run(capsys, "export", *argv)  # [] lacks the required --out
    assert code == 2 and "Traceback" not in err
