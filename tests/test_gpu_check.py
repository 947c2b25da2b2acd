"""scripts/gpu_check.sh stops before spending a lent machine's minutes: on an unknown mode (exit 2) and, with
GPU_MUST_BE, on a GPU of another kind (exit 3); each with one line, and nothing installed or run. The script runs
from a copy in an empty tree (no carried wheels, no package), with a fake `nvidia-smi` first on PATH."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"


@pytest.fixture
def run(tmp_path):
    """run(mode, gpu_name, **env) in a copy of the script whose root is tmp_path/tree; $OUT is tmp_path/out."""
    (tmp_path / "tree" / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, tmp_path / "tree" / "scripts" / "gpu_check.sh")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()

    def _run(mode: str, gpu_name: str | None, **env: str) -> subprocess.CompletedProcess:
        smi = fake_bin / "nvidia-smi"
        smi.unlink(missing_ok=True)
        if gpu_name is not None:  # every query the script makes gets the name first, as the real one answers
            smi.write_text(f"#!/bin/sh\necho '{gpu_name}'\n")
            smi.chmod(0o755)
        path = f"{fake_bin}:{os.environ['PATH']}"
        if gpu_name is None:  # no nvidia-smi at all: drop the directories that hold a real one
            path = ":".join(d for d in path.split(":") if not (Path(d) / "nvidia-smi").exists())
        return subprocess.run(["bash", str(tmp_path / "tree" / "scripts" / "gpu_check.sh"), mode], capture_output=True,
                              text=True, timeout=120,
                              env={**os.environ, "PATH": path, "OUT": str(tmp_path / "out"), **env})

    return _run


def test_unknown_mode_stops_with_one_line_and_runs_nothing(run, tmp_path):
    r = run("gird", "NVIDIA H200")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "unknown mode 'gird'" in r.stderr
    assert " grid " in r.stderr and not (tmp_path / "out").exists()  # not even an empty $OUT left behind


def test_two_modes_in_one_argument_are_not_a_mode(run):
    assert run("grid all", "NVIDIA H200").returncode == 2


def test_another_gpu_than_gpu_must_be_stops_before_anything_runs(run, tmp_path):
    r = run("grid", "NVIDIA H100 80GB HBM3", GPU_MUST_BE="H200")
    assert r.returncode == 3
    assert r.stderr.strip() == ("gpu_check.sh: the GPU here is 'NVIDIA H100 80GB HBM3', not H200 (GPU_MUST_BE): "
                                "nothing run")
    assert not (tmp_path / "out").exists()


def test_no_gpu_at_all_is_not_the_gpu_asked_for(run):
    r = run("grid", None, GPU_MUST_BE="H200")
    assert r.returncode == 3 and "'none found', not H200" in r.stderr


def test_the_gpu_asked_for_goes_on_to_the_mode(run, tmp_path):
    r = run("env", "NVIDIA H200", GPU_MUST_BE="H200")
    assert r.returncode == 0, r.stderr
    assert "NVIDIA H200" in (tmp_path / "out" / "env.txt").read_text()


def test_the_mode_list_usage_line_and_branches_agree():
    text = SCRIPT.read_text()
    modes = re.search(r"^modes=\((.*)\)$", text, re.M).group(1).split()
    usage = re.search(r"gpu_check\.sh \[([a-z0-9|]+)\]", text).group(1).split("|")
    branches = set(re.findall(r"\$what == ([a-z0-9]+)", text))
    assert sorted(usage) == sorted(modes)
    assert branches == set(modes) - {"env"}  # env: only what every mode writes first
