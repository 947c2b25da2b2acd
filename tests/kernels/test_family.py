"""cudal2/kernels/family.py: the names configs print as, read back (`config_from_name`)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from cudal2.kernels.family import BadConfig, config_from_name, config_name
from cudal2.kernels.sm80 import Reduce, Sm80Family
from cudal2.kernels.sm90 import Sm90Family
from cudal2.kernels.small import SmallFamily

FAMILIES = (SmallFamily(), Sm80Family(), Sm90Family())


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_a_config_name_reads_back_as_its_config(family):
    rng = random.Random(0)
    configs = [family.default()]
    for _ in range(200):  # random points of the space, pruned or not: the name is read back either way
        configs.append(family.make({k: rng.choice(v) for k, v in family.space().items()}))
    for cfg in configs:
        assert config_from_name(family, config_name(family, cfg)) == cfg


def test_names_with_parameters_added_later_and_unsearched_flags_read_back():
    small, sm80, sm90 = FAMILIES
    grid = replace(small.default(), cluster_k=4, grid_k=8)
    assert config_from_name(small, config_name(small, grid)) == grid
    last = replace(sm80.default(), split_k=16, reduce=Reduce.LAST)
    assert config_from_name(sm80, config_name(sm80, last)) == last
    twin = replace(sm90.default(), host_cache=True)  # not in the searched space, but a valid config
    assert config_name(sm90, twin).endswith("-host_cache1")
    assert config_from_name(sm90, config_name(sm90, twin)) == twin


@pytest.mark.parametrize(("name", "message"), [
    ("sm80_mma-bm16-bn16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32", "is not a small config name"),
    ("small", "is not a small config name"),
    ("small-bm16-bn16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32-tile9", "'tile9' is no parameter"),
    ("small-bm17-bn16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32", "'bm17' is no parameter"),
    ("small-bm16-bm16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32", "bm given twice"),
    ("small-bm16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32", "missing parameter"),
    ("small-bn16-bm16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32", "is not as small names its configs"),
    ("small-bm16-bn16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32-grid_k1", "is not as small names its configs"),
])
def test_a_name_that_does_not_read_back_says_why(name, message):
    with pytest.raises(BadConfig, match=message):
        config_from_name(FAMILIES[0], name)
