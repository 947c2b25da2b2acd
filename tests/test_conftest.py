"""The suite's own rules (tests/conftest.py) that scripts rely on."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def _child_pytest(tmp_path, env_extra: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """pytest in a child on tmp_path, with a copy of the suite's conftest there (and none of the outer run's shard or
    failure log: this suite may itself run as a shard)."""
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDAL2_SHARD", "CUDAL2_FAILURE_LOG")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, str(tmp_path)],
                          env={**env, **env_extra}, capture_output=True, text=True, timeout=120)


def test_failures_are_logged_as_they_happen(tmp_path):
    # A failing and a passing test: the failure log names the failing one with its assertion, and nothing else.
    (tmp_path / "test_two.py").write_text("def test_bad():\n    assert 1 + 1 == 3, 'arithmetic'\n\n"
                                          "def test_good():\n    assert True\n")
    log = tmp_path / "failures.log"
    run = _child_pytest(tmp_path, {"CUDAL2_FAILURE_LOG": str(log)}, "-q")
    assert run.returncode == 1, run.stdout + run.stderr
    text = log.read_text()
    assert "FAILED (call) " in text and "test_bad" in text and "arithmetic" in text
    assert "test_good" not in text


def test_shards_partition_the_collected_tests(tmp_path):
    (tmp_path / "test_many.py").write_text("".join(f"def test_{k}():\n    pass\n\n" for k in range(7)))
    ran = []
    for i in (1, 2, 3):
        run = _child_pytest(tmp_path, {"CUDAL2_SHARD": f"{i}/3"}, "-v")
        assert run.returncode == 0, run.stdout + run.stderr
        ran.append({line.split("::")[1].split()[0] for line in run.stdout.splitlines() if " PASSED" in line})
    assert [len(r) for r in ran] == [3, 2, 2]
    assert set().union(*ran) == {f"test_{k}" for k in range(7)}  # each test in exactly one shard
    assert all(not (a & b) for a in ran for b in ran if a is not b)


def test_a_bad_shard_is_a_one_line_error(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_x():\n    pass\n")
    for spec in ("3/2", "0/2", "half"):
        run = _child_pytest(tmp_path, {"CUDAL2_SHARD": spec}, "-q")
        assert run.returncode != 0
        assert "CUDAL2_SHARD must be i/n" in run.stderr + run.stdout
        assert "Traceback" not in run.stderr + run.stdout
