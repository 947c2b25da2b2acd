"""The shared pool server on loopback, with the simulated GPU stage: client API, CLI start/stats/stop, errors."""

from __future__ import annotations

import threading

import pytest

from cudal2 import cli
from cudal2.sandbox.evaluator import EvalOptions
from cudal2.sandbox.pool import PoolConfig, RunnerSpec
from cudal2.sandbox.pool.server import PoolClient, PoolNotRunning, serve
from cudal2.sandbox.types import Status, Task
from tests.sandbox.pool_fakes import kernel

TASKS = (Task(64, 64, 64),)


@pytest.mark.nvcc
def test_client_submits_reads_stats_and_stops_the_server(tmp_path):
    state = tmp_path / "pool.json"
    cfg = PoolConfig(gpus=(0, 1), db_path="", eval=EvalOptions(cache_dir=tmp_path / "build"))
    ready = threading.Event()
    t = threading.Thread(target=serve, args=(cfg, state), kwargs={"runner": RunnerSpec(
        "tests.sandbox.pool_fakes:fake_runner"), "ready": ready}, daemon=True)
    t.start()
    assert ready.wait(60)
    client = PoolClient(state)
    results = client.map([kernel("srv1"), kernel("srv2")], TASKS, caller="rank0")
    assert [r.shapes[0].status for r in results] == [Status.OK, Status.OK]
    stats = client.stats()
    assert stats.jobs == 2 and stats.workers == 2
    client.stop()
    t.join(timeout=60)
    assert not t.is_alive() and not state.exists()


def test_wrong_key_gets_no_service(tmp_path):
    state = tmp_path / "pool.json"
    cfg = PoolConfig(gpus=(), db_path="", eval=EvalOptions(cache_dir=tmp_path / "build"))
    ready = threading.Event()
    t = threading.Thread(target=serve, args=(cfg, state), kwargs={"ready": ready}, daemon=True)
    t.start()
    assert ready.wait(60)
    good = PoolClient(state)
    bad = PoolClient(state)
    bad.key = b"x" * 32
    with pytest.raises(PoolNotRunning):
        bad.stats()
    assert good.stats().workers == 0  # the server survived the bad client
    good.stop()
    t.join(timeout=60)


@pytest.mark.parametrize("command", ["stats", "stop"])
def test_cli_without_a_server_is_one_line_error(tmp_path, capsys, command):
    code = cli.main(["pool", command, "--state-file", str(tmp_path / "none.json")])
    err = capsys.readouterr().err
    assert code == 2 and "no pool server" in err and len(err.strip().splitlines()) == 1


def test_cli_start_stats_stop_in_background(tmp_path, capsys):
    state = str(tmp_path / "pool.json")
    assert cli.main(["pool", "start", "--gpus", "", "--state-file", state, "--db", str(tmp_path / "r.sqlite")]) == 0
    assert cli.main(["pool", "stats", "--state-file", state]) == 0
    assert "backend local, 0 GPU worker(s)" in capsys.readouterr().out
    assert cli.main(["pool", "stop", "--state-file", state]) == 0
