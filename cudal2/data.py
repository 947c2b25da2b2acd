"""Shape data sets: the CUDA-L2 grid (1000 shapes) and the linear layers of open LLMs, each with a fixed
train / held-out split.

Split rule (fixed, documented, reproducible; `held_out`): shapes are bucketed by M*N*K into the leaderboard's size
buckets (< 2^24, 2^24-2^30, 2^30-2^36, >= 2^36); inside each bucket they are ordered by sha256 of "M_N_K" and the
first 20% (rounded) are held out. No randomness, so every machine and every session gets the same split.

The LLM set uses the same rule with one addition: a shape that is also in the grid keeps the grid's split (16 of
them, e.g. 512x4096x4096), so training on one file's train split never sees another file's held-out shape. Held
out by shape rather than by whole model because models share shapes (Mistral-7B's are all Llama-3-8B's) and
because holding out one of five models could not be stratified by size.

    python3 -m cudal2.data grid data/grid.csv          # regenerate the committed files
    python3 -m cudal2.data llm data/llm_shapes.csv
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from cudal2.sandbox.types import Acc, BadTask, Task

GRID_VALUES = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384)
HELD_OUT_FRACTION = 0.2
# (lo, hi, name): a shape is in the bucket when 2^lo <= M*N*K < 2^hi.
BUCKETS = ((0, 24, "< 2^24"), (24, 30, "2^24-2^30"), (30, 36, "2^30-2^36"), (36, 99, ">= 2^36"))
COLUMNS = ("M", "N", "K", "acc", "split", "source")
SPLITS = ("train", "heldout")
REQUIRED_COLUMNS = COLUMNS[:5]  # a shape file may leave out `source`
SOURCE_SEPARATOR = ";"  # between the names of the layers that share one shape

Shape = tuple[int, int, int]  # (M, N, K)


@dataclass(frozen=True)
class ShapeRow:
    M: int
    N: int
    K: int
    acc: str
    split: str  # "train" or "heldout"
    source: str  # "cuda-l2-grid", or "<model>/<layer>" names joined by ";" (every layer with this shape)

    @property
    def task(self) -> Task:
        return Task(self.M, self.N, self.K, Acc(self.acc))

    @property
    def layers(self) -> tuple[tuple[str, str], ...]:
        """The (model, layer) pairs `source` names, e.g. (("Llama-3-8B", "q_proj"), ("Llama-3-8B", "o_proj")); none
        for a grid row."""
        return tuple((model, layer) for model, _, layer in (name.partition("/") for name in self.source.split(";"))
                     if layer)


def mnk_log2(m: int, n: int, k: int) -> int:
    """floor(log2(M*N*K)), exactly (integer arithmetic: a float log2 rounds 2^50 - 1 up to 50.0).

    So `MNK < 2^e` is `mnk_log2 < e` and `MNK >= 2^e` is `mnk_log2 >= e`."""
    return (m * n * k).bit_length() - 1


def bucket(m: int, n: int, k: int) -> str:
    """The leaderboard size bucket of a shape, by M*N*K."""
    lg = mnk_log2(m, n, k)
    return next(name for lo, hi, name in BUCKETS if lo <= lg < hi)


def _split_order(shape: Shape) -> str:
    return hashlib.sha256("{}_{}_{}".format(*shape).encode()).hexdigest()


def held_out(shapes: Iterable[Shape], pinned: Mapping[Shape, str] | None = None) -> set[Shape]:
    """The held-out subset of `shapes` by the split rule above.

    Shapes in `pinned` keep the split given there; per bucket, the others are taken in sha256 order until
    round(20%) of the bucket is held out (none more if the pinned ones already reach that).
    """
    pinned = pinned or {}
    shapes = list(shapes)
    held: set[Shape] = set()
    for _, _, name in BUCKETS:
        members = [s for s in shapes if bucket(*s) == name]
        fixed_held = {s for s in members if pinned.get(s) == "heldout"}
        free = sorted((s for s in members if s not in pinned), key=_split_order)
        quota = round(HELD_OUT_FRACTION * len(members))
        held |= fixed_held | set(free[: max(0, quota - len(fixed_held))])
    return held


def grid_rows(acc: str = "fp32") -> list[ShapeRow]:
    shapes = [(m, n, k) for m in GRID_VALUES for n in GRID_VALUES for k in GRID_VALUES]
    held = held_out(shapes)
    return [ShapeRow(m, n, k, acc, "heldout" if (m, n, k) in held else "train", "cuda-l2-grid") for m, n, k in shapes]


@dataclass(frozen=True)
class ModelConfig:
    """The figures of a decoder-only model's config.json that fix its linear layers' shapes."""

    name: str
    hidden: int  # hidden_size
    intermediate: int  # intermediate_size (the MLP's gate/up width)
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads (grouped-query attention)
    head_dim: int  # head_dim, or hidden_size / num_attention_heads where the config has none
    qkv_bias: bool = False  # q/k/v projections carry a bias (Qwen2's architecture: its config.json does not say so)

    def linears(self) -> tuple[tuple[str, int, int], ...]:
        """(layer, out_features, in_features) of the projections of one decoder layer (all layers are alike)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return (
            ("q_proj", q, self.hidden), ("k_proj", kv, self.hidden), ("v_proj", kv, self.hidden),
            ("o_proj", self.hidden, q),
            ("gate_proj", self.intermediate, self.hidden), ("up_proj", self.intermediate, self.hidden),
            ("down_proj", self.hidden, self.intermediate),
        )  # fmt: skip

    def has_bias(self, layer: str) -> bool:
        """Whether the projection named `layer` (a name from linears()) adds a bias."""
        return self.qkv_bias and layer in ("q_proj", "k_proj", "v_proj")


# Published configs (config.json of each model on the Hugging Face Hub, at the URL given).
LLM_MODELS = (
    # https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json
    ModelConfig("Llama-3-8B", hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128),
    # https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json (same shapes as Llama-3-8B: it adds
    # its name to those rows, no new shape)
    ModelConfig("Mistral-7B", hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128),
    # https://huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json
    ModelConfig("Llama-3-70B", hidden=8192, intermediate=28672, heads=64, kv_heads=8, head_dim=128),
    # https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json
    ModelConfig("Qwen2.5-7B", hidden=3584, intermediate=18944, heads=28, kv_heads=4, head_dim=128, qkv_bias=True),
    # https://huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json
    ModelConfig("Qwen2.5-0.5B", hidden=896, intermediate=4864, heads=14, kv_heads=2, head_dim=64, qkv_bias=True),
    # https://huggingface.co/mistralai/Mistral-Nemo-Base-2407/blob/main/config.json (heads * head_dim = 4096 is
    # not hidden_size = 5120: q_proj and o_proj are not square)
    ModelConfig("Mistral-Nemo-12B", hidden=5120, intermediate=14336, heads=32, kv_heads=8, head_dim=128),
)
# M = tokens in one forward pass: 1 and 16 are decode steps (one sequence, a small batch), 128-8192 prefill chunks.
TOKEN_COUNTS = (1, 16, 128, 512, 2048, 8192)


def parse_token_counts(text: str) -> tuple[int, ...]:
    """'1,16,128' -> (1, 16, 128): token counts M for a --tokens option; ValueError (one line) otherwise."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--tokens wants comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"--tokens must be >= 1, got {text!r}")
    return values


def llm_rows(acc: str = "fp32") -> list[ShapeRow]:
    """Every (tokens, layer) GEMM of LLM_MODELS in the contract's layout: C[M,N] = A[M,K] B[N,K]^T with
    M = tokens, N = out_features, K = in_features (B is the nn.Linear weight as stored).

    One row per distinct shape: layers with the same shape (k/v, gate/up, one model's q/o, two models alike) do
    the same GEMM, so they share one row whose `source` names them all; a leaderboard mean thus weighs each
    distinct GEMM once. Rows are in first-seen order (model, layer, tokens).
    """
    sources: dict[Shape, list[str]] = {}
    for model in LLM_MODELS:
        for layer, out_features, in_features in model.linears():
            for tokens in TOKEN_COUNTS:
                sources.setdefault((tokens, out_features, in_features), []).append(f"{model.name}/{layer}")
    grid = {(r.M, r.N, r.K): r.split for r in grid_rows(acc)}
    held = held_out(sources, pinned={s: grid[s] for s in sources if s in grid})
    return [ShapeRow(*s, acc, "heldout" if s in held else "train", SOURCE_SEPARATOR.join(names))
            for s, names in sources.items()]


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
    if split is not None and split not in SPLITS:
        raise BadShapeFile(f"{path}: unknown split {split!r}: expected {' or '.join(SPLITS)}")
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            # A file without the columns (another CSV, a file given by mistake) is named as such once, not as a
            # KeyError on its first data row.
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise BadShapeFile(f"{path}:1: no column {', '.join(missing)}: the header must be {','.join(COLUMNS)}")
            rows = []
            for i, d in enumerate(reader, start=2):
                try:
                    row = ShapeRow(int(d["M"]), int(d["N"]), int(d["K"]), d["acc"], d["split"], d.get("source", ""))
                    row.task  # validates dimensions and acc  # noqa: B018
                    if row.split not in SPLITS:
                        raise ValueError(f"split {row.split!r} is not {' or '.join(SPLITS)}")
                except (TypeError, ValueError, BadTask) as e:  # TypeError: a short row (None in a column)
                    raise BadShapeFile(f"{path}:{i}: bad row ({e})") from None
                rows.append(row)
    except OSError as e:
        raise BadShapeFile(f"{path}: cannot read ({e.strerror})") from None
    return [r for r in rows if split is None or r.split == split]


def load_shape_spec(spec: str) -> list[ShapeRow]:
    """Rows named by a command-line spec `PATH` or `PATH:SPLIT` (e.g. data/grid.csv:heldout); BadShapeFile if none.

    A trailing `:SPLIT` is only taken as a split when PATH without it is a file, so paths with ':' still work.
    """
    path, _, split = spec.rpartition(":")
    if not path or not Path(path).is_file():
        path, split = spec, None
    rows = load_shapes(path, split)
    if not rows:
        raise BadShapeFile(f"{spec}: no shapes" + (f" in split {split!r}" if split else ""))
    return rows


def to_dataset(rows: list[ShapeRow]):
    """A datasets.Dataset with columns M, N, K, acc, split, source (either file: the grid or the LLM shapes)."""
    from datasets import Dataset

    return Dataset.from_dict({c: [getattr(r, c) for r in rows] for c in COLUMNS})


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m cudal2.data", description="write a shape data set as CSV")
    sub = parser.add_subparsers(dest="shape_set", required=True)
    for name, rows, help_text in (("grid", grid_rows, "the CUDA-L2 1000-shape grid"),
                                  ("llm", llm_rows, "linear layers of open LLMs at several token counts")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("path", type=Path, help="CSV file to write")
        p.set_defaults(rows=rows)
    args = parser.parse_args(argv)
    write_csv(args.rows(), args.path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
