"""The sm80_mma family: space, configs, pruning, generated sources (static rules, nvcc for sm_80 and sm_90a, the CPU
emulator on odd shapes) and, on a GPU, correctness through the evaluator."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cudal2.kernels.family import Tiling, config_name, config_params
from cudal2.kernels.sm80 import Reduce, Sm80Config, Sm80Family
from cudal2.sandbox.evaluator import EvalOptions, Evaluator, source_hash
from cudal2.sandbox.static_check import check_source, spells_programmatic_launch
from cudal2.sandbox.types import Acc, Status, Task
from tests.kernels import family_checks

FAMILY = Sm80Family()
DEFAULT = FAMILY.default()


def cfg(**changes) -> Sm80Config:
    return replace(DEFAULT, **changes)


# A representative sample: the seed's shape; the 128x256 big tile (64x64 warp tiles, right under the register
# limit); split-K with fp16 accumulation, BK 64, 2 blocks per SM; one warp per block with 16 K ranges; split-K summed
# in a thread-block cluster (sm_90a only) with 4 and with 8 ranges (the shape of the grid's most frequent sm80 winner),
# and with 16 (over the portable cluster size: the tiny-output long-K shapes' tiling, e.g. 64x64x16384); the workspace
# reduction launched with PDL (sm_90a only; the tiling of the grid's workspace split-K winners, e.g. 128x128x2048).
# Stages 6 and 8 (the pipeline's ring of buffers at a count that is no power of two, and the deepest) on two of them.
# The long-K tiling with 16 ranges summed by each tile's last block to arrive (any arch). The 4-range cluster and
# the long-K winners' tiling (16x32x64, 8 stages) over 16 ranges, both summed in the push form (sm_90a only).
SAMPLE = [
    DEFAULT,
    cfg(bn=256),
    cfg(bm=64, bn=64, bk=64, warps_m=2, warps_n=2, stages=3, split_k=4, group_m=4, min_blocks=2, acc=Acc.FP16),
    cfg(bm=16, bn=64, warps_m=1, warps_n=1, stages=6, split_k=16, group_m=1),
    cfg(bm=64, bn=64, warps_m=2, warps_n=2, stages=3, split_k=4, reduce=Reduce.CLUSTER),
    cfg(bm=16, bn=64, bk=64, warps_m=1, warps_n=4, stages=3, split_k=8, min_blocks=2, reduce=Reduce.CLUSTER),
    cfg(bm=16, bn=64, bk=64, warps_m=1, warps_n=2, stages=5, split_k=16, group_m=4, reduce=Reduce.CLUSTER),
    cfg(bm=16, bn=32, bk=64, warps_m=1, warps_n=2, stages=8, split_k=8, group_m=4, pdl=True),
    cfg(bm=16, bn=32, bk=64, warps_m=1, warps_n=2, stages=5, split_k=16, group_m=4, reduce=Reduce.LAST),
    cfg(bm=64, bn=64, warps_m=2, warps_n=2, stages=3, split_k=4, reduce=Reduce.PUSH),
    cfg(bm=16, bn=32, bk=64, warps_m=1, warps_n=2, stages=8, split_k=16, group_m=16, reduce=Reduce.PUSH),
]
LAST = SAMPLE[8]
PUSH = SAMPLE[10]


def test_every_space_value_renders():
    family_checks.every_value_renders(FAMILY)


def test_bad_params_raise_bad_config():
    family_checks.rejects_bad_params(FAMILY)


def test_fp16_accumulation_only_for_fp16_tasks():
    family_checks.fp16_only_for_fp16_tasks(FAMILY)


def test_default_is_the_seed_tiling_and_valid_everywhere():
    assert (DEFAULT.bm, DEFAULT.bn, DEFAULT.bk, DEFAULT.warps_m, DEFAULT.warps_n, DEFAULT.stages) == (128, 128, 32, 2,
                                                                                                      4, 4)
    for arch in FAMILY.archs:
        assert FAMILY.prune(DEFAULT, arch) is None


@pytest.mark.parametrize(("config", "arch", "reason"), [
    (cfg(warps_m=8, warps_n=8), "sm_90a", "2048 threads per block"),
    (cfg(bm=16, warps_m=2), "sm_90a", "does not split into m16n8k16"),
    (cfg(bm=16, bn=64, warps_m=1, warps_n=4), "sm_90a", "load chunks not evenly divisible"),
    (cfg(bm=256, bn=256, bk=64, stages=5, warps_m=4, warps_n=4), "sm_90a", "over the 232448 B per-block limit"),
    (cfg(bm=256, bn=64, bk=64, stages=5, warps_m=4, warps_n=2), "sm_80", "over the 166912 B per-block limit"),
    (cfg(bm=256, bn=256, warps_m=1, warps_n=1), "sm_90a", "registers estimate"),
    (cfg(min_blocks=2), "sm_90a", "that 2 resident block(s) of 256 threads allow"),
    (cfg(bm=64, bn=64, bk=64, stages=5, warps_m=2, warps_n=2, min_blocks=2), "sm_86", "per SM of sm_86"),
    (DEFAULT, "sm_75", "no shared-memory model"),
    (cfg(split_k=4, reduce=Reduce.CLUSTER), "sm_80", "needs thread-block clusters"),
    (cfg(split_k=4, reduce=Reduce.PUSH), "sm_80", "needs thread-block clusters"),
    (cfg(reduce=Reduce.PUSH), "sm_90a", "split_k=1 has none"),
    (cfg(reduce=Reduce.CLUSTER), "sm_90a", "split_k=1 has none"),
    (cfg(split_k=32, reduce=Reduce.CLUSTER), "sm_90a", "over the 16 that sm_90 schedules"),
    (cfg(split_k=4, pdl=True), "sm_80", "needs sm_90"),
    (cfg(pdl=True), "sm_90a", "only split_k > 1 with reduce=workspace"),
    (cfg(split_k=4, reduce=Reduce.CLUSTER, pdl=True), "sm_90a", "only split_k > 1 with reduce=workspace"),
    (cfg(reduce=Reduce.LAST), "sm_80", "split_k=1 has none"),
    (cfg(split_k=4, reduce=Reduce.LAST, pdl=True), "sm_90a", "only split_k > 1 with reduce=workspace"),
])
def test_invalid_configs_are_pruned_with_the_reason(config, arch, reason):
    why = FAMILY.prune(config, arch)
    assert why is not None and reason in why, why


def test_smem_limit_depends_on_the_target():
    big = cfg(bm=256, bn=64, bk=64, stages=5, warps_m=4, warps_n=2)
    assert big.smem_bytes == 204800
    assert FAMILY.prune(big, "sm_90a") is None and FAMILY.prune(big, "sm_80") is not None


def test_source_names_its_config_and_design():
    source = FAMILY.render(SAMPLE[2])
    for text in ("constexpr int BM = 64;", "constexpr int SPLIT_K = 4;", "constexpr int STAGES = 3;",
                 "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16", "ldmatrix", "cp.async.cg",
                 "cudal2_workspace_bytes", "splitk_reduce", "Split-K", "Fragment layouts"):
        assert text in source, text
    assert ".f32.f16.f16.f32" in FAMILY.render(DEFAULT)


@pytest.mark.nvcc
def test_cluster_reduction_source_and_the_older_configs_unchanged():
    cluster = SAMPLE[4]
    source = FAMILY.render(cluster)
    for text in ("constexpr bool CLUSTER_REDUCE = true;", "cluster_reduce_store", "barrier.cluster.arrive.release",
                 "mapa.shared::cluster", "cudaLaunchAttributeClusterDimension", "summed in a thread-block cluster"):
        assert text in source, text
    assert cluster.smem_bytes == max(3 * (64 + 64) * 32 * 2, 64 * (64 + 4) * 4)  # the parked fp32 tile is larger
    assert FAMILY.tiling(cluster).cluster_reduce and not FAMILY.tiling(SAMPLE[2]).cluster_reduce
    # The workspace reduction (the default, and every config stored before `reduce` existed) renders without a byte
    # of the cluster code, under its old name; a stored parameter set without `reduce` makes the same config.
    assert "cluster" not in FAMILY.render(SAMPLE[2]).lower()
    assert config_name(FAMILY, SAMPLE[2]).endswith("accfp16") and config_name(FAMILY, cluster).endswith("reducecluster")
    assert FAMILY.make({k: v for k, v in config_params(SAMPLE[2]).items() if k != "reduce"}) == SAMPLE[2]
    # Clusters up to the portable 8 CTAs launch as before (their stored sources unchanged); 16 opt in to more.
    assert "NonPortableClusterSize" not in source
    assert "cudaFuncAttributeNonPortableClusterSizeAllowed, 1" in FAMILY.render(SAMPLE[6])


def test_a_stored_16_cta_cluster_config_renders_byte_for_byte():
    """A source of the committed H200 store with the non-portable opt-in (split_k 16 summed in the cluster), measured
    before the opt-in's text moved to cuda_parts: its config must render to it byte for byte."""
    stored = FAMILY.make({"bm": 64, "bn": 64, "bk": 64, "warps_m": 4, "warps_n": 1, "stages": 5, "split_k": 16,
                          "group_m": 1, "min_blocks": 1, "acc": "fp32", "reduce": "cluster", "pdl": False})
    assert source_hash(FAMILY.render(stored)) == "927ffaf0e56f88611acd90bf2deb4c65148dd3243398635f58c811e4a50e3884"


def test_only_the_workspace_reduction_renders_batched_loads():
    """splitk_reduce loads REDUCE_BATCH splits' partials before adding them where it runs; configs that never run it
    (no split, or the cluster reduction) keep the one-by-one loop they were stored with, byte for byte."""
    workspace = replace(SAMPLE[4], reduce=Reduce.WORKSPACE)
    assert workspace.split_k > 1
    batched = FAMILY.render(workspace)
    assert "constexpr int REDUCE_BATCH = 8;" in batched and "p[j] = w4[(size_t)(z0 + j) * quads + q];" in batched
    for kept in (cfg(), SAMPLE[4]):
        source = FAMILY.render(kept)
        assert "REDUCE_BATCH" not in source and "const float4 p = w4[(size_t)z * quads + q];" in source


def test_pdl_starts_the_workspace_reduction_early_and_leaves_older_configs_as_rendered():
    """pdl=True: each GEMM block triggers its dependent after the K loop, splitk_reduce is launched with the PDL
    attribute and waits in place for the partials; the evaluator is told (it then needs capturable calls). pdl=False
    renders as before the field existed, byte for byte (its stored results stay its own)."""

    early_cfg = SAMPLE[7]
    plain_cfg = replace(early_cfg, pdl=False)
    early, plain = FAMILY.render(early_cfg), FAMILY.render(plain_cfg)
    for piece in ('asm volatile("griddepcontrol.launch_dependents;" ::: "memory");',
                  'asm volatile("griddepcontrol.wait;" ::: "memory");',
                  "early[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;",
                  "cudaLaunchKernelEx(&launch, splitk_reduce", "launched with programmatic dependent launch"):
        assert piece in early and piece not in plain, piece
    trigger = early.index("griddepcontrol.launch_dependents")
    assert early.index("cp_async_wait<0>();") < trigger < early.index("---- epilogue")  # after the K loop
    assert check_source(early) == [] and spells_programmatic_launch(early) and not spells_programmatic_launch(plain)
    assert "splitk_reduce<<<(unsigned)blocks, REDUCE_THREADS, 0, stream>>>(ws, C, MN, plan.splits, vec4);" in plain
    assert config_name(FAMILY, early_cfg) == config_name(FAMILY, plain_cfg) + "-pdl1"
    assert FAMILY.make({k: v for k, v in config_params(plain_cfg).items() if k != "pdl"}) == plain_cfg


def test_last_arrival_sums_each_tile_in_the_launch_and_leaves_older_configs_as_rendered():
    source = FAMILY.render(LAST)
    for text in ("__device__ unsigned int g_tickets[MAX_TICKETS];", "last_arrival(&g_tickets[blockIdx.x], gridDim.z, &last)",
                 "ticket_reset(ticket)", "load_partial(p + (size_t)z * (size_t)M * (size_t)N, N, col)",
                 "> MAX_TICKETS)\n            splitk_reduce<<<", "summed by each tile's last block to arrive"):
        assert text in source, text
    assert "cudaLaunchAttributeClusterDimension" not in source and check_source(source) == []
    assert FAMILY.prune(LAST, "sm_80") is None and config_name(FAMILY, LAST).endswith("-reducelast")
    assert FAMILY.tiling(LAST) == Tiling(16, 32, 64, 16, last_arrival=True)
    for other in (c for c in SAMPLE if c is not LAST):
        assert "g_tickets" not in FAMILY.render(other) and "load_partial" not in FAMILY.render(other)


def test_cluster_over_the_portable_size_is_valid_on_sm90a_only():
    assert FAMILY.prune(SAMPLE[6], "sm_90a") is None
    assert "needs thread-block clusters" in FAMILY.prune(SAMPLE[6], "sm_80")


def test_sample_compiles_for_sm80_and_sm90a(tmp_path):
    family_checks.compile_sample(FAMILY, SAMPLE, tmp_path / "build")


@pytest.mark.nvcc
def test_sample_is_correct_in_the_cpu_emulator(tmp_path):
    family_checks.emulate_many(FAMILY, SAMPLE, tmp_path)


def test_push_stores_into_the_owners_shared_memory_and_reads_only_its_own():
    source = FAMILY.render(PUSH)
    for text in ("cluster_push_store(acc, C", "st.shared::cluster.v2.f32", "summed in a thread-block cluster, pushed",
                 "(size_t)(BM + SPLIT_K - 1) * RED_LD * sizeof(float)", "cudaLaunchAttributeClusterDimension"):
        assert text in source, text
    assert "ld_cluster_f2(addr" not in source and "cluster_reduce_store(acc" not in source
    assert PUSH.smem_bytes == 4 * (16 + 32) * 64 * 2 * 2  # 8 stages: over the inbox, (16 + 15) x (32 + 4) floats
    assert SAMPLE[9].smem_bytes == max(3 * (64 + 64) * 32 * 2, (64 + 3) * (64 + 4) * 4)
    assert FAMILY.tiling(PUSH).cluster_reduce and config_name(FAMILY, PUSH).endswith("-reducepush")


@pytest.mark.nvcc
def test_cluster_workspace_last_arrival_and_push_reductions_sum_alike_in_the_cpu_emulator(tmp_path):
    """All four sum the K ranges' fp32 partials in range order: the same C, to the bit (so the same error). The
    last arrival is called twice (the emulator runs the blocks in a new order each launch): a ticket left behind,
    or a sum in arrival order, would change the second call's C."""
    from tests.kernels import emulator

    cluster = SAMPLE[4]
    runs = {}
    for c in (cluster, replace(cluster, reduce=Reduce.WORKSPACE), replace(cluster, reduce=Reduce.LAST),
              replace(cluster, reduce=Reduce.PUSH)):
        (tmp_path / c.reduce.value).mkdir()
        exe = emulator.build(FAMILY.render(c), c.acc, tmp_path / c.reduce.value)
        runs[c.reduce] = [emulator.run(exe, m, n, k, offsets, calls=2) for m, n, k, offsets in family_checks.EMU_SHAPES]
    for a, b, last, push in zip(runs[Reduce.CLUSTER], runs[Reduce.WORKSPACE], runs[Reduce.LAST], runs[Reduce.PUSH],
                                strict=True):
        assert a.rc == b.rc == last.rc == push.rc == 0 and (a.rel_err, a.max_abs) == (b.rel_err, b.max_abs)
        assert (push.rel_err, push.max_abs, push.workspace_bytes) == (a.rel_err, a.max_abs, 0)
        assert (last.rel_err, last.max_abs) == (b.rel_err, b.max_abs) and last.mismatch == 0
        assert a.workspace_bytes == 0 and last.workspace_bytes == b.workspace_bytes  # the cluster's stay on chip


@pytest.mark.nvcc
def test_last_arrival_over_the_ticket_count_is_summed_by_the_second_kernel(tmp_path):
    # The same source with 4 tickets: a shape of more than 4 tiles takes splitk_reduce, one of 4 or fewer does not.
    family_checks.emulate_with_tickets(FAMILY, LAST, tmp_path, 4, [(77, 100, 336, (0, 0, 0)), (20, 30, 512, (1, 8, 1))])


GPU_SHAPES = (Task(1, 4096, 4096), Task(77, 1000, 333), Task(4096, 11008, 4096), Task(64, 64, 64),
              Task(128, 256, 1003))


@pytest.mark.gpu
@pytest.mark.parametrize("config", SAMPLE,
                         ids=lambda c: f"{c.bm}x{c.bn}x{c.bk}-s{c.split_k}-{c.acc.value}-{c.reduce.value}"
                                       + ("-pdl" if c.pdl else ""))
def test_sample_is_correct_on_the_gpu(config, tmp_path):
    tasks = [replace(t, acc=config.acc) for t in GPU_SHAPES]
    ev = Evaluator(EvalOptions(target_ms=20, baselines=False, cache_dir=tmp_path / "build"))  # correctness only
    res = ev.evaluate(FAMILY.render(config), tasks)
    for s in res.shapes:
        assert s.status == Status.OK, (s.task.mnk, s.status.value, s.reason)
