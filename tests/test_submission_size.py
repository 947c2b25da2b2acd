"""scripts/submission_size.sh: a file committed again and again counts in the diffs each time, and the script says
when the commits since a base would be over a submission's limits (exit 1)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def test_a_store_committed_three_times_counts_three_times(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "README").write_text("base\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "base")
    base = _git(tmp_path, "rev-parse", "HEAD").strip()
    for i in range(3):  # 400 KiB of incompressible bytes each time, as a gzipped store is
        (tmp_path / "store.gz").write_bytes(os.urandom(400 * 1024))
        _git(tmp_path, "add", ".")
        _git(tmp_path, "commit", "-qm", f"store {i}")

    def size(limit_mib: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(ROOT / "scripts" / "submission_size.sh"), base], cwd=tmp_path,
                              env={**os.environ, "LIMIT_DIFFS_MIB": limit_mib}, capture_output=True, text=True,
                              timeout=60)

    # base85 makes 400 KiB ~500 KiB, and a changed binary file's patch holds it both ways: ~0.5 + 2 x 1 = 2.5 MiB
    over = size("2")
    assert over.returncode == 1 and "3 commits since" in over.stdout and "would be refused" in over.stderr
    assert size("3").returncode == 0
    bad = subprocess.run(["bash", str(ROOT / "scripts" / "submission_size.sh"), "no-such-rev"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "not a commit" in bad.stderr
