"""The kernel corpora (kernels/seed, legit, adversarial, faults) and the status each file must get.

Every adversarial or fault kernel names its expected status in a header line `// expect: <status>`; seed and
legit kernels must be `ok`. Tests parametrize over these lists, so adding a file adds a test.
"""

from __future__ import annotations

import re
from pathlib import Path

from cudal2.sandbox.types import Status

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
_EXPECT = re.compile(r"^//\s*expect:\s*([a-z_]+)", re.MULTILINE)


def expected_status(path: Path) -> Status:
    if path.parent.name in ("seed", "legit"):
        return Status.OK
    match = _EXPECT.search(path.read_text())
    if not match:
        raise ValueError(f"{path} has no '// expect: <status>' header")
    return Status(match.group(1))


_CAUGHT_BY = re.compile(r"^//\s*caught-by:\s*(.*)$", re.MULTILINE)


def caught_at_compile_time(path: Path) -> bool:
    """True for kernels whose expected status is decided before anything runs (static rules, nvcc)."""
    status = expected_status(path)
    if status in (Status.STATIC_REJECT, Status.COMPILE_ERROR):
        return True
    match = _CAUGHT_BY.search(path.read_text())
    return status == Status.TIMEOUT and bool(match) and match.group(1).lower().startswith(("compiler", "nvcc"))


def cpu_expected_status(path: Path) -> Status:
    """What a compile-only evaluation (no GPU) must say: the final status if it is decided at compile time,
    otherwise `compiled` (a runtime attack must not be rejected, nor a legit kernel, before it runs)."""
    return expected_status(path) if caught_at_compile_time(path) else Status.COMPILED


def corpus(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (KERNELS / d).glob("*.cu"))


def ids(paths: list[Path]) -> list[str]:
    return [f"{p.parent.name}/{p.stem}" for p in paths]
