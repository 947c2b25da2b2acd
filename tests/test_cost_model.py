"""cudal2.cost_model: the boosted trees learn a known function and refuse bad input; the feature rows follow the
families' parameter spaces."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudal2.cost_model import ConfigFeatures, CostModelError, GradientBoostedTrees
from cudal2.kernels.family import config_params
from cudal2.kernels.sm80 import Sm80Family
from cudal2.kernels.sm90 import Sm90Family
from cudal2.kernels.small import SmallFamily
from cudal2.sandbox.types import Task
from cudal2.tune_search import Candidate, estimate_us

SMALL, SM80, SM90 = SmallFamily(), Sm80Family(), Sm90Family()


def _data(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A step in column 0 (ten values, like a parameter's), an interaction of columns 1 and 2, and a column 3 of
    noise the trees must ignore."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, size=(rows, 4))
    x[:, 0] = rng.integers(0, 10, rows) / 10
    y = 2.0 * (x[:, 0] > 0.5) + np.sin(3 * x[:, 1]) * x[:, 2]
    return x, y


def test_trees_learn_a_nonlinear_function_and_generalise():
    x, y = _data(3000, 0)
    x_test, y_test = _data(1000, 1)
    model = GradientBoostedTrees(trees=100).fit(x, y)
    error = np.sqrt(np.mean((model.predict(x_test) - y_test) ** 2))
    assert error < 0.1 * y_test.std()  # the constant predictor's error is y's standard deviation
    again = GradientBoostedTrees(trees=100).fit(x, y)
    assert np.array_equal(model.predict(x_test), again.predict(x_test))  # no sampling: the same fit twice


def test_a_split_needs_min_leaf_rows_on_each_side():
    """One outlier row cannot get a leaf of its own: the tree would memorise a measurement's noise."""
    x = np.arange(40, dtype=float)[:, None]
    y = np.zeros(40)
    y[0] = 100.0
    model = GradientBoostedTrees(trees=50, min_leaf=4).fit(x, y)
    assert model.predict(x[:1])[0] < 50.0  # shared with at least 3 rows of 0


@pytest.mark.parametrize("x, y, match", [
    (np.zeros((10,)), np.zeros(10), "fit wants"),
    (np.zeros((10, 2)), np.zeros(9), "fit wants"),
    (np.zeros((3, 2)), np.zeros(3), "too few rows"),
])
def test_fit_refuses_bad_shapes(x, y, match):
    with pytest.raises(CostModelError, match=match):
        GradientBoostedTrees().fit(x, y)


def test_predict_refuses_before_fit_and_with_other_columns():
    with pytest.raises(CostModelError, match="before fit"):
        GradientBoostedTrees().predict(np.zeros((1, 3)))
    x, y = _data(200, 0)
    model = GradientBoostedTrees(trees=5).fit(x, y)
    with pytest.raises(CostModelError, match=r"\(rows, 4\) columns"):
        model.predict(np.zeros((1, 3)))


def _features() -> ConfigFeatures:
    return ConfigFeatures((SMALL, SM80, SM90), estimate_us, 132)


def test_feature_rows_follow_the_families_spaces():
    features = _features()
    cols = features.columns
    assert len(cols) == len(set(cols))
    for family in (SMALL, SM80, SM90):
        assert f"family={family.name}" in cols
        for name in family.space():
            assert any(c == f"{family.name}.{name}" or c.startswith(f"{family.name}.{name}=") for c in cols)
    sm90 = Candidate(SM90, SM90.make({**config_params(SM90.default()), "bn": 128, "stages": 0, "swap_ab": True}))
    task = Task(4096, 2048, 1024)
    row = dict(zip(cols, features.matrix([(sm90, task)])[0], strict=True))
    assert (row["log2_m"], row["log2_n"], row["log2_k"]) == (12.0, 11.0, 10.0)
    assert row["family=sm90_wgmma"] == 1.0 and row["family=sm80_mma"] == 0.0
    assert row["sm90_wgmma.bn"] == 7.0 and row["sm90_wgmma.stages"] == -1.0  # 0 = the library's choice
    assert row["sm90_wgmma.swap_ab"] == 1.0 and row[f"sm90_wgmma.schedule={sm90.cfg.schedule.value}"] == 1.0
    assert all(v == 0.0 for c, v in row.items() if c.startswith(("sm80_mma.", "small.")))
    t = SM90.tiling(sm90.cfg)
    units = math.ceil(4096 / t.bm) * math.ceil(2048 / t.bn) * t.splits
    assert row["log2_units"] == math.log2(units)
    assert row["last_wave_fill"] == units / (132 * math.ceil(units / 132))
    assert row["log2_wave_model_us"] == pytest.approx(math.log2(estimate_us(t, task, 132)))
    # a parameter the family does not search (sm90's host_cache) has no column: the twins get one row
    twin = Candidate(SM90, SM90.make({**config_params(sm90.cfg), "host_cache": True}))
    assert (features.matrix([(twin, task)]) == features.matrix([(sm90, task)])).all()


def test_a_padded_cut_shows_its_waste():
    features = _features()
    cand = Candidate(SM80, SM80.default())
    t = SM80.tiling(cand.cfg)
    row = dict(zip(features.columns, features.matrix([(cand, Task(t.bm + 1, t.bn, 4096))])[0], strict=True))
    assert row["real_output_share"] == pytest.approx((t.bm + 1) / (2 * t.bm))


def test_a_family_the_features_were_not_built_for_is_refused():
    features = ConfigFeatures((SM80,), lambda t, task, sms: 1.0, 132)
    with pytest.raises(CostModelError, match="family 'sm90_wgmma' is not one"):
        features.matrix([(Candidate(SM90, SM90.default()), Task(128, 128, 128))])
