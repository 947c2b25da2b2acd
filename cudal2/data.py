"""Shape data sets: the CUDA-L2 grid (1000 shapes) with a fixed train / held-out split.

Split rule (fixed, documented, reproducible): shapes are bucketed by log2(M*N*K) into the leaderboard's size
buckets (< 2^24, 2^24-2^30, 2^30-2^36, >= 2^36); inside each bucket they are ordered by sha256 of "M_N_K" and the
first 20% (rounded) are held out. No randomness, so every machine and every session gets the same split.

    python3 -m cudal2.data write data/grid.csv      # regenerates the committed file
"""

from __future__ import annotations

import csv
import hashlib
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from cudal2.sandbox.types import Acc, BadTask, Task

GRID_VALUES = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384)
HELD_OUT_FRACTION = 0.2
BUCKETS = ((0, 24, "< 2^24"), (24, 30, "2^24-2^30"), (30, 36, "2^30-2^36"), (36, 99, ">= 2^36"))
COLUMNS = ("M", "N", "K", "acc", "split", "source")


@dataclass(frozen=True)
class ShapeRow:
    M: int
    N: int
    K: int
    acc: str
    split: str  # "train" or "heldout"
    source: str  # where the shape comes from: "cuda-l2-grid", or "<model> <layer>"

    @property
    def task(self) -> Task:
        return Task(self.M, self.N, self.K, Acc(self.acc))


def bucket(m: int, n: int, k: int) -> str:
    """The leaderboard size bucket of a shape, by log2(M*N*K)."""
    lg = math.log2(m * n * k)
    return next(name for lo, hi, name in BUCKETS if lo <= lg < hi)


def grid_rows(acc: str = "fp32") -> list[ShapeRow]:
    shapes = [(m, n, k) for m in GRID_VALUES for n in GRID_VALUES for k in GRID_VALUES]
    held: set[tuple[int, int, int]] = set()
    for _, _, name in BUCKETS:
        members = sorted((s for s in shapes if bucket(*s) == name),
                         key=lambda s: hashlib.sha256(f"{s[0]}_{s[1]}_{s[2]}".encode()).hexdigest())
        held.update(members[: round(HELD_OUT_FRACTION * len(members))])
    return [ShapeRow(m, n, k, acc, "heldout" if (m, n, k) in held else "train", "cuda-l2-grid") for m, n, k in shapes]


def write_csv(rows: list[ShapeRow], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))


class BadShapeFile(ValueError):
    """A shape file that cannot be read (one-line message with the file and row)."""


def load_shapes(path: str | Path, split: str | None = None) -> list[ShapeRow]:
    """Rows of a shape CSV (columns M,N,K,acc,split,source), optionally one split only."""
    path = Path(path)
    try:
        with open(path, newline="") as f:
            rows = []
            for i, d in enumerate(csv.DictReader(f), start=2):
                try:
                    row = ShapeRow(int(d["M"]), int(d["N"]), int(d["K"]), d["acc"], d["split"], d.get("source", ""))
                    row.task  # validates dimensions and acc  # noqa: B018
                except (KeyError, TypeError, ValueError, BadTask) as e:
                    raise BadShapeFile(f"{path}:{i}: bad row ({e})") from None
                rows.append(row)
    except OSError as e:
        raise BadShapeFile(f"{path}: cannot read ({e.strerror})") from None
    return [r for r in rows if split is None or r.split == split]


def to_dataset(rows: list[ShapeRow]):
    """A datasets.Dataset with columns M, N, K, acc, split, source."""
    from datasets import Dataset

    return Dataset.from_dict({c: [getattr(r, c) for r in rows] for c in COLUMNS})


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "write":
        print("usage: python3 -m cudal2.data write PATH.csv", file=sys.stderr)
        return 2
    write_csv(grid_rows(), Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
