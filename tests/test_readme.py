"""The README's "Where it stands" table quotes the committed H200 leaderboards. A store update regenerates the
leaderboards but not the README, so its headline figures would drift from the files they cite: this test fails
until the README says what the leaderboards say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LEADERBOARDS = ROOT / "benchmarks" / "leaderboard"
MODES = ("offline", "confirm", "server", "wallclock")
# The leaderboard's Targets rows the README's columns quote, in the README's column order.
TARGET_ROWS = (("all shapes", "torch.matmul / cuBLAS"), ("all shapes", "cuBLASLt autotuned"),
               ("small: MNK < 2^27", "torch.matmul / cuBLAS"), ("large: MNK >= 2^36", "torch.matmul / cuBLAS"))


def _targets(leaderboard: str) -> list[tuple[str, str]]:
    """(geomean, verdict) of each TARGET_ROWS row of a leaderboard's Targets table."""
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in leaderboard.splitlines()
             if line.startswith("| ")]
    found = []
    for target, vs in TARGET_ROWS:
        row = next((c for c in cells if c[:2] == [target, vs] and len(c) == 6), None)
        assert row is not None, f"no Targets row {target} / {vs}"
        found.append((row[3], row[5]))
    return found


def _readme_row(mode: str) -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Where it stands", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith(f"| {mode}")]
    assert len(rows) == 1, f"README's Where it stands: expected one row for {mode}, found {len(rows)}"
    return rows[0]


@pytest.mark.parametrize("mode", MODES)
def test_readme_quotes_the_committed_leaderboard(mode):
    targets = _targets((LEADERBOARDS / f"h200_grid_{mode}.md").read_text())
    quoted = re.findall(r"\d+\.\d{3}x", _readme_row(mode))
    assert quoted == [geomean for geomean, _ in targets], f"README's {mode} row differs from h200_grid_{mode}.md"


def test_readme_gives_the_offline_verdicts():
    """The offline row is issue #6's verdict: each of its figures carries the leaderboard's PASS or FAIL."""
    verdicts = re.findall(r"\b(PASS|FAIL)\b", _readme_row("offline"))
    assert verdicts == [verdict for _, verdict in _targets((LEADERBOARDS / "h200_grid_offline.md").read_text())]
