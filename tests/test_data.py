"""Shape data: the grid, its fixed split, loading and errors."""

from __future__ import annotations

from collections import Counter

import pytest

from cudal2.data import (
    COLUMNS,
    LLM_MODELS,
    TOKEN_COUNTS,
    BadShapeFile,
    ShapeRow,
    bucket,
    grid_rows,
    held_out,
    llm_rows,
    load_shape_spec,
    load_shapes,
    main,
    mnk_log2,
    to_dataset,
    write_csv,
)
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
    ("M,N\n1,2\n", "g.csv:1: no column K, acc, split: the header must be M,N,K,acc,split,source"),
    ("root:x:0:0:root:/root:/bin/bash\n", "g.csv:1: no column M, N, K, acc, split"),
    ("", "g.csv:1: no column M"),
])
def test_bad_rows_are_one_line_errors(tmp_path, body, message):
    path = tmp_path / "g.csv"
    path.write_text(body)
    with pytest.raises(BadShapeFile, match=message):
        load_shapes(path)


def test_missing_file(tmp_path):
    with pytest.raises(BadShapeFile, match="cannot read"):
        load_shapes(tmp_path / "nope.csv")


# -- LLM shapes ------------------------------------------------------------------------------------------------------

LLM_CSV = ROOT / "data" / "llm_shapes.csv"


def test_committed_llm_file_matches_the_generator_and_the_cli(tmp_path):
    assert load_shapes(LLM_CSV) == llm_rows()
    assert main(["llm", str(tmp_path / "llm.csv")]) == 0 and main(["grid", str(tmp_path / "grid.csv")]) == 0
    assert load_shapes(tmp_path / "llm.csv") == llm_rows() and load_shapes(tmp_path / "grid.csv") == grid_rows()


def test_llm_rows_follow_the_model_configs():
    by_shape = {(r.M, r.N, r.K): r.source.split(";") for r in llm_rows()}
    # Llama-3-8B: 32 heads x 128 = 4096 for q, 8 KV heads x 128 = 1024 for k/v, 14336 intermediate.
    assert by_shape[(16, 1024, 4096)] == ["Llama-3-8B/k_proj", "Llama-3-8B/v_proj",
                                          "Mistral-7B/k_proj", "Mistral-7B/v_proj"]
    assert "Llama-3-8B/down_proj" in by_shape[(1, 4096, 14336)]
    assert by_shape[(8192, 28672, 8192)] == ["Llama-3-70B/gate_proj", "Llama-3-70B/up_proj"]
    assert by_shape[(512, 512, 3584)] == ["Qwen2.5-7B/k_proj", "Qwen2.5-7B/v_proj"]
    assert by_shape[(128, 128, 896)] == ["Qwen2.5-0.5B/k_proj", "Qwen2.5-0.5B/v_proj"]
    # Mistral-Nemo: q/o are not square (32 x 128 = 4096 vs hidden 5120).
    assert by_shape[(2048, 4096, 5120)] == ["Mistral-Nemo-12B/q_proj"]
    assert by_shape[(2048, 5120, 4096)] == ["Mistral-Nemo-12B/o_proj"]


def test_llm_rows_one_row_per_shape_naming_every_layer():
    rows = llm_rows()
    shapes = [(r.M, r.N, r.K) for r in rows]
    assert len(shapes) == len(set(shapes))
    names = Counter(name for r in rows for name in r.source.split(";"))
    expected = {f"{m.name}/{layer}" for m in LLM_MODELS for layer, _, _ in m.linears()}
    # every (model, layer) at every token count exactly once
    assert set(names) == expected and set(names.values()) == {len(TOKEN_COUNTS)}
    assert {r.M for r in rows} == set(TOKEN_COUNTS) and {r.acc for r in rows} == {"fp32"}


def test_row_layers_parse_the_source():
    some = next(r for r in llm_rows() if ";" in r.source)
    assert len(some.layers) == some.source.count(";") + 1 and all(model and layer for model, layer in some.layers)
    assert ShapeRow(1, 1, 1, "fp32", "train", "Llama-3-8B/q_proj;Qwen2.5-7B/k_proj").layers == (
        ("Llama-3-8B", "q_proj"), ("Qwen2.5-7B", "k_proj"))
    assert ShapeRow(1, 1, 1, "fp32", "train", "cuda-l2-grid").layers == ()  # the grid names no layer
    assert ShapeRow(1, 1, 1, "fp32", "train", "").layers == ()


def test_llm_shapes_include_non_multiples_of_64():
    rows = llm_rows()
    assert any(r.M % 64 for r in rows)  # the decode token counts 1 and 16
    assert all(r.task for r in rows)  # and every row is a valid task


def test_llm_split_is_stratified_reproducible_and_agrees_with_the_grid():
    rows = llm_rows()
    assert rows == llm_rows()
    grid = {(r.M, r.N, r.K): r.split for r in grid_rows()}
    shared = [r for r in rows if (r.M, r.N, r.K) in grid]
    assert len(shared) == 16 and all(r.split == grid[(r.M, r.N, r.K)] for r in shared)
    per_bucket = Counter((bucket(r.M, r.N, r.K), r.split) for r in rows)
    for name in {b for b, _ in per_bucket}:
        held, train = per_bucket[(name, "heldout")], per_bucket[(name, "train")]
        pinned = sum(1 for r in shared if r.split == "heldout" and bucket(r.M, r.N, r.K) == name)
        assert held == max(pinned, round(0.2 * (held + train)))
    assert abs(sum(r.split == "heldout" for r in rows) / len(rows) - 0.2) < 0.03


def test_held_out_keeps_pinned_shapes():
    shapes = [(64, 64, k) for k in range(1, 11)]  # one bucket, 10 shapes: 2 held out
    default = held_out(shapes)
    others = sorted(set(shapes) - default)
    assert len(default) == 2
    assert held_out(shapes, {s: "heldout" for s in others[:3]}) == set(others[:3])  # quota met: none added
    one_pinned = held_out(shapes, {others[0]: "heldout"})
    assert len(one_pinned) == 2 and others[0] in one_pinned  # one more taken by hash order
    train_pinned = held_out(shapes, {s: "train" for s in default})
    assert len(train_pinned) == 2 and train_pinned.isdisjoint(default)


@pytest.mark.parametrize("path", [ROOT / "data" / "grid.csv", LLM_CSV])
def test_both_files_load_as_datasets(path):
    pytest.importorskip("datasets")
    ds = to_dataset(load_shapes(path))
    assert ds.column_names == list(COLUMNS)
    assert ds.num_rows == len(load_shapes(path))
    assert set(ds["split"]) == {"train", "heldout"}


# -- specs, splits, buckets --------------------------------------------------------------------------------------


def test_shape_spec_with_split_and_colon_in_path(tmp_path):
    path = tmp_path / "a:b.csv"
    write_csv(grid_rows()[:50], path)
    assert load_shape_spec(str(path)) == grid_rows()[:50]
    assert load_shape_spec(f"{path}:heldout") == [r for r in grid_rows()[:50] if r.split == "heldout"]
    with pytest.raises(BadShapeFile, match="unknown split 'held'"):
        load_shape_spec(f"{path}:held")
    with pytest.raises(BadShapeFile, match="cannot read"):
        load_shape_spec(str(tmp_path / "none.csv:train"))
    write_csv([r for r in grid_rows()[:50] if r.split == "train"], tmp_path / "t.csv")
    with pytest.raises(BadShapeFile, match="no shapes in split 'heldout'"):
        load_shape_spec(f"{tmp_path / 't.csv'}:heldout")


def test_bad_split_value_in_a_row(tmp_path):
    path = tmp_path / "g.csv"
    path.write_text("M,N,K,acc,split,source\n64,64,64,fp32,test,x\n")
    with pytest.raises(BadShapeFile, match="g.csv:2.*split 'test'"):
        load_shapes(path)


def test_bucket_edges_are_exact():
    assert bucket(256, 256, 255) == "< 2^24" and bucket(256, 256, 256) == "2^24-2^30"  # 256^3 = 2^24
    assert bucket(1024, 1024, 1023) == "2^24-2^30" and bucket(1024, 1024, 1024) == "2^30-2^36"
    assert bucket(4096, 4096, 4095) == "2^30-2^36" and bucket(4096, 4096, 4096) == ">= 2^36"
    assert mnk_log2(1, 1, 2**50 - 1) == 49  # a float log2 rounds this to 50.0
    assert mnk_log2(1, 1, 1) == 0
