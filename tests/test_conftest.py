"""The suite's own rules (tests/conftest.py) that scripts rely on."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def test_failures_are_logged_as_they_happen(tmp_path):
    # A copy of the suite's conftest beside a failing and a passing test, run in a child pytest: the failure log
    # must name the failing test with its assertion, and nothing else.
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_two.py").write_text("def test_bad():\n    assert 1 + 1 == 3, 'arithmetic'\n\n"
                                          "def test_good():\n    assert True\n")
    log = tmp_path / "failures.log"
    env = {**os.environ, "CUDAL2_FAILURE_LOG": str(log)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    text = log.read_text()
    assert "FAILED (call) " in text and "test_bad" in text and "arithmetic" in text
    assert "test_good" not in text
