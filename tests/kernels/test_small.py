"""The small family (single-launch kernels for launch-bound shapes): space, configs, pruning, generated sources
(static rules, nvcc for sm_80 and sm_90a, the CPU emulator on odd shapes) and, on a GPU, correctness and speed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cudal2.kernels.family import Tiling, config_name, config_params
from cudal2.kernels.small import SmallConfig, SmallFamily
from cudal2.sandbox.evaluator import EvalOptions, Evaluator, source_hash
from cudal2.sandbox.types import Acc, Status, Task
from tests.kernels import emulator, family_checks

FAMILY = SmallFamily()
DEFAULT = FAMILY.default()


def cfg(**changes) -> SmallConfig:
    return replace(DEFAULT, **changes)


# grid_k: 8 groups of one CTA per 16x32 tile, summed by the last to arrive (any arch); 2 groups of 4-CTA clusters
# (sm_90a). Emulated with two calls each: a ticket left nonzero, or a sum that depends on which group arrives last
# (the emulator runs the clusters in a new random order each launch), changes the second call's C.
GRID_8 = cfg(bm=16, bn=32, warps_m=1, warps_n=2, warps_k=4, grid_k=8)
GRID_2_CLUSTER_4 = cfg(bm=16, bn=16, warps_m=1, warps_n=1, warps_k=2, cluster_k=4, grid_k=2)
# GRID_8 with spread: where the grid fits the GPU at once, all 8 groups wait for one another and each sums an eighth.
SPREAD_8 = replace(GRID_8, spread=True)
# The C tile stored through shared memory in 16-byte row chunks: the default (2 K-warps, both store), a 64x128 tile of
# 8 warps (the widest rows), and a 16x8 tile (one chunk per row) over 16 K-warps.
STAGED = [cfg(stage_c=True),
          cfg(bm=64, bn=128, warps_m=2, warps_n=4, warps_k=1, k_unroll=4, stage_c=True),
          cfg(bm=16, bn=8, warps_m=1, warps_n=1, warps_k=16, stage_c=True)]

# The default; one warp per 16x16 tile with an 8-way K split (long K, tiny MN); a 16x8 tile (one mma per k-step)
# over 16 K-warps (the space's widest split); the 16x8 tile at the deepest unroll (4 K-warps x 8 steps: a 1024-column
# batch, longer than most test shapes' K); 64x128 tiles, 8 warps, deep unroll, fp16 accumulation; the default's tile
# cut over a cluster of 4 CTAs (sm_90a only); GRID_8.
SAMPLE = [
    DEFAULT,
    cfg(bm=16, bn=16, warps_m=1, warps_n=1, warps_k=8, k_unroll=2),
    cfg(bm=16, bn=8, warps_m=1, warps_n=1, warps_k=16, k_unroll=1),
    cfg(bm=16, bn=8, warps_m=1, warps_n=1, warps_k=4, k_unroll=8),
    cfg(bm=64, bn=128, warps_m=2, warps_n=4, warps_k=1, k_unroll=4, acc=Acc.FP16),
    cfg(cluster_k=4),
    GRID_8,
]
# A 16x16 tile on 16 CTAs, over the portable cluster size (the non-portable opt-in): long K on a tiny output. The CPU
# emulator runs its 16 x 128 threads per cluster as OS threads, so it takes the shapes with few tiles only.
CLUSTER_16 = cfg(bm=16, bn=16, warps_m=1, warps_n=1, warps_k=4, cluster_k=16)
CLUSTER_16_SHAPES = [s for s in family_checks.EMU_SHAPES if s[0] * s[1] <= 40 * 40]
# The same cut summed in the push form: each CTA stores its sums into the owners' shared memory, one barrier.
PUSH_16 = replace(CLUSTER_16, push=True)
# The long-K winners' tiling (16x16, 8 K-warps, k_unroll 2) over a 16-CTA cluster, pushed: the GPU tests' only.
PUSH_16_K8 = cfg(bm=16, bn=16, warps_m=1, warps_n=2, warps_k=8, k_unroll=2, cluster_k=16, push=True)
GRID_SHAPES = [s for s in family_checks.EMU_SHAPES if s[0] * s[1] <= 80 * 100]
# exact: 64^3's winner's tiling with the unchecked instantiation. 64x64x64 and 128x96x256 fit its tiles and run it;
# a C one half off its alignment, a K that is not a multiple of 64, and the odd shapes take the general paths.
EXACT = cfg(bm=16, bn=32, warps_m=1, warps_n=4, warps_k=1, k_unroll=2, exact=True)
EXACT_SHAPES = [(64, 64, 64, (0, 0, 0)), (128, 96, 256, (0, 0, 0)), (64, 64, 64, (0, 0, 1)), (64, 64, 96, (0, 0, 0))]
# exact on a cut tile (2 groups of 4-CTA clusters): unchecked loads, the sums stored with their checks. 32x32x512 and
# 16x48x256 fit its tiles; an A one half off its alignment and the odd shapes take the general paths.
EXACT_PARKED = replace(GRID_2_CLUSTER_4, exact=True)
EXACT_PARKED_SHAPES = [(32, 32, 512, (0, 0, 0)), (16, 48, 256, (0, 0, 0)), (32, 32, 512, (1, 0, 0)), (33, 17, 333, (0, 0, 0))]
# loop_unroll: the main K loop unrolled by hand, once on the exact tiling and once on a pushed 4-CTA cluster.
UNROLLED = replace(EXACT, loop_unroll=2)
UNROLLED_PUSH = cfg(bm=16, bn=16, warps_m=1, warps_n=1, warps_k=2, cluster_k=4, push=True, loop_unroll=4)

# Sources of the committed H200 store (benchmarks/stores), measured before cluster_k existed: their configs must
# render to them byte for byte, or the stored results would no longer be theirs.
STORED_RENDERS = [
    ({}, "47838c4c6f12e320e177ea36ca278bc533777718d6d5fa20431c779cba0a5b3a"),  # the default
    ({"bm": 32, "bn": 32, "warps_m": 1, "warps_n": 2, "warps_k": 8, "k_unroll": 2},
     "310267d17dc1bde5346ece6541f447bc0f983fcce1672bf8088a1fd8a1866538"),
]


def test_every_space_value_renders():
    family_checks.every_value_renders(FAMILY)


def test_bad_params_raise_bad_config():
    family_checks.rejects_bad_params(FAMILY)


def test_fp16_accumulation_only_for_fp16_tasks():
    family_checks.fp16_only_for_fp16_tasks(FAMILY)


def test_large_shapes_are_left_to_the_tiled_families():
    assert FAMILY.supports(DEFAULT, Task(1024, 1024, 1024)) is None
    assert "not launch-bound" in FAMILY.supports(DEFAULT, Task(1024, 1024, 2048))


@pytest.mark.parametrize(("config", "reason"), [
    (cfg(warps_m=4, warps_n=4, warps_k=8, bm=128, bn=128), "4096 threads per block"),
    (cfg(bm=16, warps_m=2), "does not split into m16n8k16"),
    (cfg(bn=16, warps_n=4), "does not split into m16n8k16"),
    (cfg(bm=128, bn=128, warps_m=1, warps_n=1, warps_k=1), "registers estimate"),
    (cfg(bm=64, bn=64, warps_m=1, warps_n=1, warps_k=8), "over the 49152 B static limit"),
    (cfg(bm=64, bn=128, warps_m=4, warps_n=4, warps_k=2, k_unroll=4), "a block of 1024 threads allows"),
])
def test_invalid_configs_are_pruned_with_the_reason(config, reason):
    why = FAMILY.prune(config, "sm_90a")
    assert why is not None and reason in why, why


def test_configs_stored_before_cluster_k_render_byte_for_byte():
    for changes, stored_hash in STORED_RENDERS:
        params = {k: v for k, v in config_params(cfg(**changes)).items() if k != "cluster_k"}  # as stored
        assert source_hash(FAMILY.render(FAMILY.make(params))) == stored_hash, changes
    assert "cluster" not in FAMILY.render(DEFAULT).lower() and "cluster_k" not in config_name(FAMILY, DEFAULT)


def test_cluster_k_cuts_k_over_a_cluster_in_one_launch():
    source = FAMILY.render(cfg(cluster_k=4))
    for text in ("constexpr int CLUSTER_K = 4;", "cudaLaunchAttributeClusterDimension", "barrier.cluster.arrive.release",
                 "mapa.shared::cluster", "const int k_end = min(K, k_begin + k_range);", "cluster_k   = 4",
                 "through distributed shared memory"):
        assert text in source, text
    assert "NonPortableClusterSize" not in source and "cudal2_workspace_bytes" not in source
    assert "cudaFuncAttributeNonPortableClusterSizeAllowed, 1" in FAMILY.render(CLUSTER_16)
    assert config_name(FAMILY, cfg(cluster_k=4)).endswith("-cluster_k4")
    assert FAMILY.tiling(cfg(cluster_k=4)) == Tiling(32, 64, 64, 4, cluster_reduce=True)
    assert FAMILY.tiling(DEFAULT) == Tiling(32, 64, 64)
    assert cfg(cluster_k=4).reduce_smem_bytes == 2 * 32 * 64 * 4 + 16  # both K-warps' partials (the cluster reads them)
    assert "thread-block clusters" in FAMILY.prune(cfg(cluster_k=2), "sm_80")


def test_grid_k_sums_groups_by_the_last_arrival_in_one_launch():
    source = FAMILY.render(GRID_8)
    for text in ("constexpr int GRID_K = 8;", "__device__ unsigned int g_tickets[MAX_TICKETS];", "last_arrival(ticket, GRID_K, flag)",
                 "ticket_reset(ticket)", 'extern "C" size_t cudal2_workspace_bytes', "grid_k      = 8",
                 "CLUSTER_K * (unsigned)plan_groups(M, N)", "__syncthreads();  // every K-warp's partial parked"):
        assert text in source, text
    assert "cudaLaunchAttributeClusterDimension" not in source and "mapa" not in source  # no cluster: sm_80 too
    assert FAMILY.prune(GRID_8, "sm_80") is None
    assert "cudaLaunchAttributeClusterDimension" in FAMILY.render(GRID_2_CLUSTER_4)
    assert config_name(FAMILY, GRID_8).endswith("-grid_k8")
    assert FAMILY.tiling(GRID_8) == Tiling(16, 32, 128, 8, last_arrival=True)
    assert FAMILY.tiling(GRID_2_CLUSTER_4) == Tiling(16, 16, 64, 8, last_arrival=True)
    assert GRID_8.reduce_smem_bytes == 4 * 16 * 32 * 4 + 16  # every K-warp's partial and the flag


def test_grid_k_parks_every_k_warp_within_the_shared_memory_limit():
    # All 8 K-warps of a 32x64 fp32 tile park 64 KiB (over 48 KiB); 4 park 32 KiB and the flag. Without grid_k the
    # same 4 K-warps park 3 tiles (K-warp 0 keeps its own in registers).
    assert "static limit" in FAMILY.prune(cfg(warps_k=8, grid_k=2), "sm_90a")
    assert FAMILY.prune(cfg(warps_k=4, grid_k=2), "sm_90a") is None
    assert cfg(warps_k=4, grid_k=2).reduce_smem_bytes == 4 * 32 * 64 * 4 + 16
    assert cfg(warps_k=4).reduce_smem_bytes == 3 * 32 * 64 * 4


def test_source_is_one_launch_without_workspace():
    source = FAMILY.render(DEFAULT)
    assert source.count("<<<") == 3  # the three load paths, one launched per call
    assert "cudal2_workspace_bytes" not in source and "cudaFuncSetAttribute" not in source
    for text in ("constexpr int WARPS_K = 2;", "LOAD_VEC16", "LOAD_SCALAR", "Fragment layouts", "K reduction"):
        assert text in source, text


@pytest.mark.nvcc
def test_sample_compiles_for_sm80_and_sm90a(tmp_path):
    family_checks.compile_sample(FAMILY, SAMPLE, tmp_path / "build")


@pytest.mark.nvcc
def test_sample_is_correct_in_the_cpu_emulator(tmp_path):
    family_checks.emulate_many(FAMILY, SAMPLE, tmp_path)


@pytest.mark.nvcc
def test_a_16_cta_cluster_compiles_and_is_correct_in_the_cpu_emulator(tmp_path):
    family_checks.compile_sample(FAMILY, [CLUSTER_16], tmp_path / "build")
    family_checks.emulate(FAMILY, CLUSTER_16, tmp_path, CLUSTER_16_SHAPES)


def test_push_sums_the_cluster_into_each_owners_shared_memory_behind_one_barrier():
    source, pulled = FAMILY.render(PUSH_16), FAMILY.render(CLUSTER_16)
    for text in ("barrier.cluster.arrive.relaxed.aligned", "st.shared::cluster.v2.f32", "cluster_wait();  // every CTA",
                 "push        = True", "K reduction (4 K-warps x 16 CTAs, pushed)", "cudaLaunchAttributeClusterDimension",
                 "cudaFuncAttributeNonPortableClusterSizeAllowed, 1"):
        assert text in source, text
    assert source.count("cluster_sync();") == 1 and "ld_cluster_f2(base" not in source  # one barrier, no remote reads
    assert pulled.count("cluster_sync();") == 2 and "st.shared::cluster" not in pulled
    assert config_name(FAMILY, PUSH_16).endswith("-cluster_k16-push1")
    # every K-warp's partial (4 x 16x16 fp32), the inbox (16 CTAs x 8 pairs of 8 B), the flag
    assert PUSH_16.reduce_smem_bytes == 4 * 16 * 16 * 4 + 16 * 8 * 8 + 16
    assert "with cluster_k = 1 there is none" in FAMILY.prune(cfg(push=True), "sm_90a")
    assert "with grid_k" in FAMILY.prune(replace(GRID_2_CLUSTER_4, push=True), "sm_90a")
    assert "thread-block clusters" in FAMILY.prune(PUSH_16, "sm_80")


@pytest.mark.nvcc
def test_push_compiles_and_is_correct_in_the_cpu_emulator(tmp_path):
    """16 CTAs of a cluster at once, each its own shared memory (poisoned): a store into the wrong row of an inbox, or
    the sums read before the barrier, leave NaN or wrong pairs."""
    family_checks.compile_sample(FAMILY, [PUSH_16, PUSH_16_K8], tmp_path / "build")
    family_checks.emulate(FAMILY, PUSH_16, tmp_path, CLUSTER_16_SHAPES)


def test_exact_adds_an_unchecked_instantiation_for_calls_whose_tiles_fit():
    source, plain = FAMILY.render(EXACT), FAMILY.render(replace(EXACT, exact=False))
    for text in ("constexpr int LOAD_EXACT = 3;", "small_hgemm_kernel<LOAD_EXACT><<<", "store_exact<kLoad>(C, M, N, vec, ",
                 "M % BM == 0 && N % BN == 0 && K % K_CHUNK == 0 && ab % 16 == 0 && vec_store", "exact       = True",
                 "runs one more instantiation, LOAD_EXACT"):
        assert text in source, text
    assert source.count("<<<") == 4 and plain.count("<<<") == 3
    assert "EXACT" not in plain and "exact" not in plain  # configs without it render as they always did
    assert config_name(FAMILY, EXACT).endswith("-k_unroll2-accfp32-exact1")
    assert "exact drops the bounds checks" in FAMILY.prune(cfg(stage_c=True, exact=True), "sm_90a")
    assert FAMILY.prune(EXACT, "sm_80") is None


def test_exact_on_a_cut_tile_adds_unchecked_loads_and_keeps_the_checked_stores():
    source, plain = FAMILY.render(EXACT_PARKED), FAMILY.render(GRID_2_CLUSTER_4)
    line = ("    if (M % BM == 0 && N % BN == 0 && K % K_CHUNK == 0 && ab % 16 == 0)  // every tile inside: unchecked loads\n"
            "        return launch_parked<LOAD_EXACT>(grid, A, B, C, M, N, K, vec_store, ws, stream);\n")
    assert line in source and "constexpr int LOAD_EXACT = 3;" in source and "whose loads have no bounds checks" in source
    assert "store_exact" not in source and "EXACT" not in plain
    assert FAMILY.prune(EXACT_PARKED, "sm_90a") is None and FAMILY.prune(replace(GRID_8, exact=True), "sm_80") is None
    assert "launch_parked<LOAD_EXACT>(grid, A, B, C, M, N, K, vec_store, stream)" in FAMILY.render(
        cfg(cluster_k=4, push=True, exact=True))  # no workspace: no ws argument


@pytest.mark.nvcc
def test_exact_on_a_cut_tile_is_correct_in_the_cpu_emulator(tmp_path):
    family_checks.compile_sample(FAMILY, [EXACT_PARKED, replace(GRID_8, exact=True)], tmp_path / "build")
    family_checks.emulate(FAMILY, EXACT_PARKED, tmp_path, EXACT_PARKED_SHAPES, calls=2)
    _only_the_fitting_shapes_run_unchecked(EXACT_PARKED, EXACT_PARKED_SHAPES, tmp_path)


def _only_the_fitting_shapes_run_unchecked(config: SmallConfig, shapes, workdir) -> None:
    """With the unchecked load's rows swapped in pairs, the first two of `shapes` (they fit the tiles and are aligned)
    come out wrong and the other two, on the general paths, stay right."""
    broken = FAMILY.render(config).replace("(X + (size_t)r * (size_t)K + k)", "(X + (size_t)(r ^ 1) * (size_t)K + k)")
    assert broken.count("(r ^ 1)") == 1
    (workdir / "broken").mkdir()
    exe = emulator.build(broken, Acc.FP32, workdir / "broken")
    assert [emulator.run(exe, m, n, k, offsets).rel_err > 2e-3 for m, n, k, offsets in shapes] == [True, True, False, False]


@pytest.mark.nvcc
def test_exact_is_correct_on_fitting_and_odd_shapes_in_the_cpu_emulator(tmp_path):
    family_checks.compile_sample(FAMILY, [EXACT], tmp_path / "build")
    family_checks.emulate(FAMILY, EXACT, tmp_path, [*EXACT_SHAPES, *family_checks.EMU_SHAPES])
    _only_the_fitting_shapes_run_unchecked(EXACT, EXACT_SHAPES, tmp_path)


def test_loop_unroll_puts_a_pragma_before_the_main_k_loop_only_where_set():
    for config, loop in ((UNROLLED, "for (int kc = wk * K_CHUNK; kc < K;"), (UNROLLED_PUSH, "for (int kc = k_begin +")):
        source = FAMILY.render(config)
        pragma = f"#pragma unroll {config.loop_unroll}  // loop_unroll\n    {loop}"
        assert source.count("// loop_unroll\n") == 1 and pragma in source, config
        assert FAMILY.render(replace(config, loop_unroll=0)) == source.replace(pragma, loop).replace(
            f"-loop_unroll{config.loop_unroll}", "").replace(f"\n//   loop_unroll = {config.loop_unroll}", "")
    assert config_name(FAMILY, UNROLLED).endswith("-exact1-loop_unroll2")


@pytest.mark.nvcc
def test_loop_unroll_compiles_and_is_correct_in_the_cpu_emulator(tmp_path):
    family_checks.compile_sample(FAMILY, [UNROLLED, UNROLLED_PUSH], tmp_path / "build")
    family_checks.emulate(FAMILY, UNROLLED, tmp_path, EXACT_SHAPES[:2] + [family_checks.EMU_SHAPES[0]])


@pytest.mark.nvcc
def test_grid_k_is_correct_and_leaves_its_tickets_at_zero_in_the_cpu_emulator(tmp_path):
    family_checks.compile_sample(FAMILY, [GRID_2_CLUSTER_4], tmp_path / "build")
    for name, config, shapes in (("grid8", GRID_8, GRID_SHAPES), ("grid2c4", GRID_2_CLUSTER_4, GRID_SHAPES[:3])):
        (tmp_path / name).mkdir()
        family_checks.emulate(FAMILY, config, tmp_path / name, shapes, calls=2)


def test_spread_renders_a_cooperative_launch_only_for_its_configs():
    source = FAMILY.render(SPREAD_8)
    for text in ("all_arrived(ticket, GRID_K)", "if (spread) all_arrived", "cudaLaunchAttributeCooperative",
                 "<= coresident_blocks<kLoad>()", "cudaOccupancyMaxActiveBlocksPerMultiprocessor", "#include <atomic>",
                 "int vec_store, float2* __restrict__ ws, int spread)", "spread      = True", "Spread: where the GPU"):
        assert text in source, text
    plain = FAMILY.render(GRID_8)
    assert "all_arrived" not in plain and "Cooperative" not in plain and "<atomic>" not in plain
    assert config_name(FAMILY, SPREAD_8).endswith("-grid_k8-spread1")
    assert FAMILY.tiling(SPREAD_8) == Tiling(16, 32, 128, 8, last_arrival=True, spread=True)
    assert FAMILY.prune(SPREAD_8, "sm_80") is None and FAMILY.prune(SPREAD_8, "sm_90a") is None
    assert "with grid_k = 1 there is none" in FAMILY.prune(cfg(spread=True), "sm_90a")
    assert "clusters" in FAMILY.prune(replace(GRID_2_CLUSTER_4, spread=True), "sm_90a")


@pytest.mark.nvcc
def test_spread_sums_the_same_bits_as_the_last_arrival_in_the_cpu_emulator(tmp_path):
    # The same source on an emulated GPU of 132 SMs (the grid fits: a cooperative launch, spread sums) and of 2 (it
    # does not: a plain launch, the last arrival sums): the same C, bit for bit, and tickets left at zero.
    family_checks.compile_sample(FAMILY, [SPREAD_8], tmp_path / "build")
    family_checks.emulate(FAMILY, SPREAD_8, tmp_path, GRID_SHAPES, calls=2)
    exe = emulator.build(FAMILY.render(SPREAD_8), SPREAD_8.acc, tmp_path)
    for m, n, k in ((33, 17, 333), (16, 24, 1000), (20, 30, 512)):
        spread, last = (emulator.run(exe, m, n, k, calls=2, sms=sms) for sms in (132, 2))
        assert (spread.cooperative_launches, last.cooperative_launches) == (2, 0), (m, n, k)
        assert spread.c_hash == last.c_hash and spread.mismatch == 0, (m, n, k, spread, last)


@pytest.mark.nvcc
@pytest.mark.parametrize(("old", "what"), [
    ("    if (threadIdx.x == 0 && ticket_arrive(ticket) == 2 * arrivals - 1) ticket_reset(ticket);\n",
     "ticket left behind"),
    ("        while (ticket_read(ticket) < arrivals) {\n        }\n", "no wait for the other groups"),
])
def test_the_emulator_catches_a_broken_spread(tmp_path, old, what):
    # Without the reset the next call finds the ticket past GRID_K and waits for nothing; without the wait a group
    # reads partials not yet written: either way a later call's C differs (and without the wait, the first's too).
    source = FAMILY.render(SPREAD_8)
    assert old in source, what
    with pytest.raises(AssertionError, match="later call|rel_err"):
        family_checks.emulate(FAMILY, SPREAD_8, tmp_path, [(16, 24, 1000, (0, 0, 0))], calls=2,
                              source=source.replace(old, ""))


def test_stage_c_stores_the_tile_through_shared_memory_only_for_its_configs():
    source = FAMILY.render(STAGED[0])
    for text in ("__shared__ __align__(16) half c_tile[BM][BN + C_PAD];", "store_tile(C, M, N, c_tile);",
                 "constexpr int C_PAD = 8;", "*reinterpret_cast<uint4*>(p) = ", "if (wk == 0) {", "stage_c     = True"):
        assert text in source, text
    assert "if (wk > 0) return;" not in source  # every K-warp stays for the block's store
    assert "c_tile" not in FAMILY.render(DEFAULT) and "if (wk > 0) return;" in FAMILY.render(DEFAULT)
    assert config_name(FAMILY, STAGED[0]).endswith("-stage_c1")
    assert STAGED[0].stage_smem_bytes == 32 * (64 + 8) * 2 and DEFAULT.stage_smem_bytes == 0
    assert "cluster_k and grid_k" in FAMILY.prune(replace(GRID_8, stage_c=True), "sm_90a")
    # 4 K-warps of a 64x64 tile park 48 KiB: with the staged tile on top, over the static limit.
    assert "staged 64x64 C tile" in FAMILY.prune(cfg(bm=64, bn=64, warps_m=2, warps_n=2, warps_k=4, stage_c=True),
                                                 "sm_90a")


@pytest.mark.nvcc
def test_stage_c_is_correct_in_the_cpu_emulator(tmp_path):
    # The odd shapes include N % 8 != 0, a misaligned C (offsets 1, 8, 1) and M, N not multiples of the tile: the
    # half-by-half path and the edges; 1x40x24 and 16x24x1000 (N % 8 == 0, C aligned) take the 16-byte path.
    family_checks.compile_sample(FAMILY, STAGED, tmp_path / "build")
    family_checks.emulate_many(FAMILY, STAGED, tmp_path)


@pytest.mark.nvcc
def test_grid_k_with_more_tiles_than_tickets_runs_as_one_group(tmp_path):
    # The same source with 4 tickets: shapes of more than 4 tiles take the one-group path (no workspace).
    family_checks.emulate_with_tickets(FAMILY, GRID_8, tmp_path, 4, [(77, 100, 336, (0, 0, 0)), (33, 17, 333, (0, 0, 0))])


@pytest.mark.nvcc
def test_the_emulator_catches_a_ticket_left_behind(tmp_path):
    # Without the reset, a tile's ticket ends a call at GRID_K, so in the next call no group draws the last ticket
    # and the tile is never stored: the check must fail.
    source = FAMILY.render(GRID_8).replace("            ticket_reset(ticket);\n", "")
    assert source != FAMILY.render(GRID_8)
    with pytest.raises(AssertionError, match="later call"):
        family_checks.emulate(FAMILY, GRID_8, tmp_path, [(33, 17, 333, (0, 0, 0))], calls=2, source=source)


GPU_SHAPES = (Task(64, 64, 64), Task(128, 4096, 64), Task(1, 4096, 4096), Task(77, 1000, 333), Task(64, 64, 16384),
              Task(100, 130, 1001), Task(4096, 11008, 4096))


@pytest.mark.gpu
@pytest.mark.parametrize("config", [*SAMPLE, CLUSTER_16, GRID_2_CLUSTER_4, SPREAD_8, *STAGED, PUSH_16, PUSH_16_K8, EXACT,
                                    UNROLLED, UNROLLED_PUSH, EXACT_PARKED],
                         ids=lambda c: f"{c.bm}x{c.bn}-k{c.warps_k}-c{c.cluster_k}-g{c.grid_k}-s{int(c.spread)}"
                                       f"-t{int(c.stage_c)}-p{int(c.push)}-e{int(c.exact)}-u{c.loop_unroll}-{c.acc.value}")
def test_sample_is_correct_on_the_gpu(config, tmp_path):
    tasks = [replace(t, acc=config.acc) for t in GPU_SHAPES]
    ev = Evaluator(EvalOptions(target_ms=20, baselines=False, cache_dir=tmp_path / "build"))  # correctness only
    res = ev.evaluate(FAMILY.render(config), tasks)
    for s in res.shapes:
        assert s.status == Status.OK, (s.task.mnk, s.status.value, s.reason)


@pytest.mark.gpu
def test_spread_takes_the_cooperative_path_on_the_gpu(tmp_path):
    # SPREAD_8 with its last-arrival fallback made a trap: on shapes whose grid (<= 160 CTAs of 128 threads) the GPU
    # holds at once, the launch must be cooperative and every group must sum its share, or the kernel faults.
    fallback = "        else if (!last_arrival(ticket, GRID_K, flag)) return;  // another group adds this share\n"
    source = FAMILY.render(SPREAD_8)
    assert fallback in source
    source = source.replace(fallback, "        else __trap();  // (test) the fallback must not run here\n")
    ev = Evaluator(EvalOptions(target_ms=20, baselines=False, cache_dir=tmp_path / "build"))  # correctness only
    res = ev.evaluate(source, [Task(64, 64, 16384), Task(77, 100, 333), Task(33, 17, 1000)])
    for s in res.shapes:
        assert s.status == Status.OK, (s.task.mnk, s.status.value, s.reason)
