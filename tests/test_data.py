"""Shape data: the grid, its fixed split, loading and errors."""

from __future__ import annotations

from collections import Counter

import pytest

from cudal2.data import BadShapeFile, bucket, grid_rows, load_shapes, write_csv
from tests.sandbox.corpus import ROOT


def test_committed_grid_matches_the_generator():
    assert load_shapes(ROOT / "data" / "grid.csv") == grid_rows()


def test_split_is_about_80_20_in_every_bucket():
    rows = grid_rows()
    assert len(rows) == 1000 and len({(r.M, r.N, r.K) for r in rows}) == 1000
    per_bucket = Counter((bucket(r.M, r.N, r.K), r.split) for r in rows)
    for name in {b for b, _ in per_bucket}:
        held, train = per_bucket[(name, "heldout")], per_bucket[(name, "train")]
        assert abs(held / (held + train) - 0.2) < 0.03


def test_split_filter_and_round_trip(tmp_path):
    path = tmp_path / "g.csv"
    write_csv(grid_rows()[:50], path)
    assert load_shapes(path) == grid_rows()[:50]
    assert all(r.split == "heldout" for r in load_shapes(path, "heldout"))


@pytest.mark.parametrize("body, message", [
    ("M,N,K,acc,split,source\n64,0,64,fp32,train,x\n", "g.csv:2"),
    ("M,N,K,acc,split,source\n64,64,64,bf8,train,x\n", "g.csv:2"),
    ("M,N\n1,2\n", "g.csv:2"),
])
def test_bad_rows_are_one_line_errors(tmp_path, body, message):
    path = tmp_path / "g.csv"
    path.write_text(body)
    with pytest.raises(BadShapeFile, match=message):
        load_shapes(path)


def test_missing_file(tmp_path):
    with pytest.raises(BadShapeFile, match="cannot read"):
        load_shapes(tmp_path / "nope.csv")
