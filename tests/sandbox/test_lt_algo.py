"""Decoding the harness's stored cuBLASLt algorithm (cudal2.sandbox.lt_algo): malformed input on any machine; the
decode itself where the cuBLAS library and headers are found (as for the harness build)."""

from __future__ import annotations

import pytest

from cudal2.sandbox.harness_build import find_cublas
from cudal2.sandbox.lt_algo import LtAlgo, LtDecodeError, decode

# The algorithm the harness autotuned for 256x512x12288 (fp32 accumulate) on the H200, as the committed grid store
# holds it (benchmarks/stores/h200_grid.sqlite.gz, algo_cache).
H200_256x512x12288 = ("420000001b0000002300000005000000020000000000000002000000000009000100000034fc0100020000000200"
                      "000002000200440000000000000000000000")


@pytest.mark.parametrize("bad, says", [("zz" * 64, "not a hex string"), ("00" * 63, "64 bytes, got 63")])
def test_malformed_algorithms_are_refused_in_one_line(bad, says):
    with pytest.raises(LtDecodeError, match=says) as info:
        decode(bad)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(find_cublas() is None, reason="no cuBLAS headers/libraries (set CUDAL2_CUBLAS_HOME)")
def test_decodes_tile_split_and_cluster_in_our_terms():
    # cuBLASLt's own terms for this one: tile 96x64 (its M is our N), split-K 5, cluster 2x4x1.
    assert decode(H200_256x512x12288) == LtAlgo(algo_id=66, tile_m=64, tile_n=96, splits=5,
                                                reduction="fp32 workspace", cluster_m=4, cluster_n=2)
