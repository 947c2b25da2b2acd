"""Reading benchmarks/cublas_graph.cu's report of the kernels cuBLAS runs, and the algorithms they stand for."""

from __future__ import annotations

import pytest

from cudal2.sandbox.cublas_kernels import CublasKernelsError, Launch, as_lt_algo, cublas_algos, read_report
from cudal2.sandbox.lt_algo import LtAlgo

# Lines of the H200 run (fifteenth session, call 1), the long reduction kernel name cut short.
REPORT = """\
128x128x16384 nodes/call=2.00 programmatic_edges=64
  1.00/call  kernel _ZN8cublasLt19splitKreduce_kernelILi32ELi16EifEEvNS_18cublasSplitKParamsIT4_EE grid=4x8x1 block=512 cluster=0x0x0 smem=0 pdl=-1
  1.00/call  kernel nvjet_sm90_hsh_64x32_64x16_2x4_h_bz_splitK_TNT grid=8x12x1 block=384 cluster=8x1x1 smem=213444 pdl=-1
256x12288x2048 nodes/call=1.00 programmatic_edges=0
  1.00/call  kernel nvjet_sm90_hsh_192x128_64x5_1x2_h_bz_coopB_TNT grid=2x64x1 block=384 cluster=2x1x1 smem=221420 pdl=-1
4096x4096x4096 nodes/call=2.00 programmatic_edges=0
  1.00/call  kernel nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_TNT grid=2x66x1 block=384 cluster=2x1x1 smem=213188 pdl=-1
  1.00/call  memset
64x64x128 cublasGemmEx failed
"""


def test_report_gives_each_shapes_kernels_and_skips_other_nodes():
    shapes = read_report(REPORT)
    assert list(shapes) == [(128, 128, 16384), (256, 12288, 2048), (4096, 4096, 4096)]
    assert [x.name[:12] for x in shapes[(128, 128, 16384)]] == ["_ZN8cublasLt", "nvjet_sm90_h"]
    assert shapes[(4096, 4096, 4096)] == [Launch("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_TNT", (2, 66, 1))]


def test_nvjet_tiles_and_clusters_are_read_in_our_m_x_n_terms():
    # cuBLAS computes C^T: "192x128" is 192 along our N and 128 along our M; cluster "1x2" is 2 CTAs along our M.
    algos = cublas_algos(REPORT)
    assert algos[(256, 12288, 2048)] == LtAlgo(-1, 128, 192, 1, "none", 2, 1)
    assert algos[(4096, 4096, 4096)] == LtAlgo(-1, 128, 256, 1, "none", 2, 1)


def test_split_k_count_is_the_grid_over_the_output_tiles():
    # 128x128 in 32-row x 64-column tiles: 4 x 2 = 8 tiles; a grid of 8 x 12 CTAs is 12 K ranges.
    assert cublas_algos(REPORT)[(128, 128, 16384)] == LtAlgo(-1, 32, 64, 12, "fp32 workspace", 4, 2)
    assert as_lt_algo(Launch("_ZN8cublasLt19splitKreduce_kernel", (4, 8, 1)), 128, 128) is None
    assert as_lt_algo(Launch("sm90_xmma_gemm_f16f16_f32f32_tn_n_tilesize128x128x64", (1, 1, 1)), 64, 64) is None


def test_a_kernel_line_before_any_shape_is_an_error():
    with pytest.raises(CublasKernelsError, match="line 1: a kernel before any shape line"):
        read_report(REPORT.split("\n", 1)[1])
