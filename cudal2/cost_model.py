"""A learned cost model for the tuner: gradient-boosted regression trees that predict a config's time on a shape.

    store results (config, shape, median us) --ConfigFeatures--> X (rows x columns), y = ln(us)
        --GradientBoostedTrees.fit--> trees --predict--> ln(us) of configs never measured on a shape

Why: the GPU time of a tuning session is short (30 minutes, of which each sm90 config's compile takes ~40 s of one
core); the tuner must spend it on the configs most likely to beat a shape's incumbent. The wave model
(tune_search.estimate_us) ranks only the cuts of one kernel body; transfer borrows a neighbouring shape's winners as
they are. This model learns from every measurement of the store at once how each parameter and each cut behaves on
each shape (benchmarks/cost_model_check.py measures how well it ranks held-out shapes: benchmarks/RESULTS.md).

Plain numpy (no scikit-learn): the tuner runs on the GPU machine, which has no network and no scikit-learn. The trees
are grown level by level on binned features (at most MAX_BINS quantile bins per column), squared error on ln(us),
each tree full depth DEPTH with rows that a node does not split all sent left, so a tree is four flat arrays and a
prediction is DEPTH gathers per tree.

Features (one row per (config, shape)): log2 M, N, K; the family (one-hot); every parameter of every family's space
under its family's prefix (log2 of a positive number, -1 for 0 = "the library's choice", 0/1 for a bool, one-hot for
an enum; 0 where the row is another family's); and the cut's fit to the shape through the family's Tiling: log2 of
the CTA work units, the last wave's fill of the SMs, the share of the padded tiles that is real output, log2 of the K
blocks per unit, and log2 of the wave model's estimate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from cudal2.kernels.family import KernelFamily, Tiling, config_params
from cudal2.sandbox.types import Task

MAX_BINS = 64  # quantile bins per feature column: enough for every value of every parameter space (<= 14)
DEPTH = 8  # levels per tree (256 leaves)
TREES = 300
LEARNING_RATE = 0.1
MIN_LEAF = 4  # rows a split must leave on each side
L2 = 1.0  # ridge on a leaf's value: its mean residual shrinks towards 0 by n / (n + L2)
# Chosen with benchmarks/cost_model_check.py on the H200 store (5-fold by shape): depth 8 with leaves of 4 rows ranks
# held-out shapes' configs about as well as scikit-learn's HistGradientBoostingRegressor (400 iterations of 63
# leaves; top-1 pick 3.4% off the best against 3.5% here), depth 6 with leaves of 8 worse (4.3%).


class CostModelError(ValueError):
    """Too little to fit on, or a row that does not match the model's columns."""


@dataclass(frozen=True)
class _Tree:
    """A full binary tree of DEPTH levels in heap order (children of node i: 2i+1 and 2i+2)."""

    feature: np.ndarray  # (2**DEPTH - 1,) int: the column a node compares
    threshold: np.ndarray  # (2**DEPTH - 1,) int: rows whose bin is > threshold go right; MAX_BINS: all go left
    value: np.ndarray  # (2**DEPTH,) float: the leaves' contributions, learning rate applied


class GradientBoostedTrees:
    """Least-squares boosting of fixed-depth trees on binned columns. Deterministic: no sampling."""

    def __init__(self, trees: int = TREES, depth: int = DEPTH, learning_rate: float = LEARNING_RATE,
                 min_leaf: int = MIN_LEAF):
        self.n_trees, self.depth, self.learning_rate, self.min_leaf = trees, depth, learning_rate, min_leaf
        self._edges: list[np.ndarray] = []  # per column: the upper bin edges (a value > edges[b] is in a bin above b)
        self._base = 0.0
        self._trees: list[_Tree] = []

    def fit(self, x: np.ndarray, y: np.ndarray) -> GradientBoostedTrees:
        """`x`: (rows, columns) float; `y`: (rows,) the target (ln microseconds for the tuner)."""
        if x.ndim != 2 or y.shape != (x.shape[0],):
            raise CostModelError(f"fit wants x of (rows, columns) and y of (rows,), got {x.shape} and {y.shape}")
        if x.shape[0] < 2 * self.min_leaf:
            raise CostModelError(f"too few rows to fit a cost model: {x.shape[0]} (need {2 * self.min_leaf})")
        self._edges = [_bin_edges(col) for col in x.T]
        binned = self._bin(x)
        self._base = float(y.mean())
        residual = y - self._base
        self._trees = []
        for _ in range(self.n_trees):
            tree, leaf_of_row = self._grow(binned, residual)
            self._trees.append(tree)
            residual = residual - tree.value[leaf_of_row]
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        if not self._trees:
            raise CostModelError("predict before fit")
        if x.ndim != 2 or x.shape[1] != len(self._edges):
            raise CostModelError(f"predict wants (rows, {len(self._edges)}) columns, got {x.shape}")
        binned = self._bin(x)
        rows = np.arange(x.shape[0])
        out = np.full(x.shape[0], self._base)
        first_leaf = 2 ** self.depth - 1
        for tree in self._trees:
            node = np.zeros(x.shape[0], dtype=np.int64)
            for _ in range(self.depth):
                right = binned[rows, tree.feature[node]] > tree.threshold[node]
                node = 2 * node + 1 + right
            out += tree.value[node - first_leaf]
        return out

    def _bin(self, x: np.ndarray) -> np.ndarray:
        """(rows, columns) -> bin index per cell, uint8."""
        return np.stack([np.searchsorted(edges, col, side="left") for edges, col in zip(self._edges, x.T,
                                                                                            strict=True)],
                        axis=1).astype(np.uint8)

    def _grow(self, binned: np.ndarray, residual: np.ndarray) -> tuple[_Tree, np.ndarray]:
        """One tree fitted to `residual`; also each row's leaf (what the tree adds to its prediction)."""
        rows, cols = binned.shape
        inner = 2 ** self.depth - 1
        feature = np.zeros(inner, dtype=np.int64)
        threshold = np.full(inner, MAX_BINS, dtype=np.int64)  # a node left unsplit sends every row left
        node = np.zeros(rows, dtype=np.int64)  # each row's node on the current level, in heap numbering
        # Column c's bin b of row r lands in histogram cell (node, c, b): one bincount per level for every node.
        cell = np.arange(cols, dtype=np.int64) * MAX_BINS + binned.astype(np.int64)  # (rows, cols)
        for level in range(self.depth):
            first, width = 2 ** level - 1, 2 ** level
            slot = (node - first)[:, None] * (cols * MAX_BINS) + cell  # (rows, cols)
            size = width * cols * MAX_BINS
            grad = np.bincount(slot.ravel(), np.repeat(residual, cols), size).reshape(width, cols, MAX_BINS)
            count = np.bincount(slot.ravel(), None, size).reshape(width, cols, MAX_BINS)
            g_left, n_left = grad.cumsum(axis=2), count.cumsum(axis=2)  # rows with bin <= b go left
            g_all, n_all = g_left[:, :, -1:], n_left[:, :, -1:]
            g_right, n_right = g_all - g_left, n_all - n_left
            gain = g_left ** 2 / (n_left + L2) + g_right ** 2 / (n_right + L2) - g_all ** 2 / (n_all + L2)
            gain[(n_left < self.min_leaf) | (n_right < self.min_leaf)] = 0.0
            flat = gain.reshape(width, -1)
            best = flat.argmax(axis=1)
            split = flat[np.arange(width), best] > 1e-12
            ids = first + np.arange(width)
            feature[ids[split]] = best[split] // MAX_BINS
            threshold[ids[split]] = best[split] % MAX_BINS
            goes_right = binned[np.arange(rows), feature[node]] > threshold[node]
            node = 2 * node + 1 + goes_right
        leaf = node - inner
        sums = np.bincount(leaf, residual, 2 ** self.depth)
        counts = np.bincount(leaf, None, 2 ** self.depth)
        value = self.learning_rate * sums / (counts + L2)
        return _Tree(feature, threshold, value), leaf


def _bin_edges(col: np.ndarray) -> np.ndarray:
    """At most MAX_BINS - 1 edges: every distinct value when there are few, else quantiles."""
    distinct = np.unique(col)
    if len(distinct) <= MAX_BINS:
        return distinct[:-1]
    return np.unique(np.quantile(col, np.linspace(0, 1, MAX_BINS + 1)[1:-1]))


class ConfigFeatures:
    """Maps (config, shape) pairs to the model's feature rows (see the module docstring). The columns come from the
    families' parameter spaces, not from the data, so a model fitted on one store predicts any config of the space."""

    SHAPE = ("log2_m", "log2_n", "log2_k")
    CUT = ("log2_units", "last_wave_fill", "real_output_share", "log2_k_blocks", "log2_wave_model_us")

    def __init__(self, families: Sequence[KernelFamily], estimate_us: Callable[[Tiling, Task, int], float], sms: int):
        """`estimate_us`: the wave model of a cut on a shape with `sms` SMs (tune_search.estimate_us)."""
        self.estimate_us, self.sms = estimate_us, sms
        self.columns: list[str] = [*self.SHAPE, *self.CUT]
        self._param_columns: dict[str, dict[str, int | dict[object, int]]] = {}
        for family in families:
            self.columns.append(f"family={family.name}")
            per_param: dict[str, int | dict[object, int]] = {}
            for name, values in family.space().items():
                if values and isinstance(values[0], Enum):
                    per_param[name] = {v: self._add(f"{family.name}.{name}={v.value}") for v in values}
                else:
                    per_param[name] = self._add(f"{family.name}.{name}")
            self._param_columns[family.name] = per_param
        self._config_rows: dict[str, np.ndarray] = {}  # config name -> its family and parameter columns

    def _add(self, column: str) -> int:
        self.columns.append(column)
        return len(self.columns) - 1

    def matrix(self, pairs: Sequence[tuple[object, Task]]) -> np.ndarray:
        """(len(pairs), len(columns)) float64; `pairs`: (tune_search.Candidate, shape)."""
        x = np.zeros((len(pairs), len(self.columns)))
        for i, (cand, task) in enumerate(pairs):
            x[i] = self._config_row(cand)
            x[i, : len(self.SHAPE) + len(self.CUT)] = self._shape_and_cut(cand.family.tiling(cand.cfg), task)
        return x

    def _config_row(self, cand) -> np.ndarray:
        row = self._config_rows.get(cand.name)
        if row is not None:
            return row
        family = cand.family
        if family.name not in self._param_columns:
            raise CostModelError(f"config {cand.name}: family {family.name!r} is not one the model was built for")
        row = np.zeros(len(self.columns))
        row[self.columns.index(f"family={family.name}")] = 1.0
        params = config_params(cand.cfg)
        for name, where in self._param_columns[family.name].items():  # the searched parameters (family.space())
            value = params[name]
            if isinstance(where, dict):
                row[where[value]] = 1.0
            elif isinstance(value, bool):
                row[where] = float(value)
            else:
                row[where] = math.log2(value) if value > 0 else -1.0
        self._config_rows[cand.name] = row
        return row

    def _shape_and_cut(self, t: Tiling, task: Task) -> list[float]:
        tiles = math.ceil(task.m / t.bm) * math.ceil(task.n / t.bn)
        units = tiles * t.splits
        waves = math.ceil(units / self.sms)
        k_blocks = math.ceil(math.ceil(task.k / t.bk) / t.splits)
        real = task.m * task.n / (math.ceil(task.m / t.bm) * t.bm * math.ceil(task.n / t.bn) * t.bn)
        return [math.log2(task.m), math.log2(task.n), math.log2(task.k), math.log2(units), units / (waves * self.sms),
                real, math.log2(k_blocks), math.log2(self.estimate_us(t, task, self.sms))]
