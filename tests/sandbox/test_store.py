"""The SQLite result store: round trips, keys, queries, sharing between connections, refusal of bad files."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cudal2
from cudal2.sandbox.store import Rank, ResultStore, StoreError, default_db_path, log2_distance
from cudal2.sandbox.types import EVALUATOR_VERSION, Acc, Mode, PairedSpeedup, ShapeResult, Status, Task, Timing

GPU = "NVIDIA H200 (sm_90a)"


def timing(median_us: float) -> Timing:
    return Timing(median_us, median_us * 0.9, median_us * 0.95, median_us * 1.1, median_us * 1.3, 0.15, 200)


def ok_result(task: Task, cand_us: float, cublas_us: float = 10.0, **extra: Timing) -> ShapeResult:
    timings = {"candidate": timing(cand_us), "cublas": timing(cublas_us), **extra}
    return ShapeResult(task, Status.OK, "", max_rel_err=1.5e-4, timings=timings, graph=True, checks=("random",))


def failed_result(task: Task, status: Status = Status.WRONG_ANSWER) -> ShapeResult:
    return ShapeResult(task, status, "max rel err 0.3 > 0.01", max_rel_err=0.3)


@pytest.fixture
def store(tmp_path: Path):
    with ResultStore(tmp_path / "results.sqlite") as s:
        yield s


# -- opening --------------------------------------------------------------------------------------------------


def test_creates_parent_dirs_wal_and_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "results.sqlite"
    with ResultStore(path) as s:
        assert s._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert s._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000
        assert s._conn.execute("SELECT version FROM schema_version").fetchall() == [(1,)]
    assert path.is_file()
    with ResultStore(path) as s:  # reopening a store is a no-op
        assert s.counts_by_status() == {}


@pytest.mark.parametrize(
    "garbage",
    [b"not a database at all\n", b"\x00" * 8, os.urandom(4096), b"SQLite format 3\x00" + b"\xff" * 200],
    ids=["text", "zeros", "random-4k", "bad-header"],
)
def test_garbage_file_raises_and_is_untouched(tmp_path: Path, garbage: bytes) -> None:
    path = tmp_path / "results.sqlite"
    path.write_bytes(garbage)
    with pytest.raises(StoreError, match=re.escape(str(path))) as info:
        ResultStore(path)
    assert "\n" not in str(info.value)
    assert path.read_bytes() == garbage
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.sqlite"]


def test_newer_schema_version_raises_and_is_untouched(tmp_path: Path) -> None:
    path = tmp_path / "results.sqlite"
    with ResultStore(path) as s:
        s.put_source("h", "src")
        s._conn.execute("INSERT INTO schema_version (version) VALUES (2)")
    before = path.read_bytes()
    with pytest.raises(StoreError, match="schema version 2"):
        ResultStore(path)
    assert path.read_bytes() == before


def test_foreign_sqlite_db_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="not a cudal2 result store"):
        ResultStore(path)
    assert path.read_bytes() == before


# -- default path -----------------------------------------------------------------------------------------------


def test_default_db_path_honours_cudal2_db(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CUDAL2_DB", str(tmp_path / "x.sqlite"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_db_path() == tmp_path / "x.sqlite"


@pytest.mark.parametrize("xdg", ["ABS", "", "relative/dir", None])
def test_default_db_path_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, xdg: str | None) -> None:
    monkeypatch.delenv("CUDAL2_DB", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg") if xdg == "ABS" else xdg)
    base = tmp_path / "xdg" if xdg == "ABS" else tmp_path / "home" / ".cache"
    assert default_db_path() == base / "cudal2" / "results.sqlite"


# -- sources and results ----------------------------------------------------------------------------------------


def test_source_round_trip(store: ResultStore) -> None:
    assert store.get_source("h1") is None
    store.put_source("h1", "__global__ void k() {}")
    store.put_source("h1", "__global__ void k() {}")  # idempotent
    assert store.get_source("h1") == "__global__ void k() {}"
    with pytest.raises(StoreError, match="different text"):
        store.put_source("h1", "something else")


@pytest.mark.parametrize("mode", [Mode.OFFLINE, "server"])
@pytest.mark.parametrize(
    "result",
    [
        ok_result(Task(64, 4096, 64), 3.25, cublaslt_heuristic=timing(4.0), cublaslt_autotuned=timing(3.5)),
        ok_result(Task(128, 256, 512, Acc.FP16), 1.0),
        failed_result(Task(1, 1, 1)),
        ShapeResult(Task(8, 8, 8), Status.COMPILED, "", notes=("compile-only",)),
        dataclasses.replace(ok_result(Task(8192, 8192, 8192), 900.0, 1000.0),
                            paired={"cublas": PairedSpeedup(1.11, 1.09, 1.12, 10)}),
    ],
    ids=["ok-all-baselines", "ok-fp16", "wrong-answer", "compiled", "ok-paired"],
)
def test_result_round_trip(store: ResultStore, result: ShapeResult, mode: Mode | str) -> None:
    store.put_result("h", GPU, mode, result)
    assert store.get_result("h", result.task, GPU, mode) == result
    assert store.get_result("h", result.task, "other gpu", mode) is None
    other_mode = "offline" if Mode(mode) is Mode.SERVER else "server"
    assert store.get_result("h", result.task, GPU, other_mode) is None


def test_a_row_stored_before_paired_speedups_existed_restores_without_them(tmp_path: Path) -> None:
    """Rows written before the harness reported paired speedups have no "paired" key in their JSON."""
    result = ok_result(Task(64, 64, 64), 2.0)
    with ResultStore(tmp_path / "r.sqlite") as store:
        store.put_result("h", GPU, Mode.OFFLINE, result)
    with sqlite3.connect(tmp_path / "r.sqlite") as c:
        (js,) = c.execute("SELECT result_json FROM results").fetchone()
        old = json.loads(js)
        del old["paired"]
        c.execute("UPDATE results SET result_json = ?", (json.dumps(old),))
    with ResultStore(tmp_path / "r.sqlite") as store:
        back = store.get_result("h", result.task, GPU, Mode.OFFLINE)
    assert back == result and back.paired == {} and back.paired_speedup("cublas") is None


def test_denormalised_columns(store: ResultStore) -> None:
    result = ok_result(Task(64, 64, 64), 2.0, cublas_us=3.0, cublaslt_autotuned=timing(1.0))
    store.put_result("h", GPU, "offline", result)
    row = store._conn.execute(
        "SELECT status, cand_median_us, speedup_cublas, speedup_cublaslt_heuristic, speedup_cublaslt_autotuned,"
        " evaluator_version, mode FROM results"
    ).fetchone()
    assert row == ("ok", 2.0, 1.5, None, 0.5, EVALUATOR_VERSION, "offline")


def test_newest_result_wins(store: ResultStore) -> None:
    task = Task(256, 256, 256)
    store.put_result("h", GPU, "offline", ok_result(task, 5.0))
    store.put_result("h", GPU, "offline", failed_result(task, Status.TIMEOUT))
    newest = ok_result(task, 4.0)
    store.put_result("h", GPU, "offline", newest)
    assert store.get_result("h", task, GPU, "offline") == newest
    assert store.counts_by_status() == {"ok": 2, "timeout": 1}


def test_evaluator_version_isolation(store: ResultStore) -> None:
    task = Task(512, 512, 512)
    old = ok_result(task, 1.0)
    store.put_result("h", GPU, "offline", old, evaluator_version="0.0.1")
    assert store.get_result("h", task, GPU, "offline") is None
    assert store.get_result("h", task, GPU, "offline", evaluator_version="0.0.1") == old
    assert store.best(task, GPU) == []
    current = ok_result(task, 2.0)
    store.put_result("h", GPU, "offline", current)
    assert store.get_result("h", task, GPU, "offline") == current
    assert store.best(task, GPU) == [("h", current)]


# -- best ----------------------------------------------------------------------------------------------------------


def test_best_orders_by_candidate_time_and_drops_non_ok(store: ResultStore) -> None:
    task = Task(1024, 1024, 1024)
    store.put_result("slow", GPU, "offline", ok_result(task, 9.0))
    store.put_result("fast", GPU, "offline", ok_result(task, 3.0))
    store.put_result("mid", GPU, "offline", ok_result(task, 5.0))
    store.put_result("broken", GPU, "offline", failed_result(task))
    store.put_result("crash", GPU, "offline", failed_result(task, Status.RUNTIME_ERROR))
    store.put_result("elsewhere", GPU, "offline", ok_result(Task(1024, 1024, 2048), 0.1))
    store.put_result("fp16", GPU, "offline", ok_result(Task(1024, 1024, 1024, Acc.FP16), 0.1))
    store.put_result("server", GPU, "server", ok_result(task, 0.1))
    store.put_result("other-gpu", "NVIDIA A100 (sm_80)", "offline", ok_result(task, 0.1))
    assert [h for h, _ in store.best(task, GPU, limit=10)] == ["fast", "mid", "slow"]
    assert [h for h, _ in store.best(task, GPU)] == ["fast"]
    assert [r.timings["candidate"].median_us for _, r in store.best(task, GPU, limit=2)] == [3.0, 5.0]
    assert [h for h, _ in store.best(task, GPU, mode="server")] == ["server"]


def test_best_counts_each_source_once_by_its_newest_result(store: ResultStore) -> None:
    task = Task(2048, 2048, 2048)
    store.put_result("a", GPU, "offline", ok_result(task, 3.0))
    store.put_result("a", GPU, "offline", ok_result(task, 4.0))  # re-evaluated: newest figure counts
    store.put_result("b", GPU, "offline", ok_result(task, 1.0))
    store.put_result("b", GPU, "offline", failed_result(task))  # newest says wrong: excluded
    best = store.best(task, GPU, limit=5)
    assert [(h, r.timings["candidate"].median_us) for h, r in best] == [("a", 4.0)]


@pytest.mark.parametrize(
    "baseline, expected",
    [("cublas", ["with-cublas"]), ("cublaslt_autotuned", ["with-lt"]), (None, ["with-lt", "with-cublas"])],
)
def test_best_baseline_filter(store: ResultStore, baseline: str | None, expected: list[str]) -> None:
    task = Task(64, 64, 64)
    store.put_result("with-cublas", GPU, "offline", ok_result(task, 2.0))
    lt_only = ShapeResult(task, Status.OK, "", timings={"candidate": timing(1.0), "cublaslt_autotuned": timing(1.5)})
    store.put_result("with-lt", GPU, "offline", lt_only)
    assert [h for h, _ in store.best(task, GPU, baseline=baseline, limit=5)] == expected


def test_best_by_speedup_ranks_across_evaluations_in_different_gpu_states(store: ResultStore) -> None:
    """Two evaluations on a GPU whose clocks drifted between them: 'cool' ran when everything was fast (100 us
    against cuBLAS's 90), 'steady' when everything was slower (105 us against 115). By time 'cool' wins; by the
    speedup over the baseline timed alongside, 'steady' (1.095x against 0.9x)."""
    task = Task(8192, 8192, 8192)
    store.put_result("cool", GPU, "offline", ok_result(task, 100.0, cublas_us=90.0))
    store.put_result("steady", GPU, "offline", ok_result(task, 105.0, cublas_us=115.0))
    store.put_result("wrong", GPU, "offline", failed_result(task))
    assert [h for h, _ in store.best(task, GPU, limit=5)] == ["cool", "steady"]
    assert [h for h, _ in store.best(task, GPU, limit=5, rank=Rank.SPEEDUP)] == ["steady", "cool"]
    assert [h for h, _ in store.chosen(task, GPU)] == ["cool"]
    assert [h for h, _ in store.chosen(task, GPU, Rank.SPEEDUP, limit=2)] == ["steady", "cool"]
    with pytest.raises(ValueError, match="baseline=None"):
        store.best(task, GPU, baseline=None, rank=Rank.SPEEDUP)


def test_best_rejects_unknown_baseline(store: ResultStore) -> None:
    with pytest.raises(ValueError, match="unknown baseline"):
        store.best(Task(1, 1, 1), GPU, baseline="torch")


# -- nearest_best ------------------------------------------------------------------------------------------------


def test_log2_distance() -> None:
    assert log2_distance(Task(1024, 1024, 1024), Task(1024, 1024, 2048)) == 1.0
    assert log2_distance(Task(64, 64, 64), Task(16, 256, 64)) == pytest.approx(8**0.5)


def test_nearest_best_excludes_same_shape_and_orders_by_log_distance(store: ResultStore) -> None:
    task = Task(1024, 1024, 1024)
    store.put_result("same", GPU, "offline", ok_result(task, 0.5))  # the shape itself: excluded
    store.put_result("d2", GPU, "offline", ok_result(Task(4096, 1024, 1024), 8.0))  # distance 2
    store.put_result("d1", GPU, "offline", ok_result(Task(1024, 1024, 2048), 6.0))  # distance 1
    store.put_result("d1-slow", GPU, "offline", ok_result(Task(1024, 1024, 2048), 7.0))  # same shape, slower
    store.put_result("d1.4", GPU, "offline", ok_result(Task(2048, 512, 1024), 5.0))  # distance sqrt(2)
    store.put_result("d3", GPU, "offline", ok_result(Task(128, 1024, 1024), 1.0))  # distance 3
    store.put_result("near-bad", GPU, "offline", failed_result(Task(1024, 1024, 512)))  # not ok: excluded
    store.put_result("fp16", GPU, "offline", ok_result(Task(1024, 1024, 1024 + 1, Acc.FP16), 1.0))  # other acc
    store.put_result("old", GPU, "offline", ok_result(Task(1024, 1024, 1023), 1.0), evaluator_version="0.0.0")
    store.put_result("a100", "A100", "offline", ok_result(Task(1024, 1024, 1023), 1.0))
    near = store.nearest_best(task, GPU, k=3)
    assert [h for h, _ in near] == ["d1", "d1.4", "d2"]
    assert [r.task for _, r in near] == [Task(1024, 1024, 2048), Task(2048, 512, 1024), Task(4096, 1024, 1024)]
    assert [h for h, _ in store.nearest_best(task, GPU, k=10)] == ["d1", "d1.4", "d2", "d3"]
    assert store.nearest_best(task, GPU, k=0) == []


# -- algo cache ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("acc", list(Acc))
def test_algo_cache_round_trip(store: ResultStore, acc: Acc) -> None:
    task = Task(64, 4096, 64, acc)
    assert store.get_algo(task, GPU, "cublaslt_autotuned") is None
    store.put_algo(task, GPU, "cublaslt_autotuned", "deadbeef", 3.5)
    store.put_algo(task, GPU, "cublaslt_autotuned", "cafef00d", 3.1)  # replaced
    assert store.get_algo(task, GPU, "cublaslt_autotuned") == "cafef00d"
    assert store.get_algo(task, "A100", "cublaslt_autotuned") is None
    assert store.get_algo(task, GPU, "cublaslt_heuristic") is None
    assert store.get_algo(Task(64, 4096, 128, acc), GPU, "cublaslt_autotuned") is None


# -- sharing one file ----------------------------------------------------------------------------------------------


def test_two_stores_on_one_file(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite"
    task = Task(64, 64, 64)
    with ResultStore(path) as writer, ResultStore(path) as reader:
        assert reader.get_result("h", task, GPU, "offline") is None
        result = ok_result(task, 2.0)
        writer.put_source("h", "src")
        writer.put_result("h", GPU, "offline", result)
        assert reader.get_source("h") == "src"
        assert reader.get_result("h", task, GPU, "offline") == result
        reader.put_algo(task, GPU, "cublaslt_autotuned", "ab", 1.0)  # and the other way round
        assert writer.get_algo(task, GPU, "cublaslt_autotuned") == "ab"


def _child_env() -> dict[str, str]:
    """The environment for a child Python that imports this checkout's cudal2 (installed or not)."""
    root = str(Path(cudal2.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


_WRITER = """
import sys
from cudal2.sandbox.store import ResultStore
from cudal2.sandbox.types import ShapeResult, Status, Task
path, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with ResultStore(path) as s:
    for i in range(n):
        s.put_source(f"{name}-{i}", "src")
        s.put_result(f"{name}-{i}", "gpu", "offline", ShapeResult(Task(64, 64, 64), Status.TIMEOUT, "t"))
"""


def test_concurrent_writer_processes(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite"
    env = _child_env()
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), f"w{i}", "40"], env=env, stderr=subprocess.PIPE)
        for i in range(4)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    with ResultStore(path) as s:
        assert s.counts_by_status() == {"timeout": 160}


_OPENER = """
import sys
from pathlib import Path
from cudal2.sandbox.store import ResultStore
path, ready, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
ready.touch()
while not go.exists():  # spin, not sleep: the openers must reach the file within microseconds of each other
    pass
with ResultStore(path):
    pass
"""


def test_processes_opening_a_new_file_at_once(tmp_path: Path) -> None:
    """Openers released together onto a new file all switch it to WAL; before the switch was retried, about one
    in 15 failed with "database is locked" (SQLite fails one of two shared-lock holders that both want the
    exclusive lock, without waiting), so 10 rounds of 6 openers caught it."""
    env = _child_env()
    for round_ in range(10):
        path, go = tmp_path / f"new{round_}.sqlite", tmp_path / f"go{round_}"
        ready = [tmp_path / f"ready{round_}-{i}" for i in range(6)]
        procs = [subprocess.Popen([sys.executable, "-c", _OPENER, str(path), str(r), str(go)], env=env,
                                  stderr=subprocess.PIPE) for r in ready]
        deadline = time.monotonic() + 120
        while not all(r.exists() for r in ready) and time.monotonic() < deadline:
            time.sleep(0.01)
        go.touch()
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()
        with ResultStore(path) as s:
            assert s.counts_by_status() == {}


def test_ok_shapes_gpus_and_measured_at(store: ResultStore) -> None:
    t, other = Task(128, 256, 512), Task(64, 64, 64)
    store.put_result("a", GPU, "offline", ok_result(t, 5.0))
    store.put_result("a", GPU, "offline", ok_result(t, 6.0))
    store.put_result("a", GPU, "offline", failed_result(other))  # never ok: not listed
    store.put_result("a", GPU, "server", ok_result(Task(32, 32, 32), 5.0))  # another mode
    store.put_result("a", GPU, "offline", ok_result(Task(16, 16, 16, Acc.FP16), 5.0))  # another accumulation
    store.put_result("a", "other gpu", "offline", ok_result(other, 5.0))
    store.put_result("a", "old gpu", "offline", ok_result(other, 5.0), evaluator_version="0.0.1")
    assert store.ok_shapes(Acc.FP32, GPU, Mode.OFFLINE) == [t]
    assert store.ok_shapes("fp16", GPU) == [Task(16, 16, 16, Acc.FP16)]
    assert store.ok_gpus() == [GPU, "other gpu"]
    created = store._conn.execute("SELECT MAX(created) FROM results WHERE m = 128").fetchone()[0]
    assert store.measured_at("a", t, GPU, "offline") == created  # the newest row's time
    assert store.measured_at("a", t, GPU, "server") is None and store.measured_at("b", t, GPU, "offline") is None


# -- carrying results to a new evaluator version ----------------------------------------------------------------


def test_carry_forward_copies_the_newest_result_per_key_of_the_given_sources_once(store: ResultStore) -> None:
    t1, t2 = Task(64, 64, 64, Acc.FP32), Task(128, 64, 64, Acc.FP32)
    store.put_result("aa", GPU, Mode.OFFLINE, ok_result(t1, 9.0), evaluator_version="0.1.0")
    store.put_result("aa", GPU, Mode.OFFLINE, ok_result(t1, 5.0), evaluator_version="0.1.0")  # newest wins
    store.put_result("aa", GPU, Mode.SERVER, ok_result(t1, 7.0), evaluator_version="0.1.0")
    store.put_result("aa", GPU, Mode.OFFLINE, failed_result(t2), evaluator_version="0.1.0")
    store.put_result("bb", GPU, Mode.OFFLINE, ok_result(t1, 1.0), evaluator_version="0.1.0")  # not named: stays
    store.put_result("cc", GPU, Mode.OFFLINE, ok_result(t1, 4.0), evaluator_version="0.1.0")
    store.put_result("cc", GPU, Mode.OFFLINE, ok_result(t1, 3.0), evaluator_version="0.2.0")  # already measured
    created = store._conn.execute("SELECT created FROM results WHERE source_hash = 'aa' AND cand_median_us = 5.0"
                                  " AND mode = 'offline'").fetchone()[0]

    assert store.carry_forward("0.1.0", "0.2.0", ["aa", "cc"]) == 3
    assert store.carry_forward("0.1.0", "0.2.0", ["aa", "cc"]) == 0  # nothing new the second time

    def now(h: str, task: Task, mode: Mode) -> ShapeResult | None:
        return store.get_result(h, task, GPU, mode, evaluator_version="0.2.0")

    assert now("aa", t1, Mode.OFFLINE).timings["candidate"].median_us == 5.0
    assert now("aa", t1, Mode.SERVER).timings["candidate"].median_us == 7.0
    assert now("aa", t2, Mode.OFFLINE).status is Status.WRONG_ANSWER
    assert now("bb", t1, Mode.OFFLINE) is None
    assert now("cc", t1, Mode.OFFLINE).timings["candidate"].median_us == 3.0  # its own measurement kept
    assert store._conn.execute("SELECT created FROM results WHERE source_hash = 'aa' AND evaluator_version = '0.2.0'"
                               " AND mode = 'offline' AND cand_median_us = 5.0").fetchone()[0] == created
    assert store.get_result("aa", t1, GPU, Mode.OFFLINE, evaluator_version="0.1.0").timings["candidate"].median_us == 5.0
