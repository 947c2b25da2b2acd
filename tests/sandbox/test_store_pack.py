"""A committed store as a gzipped base plus deltas: a delta holds exactly the new rows, and base + deltas assemble
back into the store the device grew, with the same row ids (the store's readers take the newest row by id)."""

from __future__ import annotations

import gzip
import hashlib
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from cudal2.sandbox import store_pack
from cudal2.sandbox.store import ResultStore, StoreError
from cudal2.sandbox.types import Acc, Mode, Status, Task
from tests.sandbox.test_store import GPU, ok_result

ROOT = Path(__file__).resolve().parents[2]
T1, T2 = Task(64, 64, 64, Acc.FP32), Task(128, 256, 512, Acc.FP32)


def _measure(db: Path, source_hash: str, task: Task, us: float) -> None:
    """One evaluation of `source_hash` on `task` stored in `db`, as the evaluator stores one."""
    with ResultStore(db) as s:
        s.put_source(source_hash, f"// kernel {source_hash}")
        s.put_result(source_hash, GPU, Mode.OFFLINE, ok_result(task, us))


def _commit(db: Path, committed: Path) -> None:
    """`db` as benchmarks/stores holds a base: one gzipped file, its write-ahead log checkpointed in first."""
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    committed.write_bytes(gzip.compress(db.read_bytes(), mtime=0))


def _rows(db: Path) -> dict[str, list[tuple]]:
    with closing(sqlite3.connect(db)) as conn:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2, 3").fetchall() for t in store_pack.TABLES}


@pytest.fixture
def committed(tmp_path: Path) -> Path:
    """A committed base (two results, one cuBLASLt algorithm) and the live store it was taken from, `grown.sqlite`."""
    grown = tmp_path / "grown.sqlite"
    _measure(grown, "a", T1, 5.0)
    _measure(grown, "b", T2, 9.0)
    with ResultStore(grown) as s:
        s.put_algo(T2, GPU, "cublaslt_autotuned", "00ff", 8.5)
    path = tmp_path / "stores" / "grid.sqlite.gz"
    path.parent.mkdir()
    _commit(grown, path)
    return path


def test_a_delta_holds_only_the_new_rows_and_base_plus_delta_is_the_grown_store(tmp_path, committed):
    grown = tmp_path / "grown.sqlite"
    _measure(grown, "a", T1, 4.0)  # a re-evaluation: the newest row of the key wins by its id
    _measure(grown, "c", T2, 3.0)  # a new source
    with ResultStore(grown) as s:
        s.put_algo(T2, GPU, "cublaslt_autotuned", "0a0a", 7.0)  # a newer algorithm replaces the older
    delta = store_pack.write_delta(grown, committed)
    assert delta.path == tmp_path / "stores" / "grid.deltas" / "0001.sqlite.gz"
    assert (delta.rows, delta.first_id, delta.last_id) == (store_pack.Rows(2, 1, 1), 3, 4)
    done = store_pack.assemble(committed, tmp_path / "assembled.sqlite")
    assert done.deltas == 1 and done.rows == store_pack.Rows(4, 3, 1)
    assert _rows(done.path) == _rows(grown)
    with ResultStore(done.path) as s:
        assert s.get_result("a", T1, GPU, Mode.OFFLINE).timings["candidate"].median_us == 4.0
        assert [h for h, _ in s.best(T2, GPU)] == ["c"]
        assert s.get_algo(T2, GPU, "cublaslt_autotuned") == "0a0a"


def test_deltas_are_numbered_in_order_and_nothing_new_writes_no_file(tmp_path, committed):
    grown = tmp_path / "grown.sqlite"
    _measure(grown, "c", T1, 3.0)
    first = store_pack.write_delta(grown, committed)
    _measure(grown, "d", T1, 2.0)
    second = store_pack.write_delta(grown, committed)
    assert [first.path.name, second.path.name] == ["0001.sqlite.gz", "0002.sqlite.gz"]
    assert (second.first_id, second.last_id) == (4, 4)
    nothing = store_pack.write_delta(grown, committed)
    assert nothing.path is None and "nothing new" in nothing.render()
    assert store_pack.delta_files(committed) == [first.path, second.path]
    assert _rows(store_pack.assemble(committed, tmp_path / "a.sqlite").path) == _rows(grown)


def test_a_device_delta_made_against_an_older_commit_adds_only_its_new_rows(tmp_path, committed):
    """A warm device machine keeps its store between calls: the second call's delta, taken against the commit that
    lacked the first call's rows, holds them too. Committing both adds every row once."""
    device = tmp_path / "device.sqlite"
    shutil.copyfile(store_pack.assemble(committed, tmp_path / "start.sqlite").path, device)
    _measure(device, "c", T1, 3.0)
    call1 = store_pack.write_delta(device, committed, tmp_path / "call1.sqlite.gz")
    _measure(device, "d", T2, 2.0)
    call2 = store_pack.write_delta(device, committed, tmp_path / "call2.sqlite.gz")
    assert (call1.first_id, call1.last_id, call2.first_id, call2.last_id) == (3, 3, 3, 4)
    assert store_pack.write_delta(call1.path, committed).rows.results == 1
    added = store_pack.write_delta(call2.path, committed)  # its row 3 is already committed: only row 4 is new
    assert (added.rows.results, added.first_id) == (1, 4)
    assert _rows(store_pack.assemble(committed, tmp_path / "a.sqlite").path) == _rows(device)


def test_rows_still_in_a_live_stores_write_ahead_log_are_taken(tmp_path, committed):
    grown = tmp_path / "grown.sqlite"
    with ResultStore(grown) as live:  # held open: its last rows sit in the -wal file, not yet in the main file
        live.put_source("c", "// kernel c")
        live.put_result("c", GPU, Mode.OFFLINE, ok_result(T1, 3.0))
        assert store_pack.write_delta(grown, committed).rows == store_pack.Rows(1, 1, 0)


def test_a_store_that_did_not_start_from_the_commit_is_refused_and_nothing_is_written(tmp_path, committed):
    other = tmp_path / "other.sqlite"
    _measure(other, "x", T1, 1.0)  # id 1 is another row than the committed id 1
    _measure(other, "y", T1, 1.0)
    _measure(other, "z", T1, 1.0)
    with pytest.raises(StoreError, match="result id 1 differs.*did not start from this committed store"):
        store_pack.write_delta(other, committed)
    assert store_pack.delta_files(committed) == []


def test_a_delta_after_a_gap_is_refused(tmp_path, committed):
    """A device store whose first new row is not the next id (the rows of a call before it were lost)."""
    device = tmp_path / "device.sqlite"
    shutil.copyfile(store_pack.assemble(committed, tmp_path / "start.sqlite").path, device)
    _measure(device, "c", T1, 3.0)
    _measure(device, "d", T2, 2.0)
    with closing(sqlite3.connect(device)) as conn, conn:
        conn.execute("DELETE FROM results WHERE id = 3")
    with pytest.raises(StoreError, match="start at id 4.*ends at id 2: rows 3..3 are missing"):
        store_pack.write_delta(device, committed)
    assert store_pack.delta_files(committed) == []


def test_assemble_never_overwrites_and_leaves_nothing_behind_a_bad_delta(tmp_path, committed):
    out = tmp_path / "out.sqlite"
    out.write_text("precious")
    with pytest.raises(StoreError, match="already exists"):
        store_pack.assemble(committed, out)
    assert out.read_text() == "precious"
    folder = store_pack.deltas_dir(committed)
    folder.mkdir()
    (folder / "0001.sqlite.gz").write_bytes(gzip.compress(b"not a database"))
    with pytest.raises(StoreError, match="0001.sqlite.gz: cannot open as a cudal2 result store"):
        store_pack.assemble(committed, tmp_path / "new.sqlite")
    assert not (tmp_path / "new.sqlite").exists()


def test_cli_store_commands_and_their_one_line_errors(tmp_path, committed):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cudal2.cli", "store", *args], capture_output=True, text=True,
                              cwd=tmp_path, timeout=120)

    grown = tmp_path / "grown.sqlite"
    _measure(grown, "c", T1, 3.0)
    done = cli("delta", "--db", str(grown), "--committed", str(committed))
    assert done.returncode == 0 and "0001.sqlite.gz: 1 results, 1 sources" in done.stdout
    done = cli("assemble", str(committed), "--out", "a.sqlite")
    assert done.returncode == 0 and "3 results" in done.stdout and "1 deltas" in done.stdout
    done = cli("assemble", str(committed), "--out", "b.sqlite", "--also", str(committed))
    assert done.returncode == 2 and "2 of its results are already in the store" in done.stderr
    assert done.stderr.count("\n") == 1 and not (tmp_path / "b.sqlite").exists()
    for args in (("assemble", str(committed), "--out", "a.sqlite"), ("assemble", "missing.sqlite.gz", "--out", "b"),
                 ("delta", "--db", str(ROOT / "README.md"), "--committed", str(committed))):
        done = cli(*args)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "cudal2: error:" in done.stderr


def test_a_store_kept_apart_joins_after_the_deltas_with_the_next_ids(tmp_path, committed):
    """Another GPU's rows, sent back against the commit and kept out of its deltas (benchmarks/stores/h100_*): their
    ids overlap the delta committed later, so they join after it, in their own order, and only once."""
    device = tmp_path / "device.sqlite"
    shutil.copyfile(store_pack.assemble(committed, tmp_path / "start.sqlite").path, device)
    other = "NVIDIA H100 80GB HBM3 (sm_90a)"
    with ResultStore(device) as s:
        s.put_source("h", "// kernel h")
        s.put_result("a", other, Mode.COLD, ok_result(T1, 7.0))
        s.put_result("h", other, Mode.COLD, ok_result(T2, 8.0))
    apart = store_pack.write_delta(device, committed, tmp_path / "h100.sqlite.gz")
    grown = tmp_path / "grown.sqlite"
    _measure(grown, "c", T1, 3.0)
    store_pack.write_delta(grown, committed)  # the next delta takes id 3, as the apart store's first row does
    done = store_pack.assemble(committed, tmp_path / "all.sqlite", [apart.path])
    assert (done.deltas, done.apart, done.rows) == (1, 1, store_pack.Rows(5, 4, 1))
    with closing(sqlite3.connect(done.path)) as conn:
        ids = conn.execute("SELECT id, source_hash, gpu FROM results WHERE id > 2 ORDER BY id").fetchall()
    assert ids == [(3, "c", GPU), (4, "a", other), (5, "h", other)]
    with ResultStore(done.path) as s:
        assert s.get_result("h", T2, other, Mode.COLD).timings["candidate"].median_us == 8.0
        assert s.get_source("h") == "// kernel h"
    with pytest.raises(StoreError, match="h100.sqlite.gz: 2 of its results are already in the store"):
        store_pack.assemble(committed, tmp_path / "twice.sqlite", [apart.path, apart.path])
    assert not (tmp_path / "twice.sqlite").exists()


COMMITTED_STORE = ROOT / "benchmarks" / "stores" / "h200_grid.sqlite.gz"


# The committed base, the store as the thirty-second session committed it. A device call's rows go into a delta;
# committing a grown base instead adds 37 MiB to every clone and once made a submission too large to land.
COMMITTED_a5e693b2c6cd92fdf3ac22ce05a77be5568a96e45fcebe025e52990faa0c8c02256 = "a5e693b2c6cd92fdf3ac22ce05a77be5568a96e45fcebe025e52990faa0c8c02"


def test_the_committed_base_is_never_rewritten():
    digest = hashlib.sha256(COMMITTED_STORE.read_bytes()).hexdigest()
    assert digest == COMMITTED_a5e693b2c6cd92fdf3ac22ce05a77be5568a96e45fcebe025e52990faa0c8c02256, (
        f"{COMMITTED_STORE.name} changed: add a device call's rows as a delta instead "
        "(cudal2 store delta --db grid_delta.sqlite.gz --committed benchmarks/stores/h200_grid.sqlite.gz)")


def test_the_committed_h200_store_assembles_with_every_delta(tmp_path):
    """The committed grid store's deltas each continue the ids before them (a delta added by hand would show here)."""
    done = store_pack.assemble(COMMITTED_STORE, tmp_path / "grid.sqlite")
    assert done.deltas == len(store_pack.delta_files(COMMITTED_STORE)) and done.rows.results > 100_000


def test_the_tuners_bookkeeping_travels_with_the_delta(tmp_path, committed):
    """Which config made a new source (and its compile outcome) goes into the delta and comes back on assembly: without
    it `cudal2 report` could not name the new kernels, nor `cudal2 tune` breed from them."""
    from cudal2.tune_log import CompileRecord, ConfigRecord, TuneLog

    grown = tmp_path / "grown.sqlite"
    _measure(grown, "c", T1, 3.0)
    record = ConfigRecord("small", "small-bm16", {"bm": 16})
    with ResultStore(grown) as s, TuneLog(s) as log:
        log.put_config("c", record)
        log.put_compile("c", "sm_90a", CompileRecord(Status.COMPILED, "", 40, 0, 1.5))
    delta = store_pack.write_delta(grown, committed, tmp_path / "device.sqlite.gz")  # as gpu_check.sh sends it back
    store_pack.write_delta(delta.path, committed)  # as it is committed
    with ResultStore(store_pack.assemble(committed, tmp_path / "a.sqlite").path) as s, TuneLog(s) as log:
        assert log.config_of("c") == record and log.compile_of("c", "sm_90a").registers == 40
    # Only bookkeeping new: still a delta (a config recorded for a source measured before).
    with ResultStore(grown) as s, TuneLog(s) as log:
        log.put_config("a", ConfigRecord("small", "small-bm32", {"bm": 32}))
    again = store_pack.write_delta(grown, committed)
    assert again.path is not None and again.rows.results == 0
