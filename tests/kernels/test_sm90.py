"""The sm90 (wgmma/TMA, CUTLASS 3.x) family: space, make, prune and render on the CPU; a compile sample for sm_90a
(nvcc); correctness of a config sample through the evaluator on an H200 (gpu).

CI cost (2 cores): six configs compiled on 2 workers (~3-4 min) plus one host-only probe of CUTLASS's shared memory
figures (~20 s); everything else is Python.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import pytest

from cudal2.kernels import cuda_parts
from cudal2.kernels.family import BadConfig, config_name, config_params
from cudal2.kernels.sm90 import (
    EXTENDED_GMMA_DEFINE,
    EXTENDED_GMMA_GAIN,
    FAMILY,
    KERNEL_SMEM_OVERHEAD,
    ONE_TILE_SMEM_ALIGN,
    SMEM_CAPACITY,
    Epilogue,
    Raster,
    Reduction,
    Schedule,
    Scheduler,
    Sm90Config,
    acc_regs,
    batched_split_k,
    d_bytes,
    epilogue_rows,
    pipeline_stages,
    probe_source,
    smem_budget,
    smem_bytes,
    stage_bytes,
)
from cudal2.sandbox.compiler import nvcc_flags
from cudal2.sandbox.evaluator import EvalOptions, Evaluator, Prepared
from cudal2.sandbox.lt_algo import LtAlgo
from cudal2.sandbox.runner import RunLimits
from cudal2.sandbox.static_check import check_source, spells_programmatic_launch
from cudal2.sandbox.types import Acc, Status, Task
from cudal2.tune_search import Candidate, estimate_us, one_step

ARCH = "sm_90a"
DEFAULT = FAMILY.default()
# reduction=last as the fused split-K benchmark measured it first: 128x64 basic, 4 K ranges
LAST_BASE = replace(DEFAULT, bm=128, bn=64, cluster_n=1, schedule=Schedule.BASIC, epilogue=Epilogue.NOSMEM, splits=4,
                    reduction=Reduction.LAST)


def cfg(**changes) -> Sm90Config:
    return replace(DEFAULT, **changes)


def every_config(step: int = 1):
    """Every `step`-th config of the space's product (making a config is what costs: the tuples are cheap)."""
    space = FAMILY.space()
    for values in itertools.islice(itertools.product(*space.values()), 0, None, step):
        yield FAMILY.make(dict(zip(space, values, strict=True)))


def space_size() -> int:
    return math.prod(len(values) for values in FAMILY.space().values())


def prepare_all(evaluator: Evaluator, jobs: list[tuple[str, list[Task]]]) -> list[Prepared]:
    """The CPU stages (static rules, nvcc, link check) of several (source, tasks) at once, one nvcc per core (it is
    single-threaded; more at once only stretch each toward the compile timeout)."""
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda job: evaluator.prepare(*job), jobs))


# ----------------------------------------------------------------------------------------- space and make


def test_default_is_in_the_space_and_worth_compiling():
    assert FAMILY.make(vars(DEFAULT)) == DEFAULT
    assert FAMILY.prune(DEFAULT, ARCH) is None
    assert FAMILY.archs == (ARCH,)


def test_make_converts_strings_to_enums_and_round_trips():
    params = {**vars(DEFAULT), "schedule": "pingpong", "scheduler": "persistent", "epilogue": "nosmem",
              "acc": "fp16", "bm": 64}
    made = FAMILY.make(params)
    assert made.schedule is Schedule.PINGPONG and made.epilogue is Epilogue.NOSMEM and made.acc is Acc.FP16
    assert FAMILY.make(vars(made)) == made
    assert hash(made) == hash(FAMILY.make(params))


@pytest.mark.parametrize(
    "params, message",
    [
        ({**vars(DEFAULT), "warps": 4}, "unknown parameter 'warps'"),
        ({**vars(DEFAULT), "bm": 96}, "bm=96 is not one of"),
        ({**vars(DEFAULT), "schedule": "streamk"}, "schedule='streamk' is not one of"),
        ({**vars(DEFAULT), "stages": 1}, "stages=1 is not one of"),
        ({k: v for k, v in vars(DEFAULT).items() if k != "swizzle"}, "missing parameter(s): swizzle"),
    ],
)
def test_make_rejects_params_outside_the_space(params, message):
    with pytest.raises(BadConfig, match=message.replace("(", r"\(").replace(")", r"\)")):
        FAMILY.make(params)


def test_render_rejects_a_foreign_config():
    with pytest.raises(BadConfig):
        FAMILY.render({"bm": 128})


def test_config_names_are_distinct_and_stable():
    names = {config_name(FAMILY, c) for c in itertools.islice(every_config(), 500)}
    assert len(names) == 500
    assert config_name(FAMILY, DEFAULT) == (
        "sm90_wgmma-bm128-bn256-bk64-cluster_m1-cluster_n2-schedulecooperative-schedulerpersistent-epiloguetma"
        "-stages0-swizzle1-accfp32-splits1"
    )


# -------------------------------------------------------------------------------------------------- prune


@pytest.mark.parametrize(
    "config, reason",
    [
        (cfg(bm=64), "needs BM >= 128"),
        (cfg(schedule=Schedule.PINGPONG, scheduler=Scheduler.STREAMK, bn=128), "does not support the stream-K"),
        (cfg(bm=256, bn=256), "256 accumulator registers"),
        (cfg(schedule=Schedule.PINGPONG, bm=128, bn=256), "256 accumulator registers"),
        (cfg(bm=256, bn=256, bk=128, acc=Acc.FP16), "only 1 stage(s)"),
        (cfg(bn=128, stages=8), "bytes of shared memory"),
        (cfg(reduction=Reduction.ATOMIC), "only the stream-K scheduler"),
        (cfg(epi_n=48), "does not divide BN=256"),
        (cfg(epi_n=32), "what CUTLASS picks for BN=256 anyway"),
        (cfg(bn=176, epi_n=16), "what CUTLASS picks for BN=176 anyway"),
        (cfg(epilogue=Epilogue.NOSMEM, epi_n=128), "the no-smem epilogue stores from registers"),
        (cfg(pdl=True), "only split-K as a batch"),
        (cfg(scheduler=Scheduler.STREAMK, splits=8, pdl=True), "only split-K as a batch"),
        (cfg(schedule=Schedule.BASIC, scheduler=Scheduler.STREAMK, bn=128), "takes no stream-K scheduler"),
        (cfg(schedule=Schedule.BASIC, bn=128, swizzle=2), "no swizzle or raster order"),
        (cfg(schedule=Schedule.BASIC, bn=128, raster=Raster.ALONG_N), "no swizzle or raster order"),
        (cfg(schedule=Schedule.BASIC, bm=128, bn=256), "256 accumulator registers"),
        (cfg(schedule=Schedule.UNSPECIALIZED, bn=128), "takes the no-smem epilogue only"),
        (cfg(schedule=Schedule.UNSPECIALIZED, bn=128, epilogue=Epilogue.NOSMEM, swizzle=4), "no swizzle or raster"),
        (cfg(schedule=Schedule.UNSPECIALIZED, bn=128, epilogue=Epilogue.NOSMEM, scheduler=Scheduler.STREAMK),
         "unspecialized kernel takes no stream-K scheduler"),
        (cfg(schedule=Schedule.UNSPECIALIZED, bm=128, bn=256, epilogue=Epilogue.NOSMEM), "256 accumulator registers"),
        (cfg(schedule=Schedule.UNSPECIALIZED, bm=64, bn=128, epilogue=Epilogue.NOSMEM, stages=2), "needs >= 3 stages"),
        (cfg(bn=128, ctas_per_sm=2), "the cooperative kernel is persistent"),
        (cfg(schedule=Schedule.BASIC, bm=64, bn=128, stages=4, ctas_per_sm=2), "stages must be 0, got 4"),
        (cfg(schedule=Schedule.BASIC, bm=128, bn=256, bk=128, acc=Acc.FP16, ctas_per_sm=4), "only 0 stage(s)"),
        # reduction=last: split-K as a batch, one tile on all consumer threads, its own epilogue, no PDL or swap
        (LAST_BASE, None),
        (replace(LAST_BASE, splits=1), "needs the persistent scheduler and splits > 1"),
        (replace(LAST_BASE, scheduler=Scheduler.STREAMK, schedule=Schedule.COOPERATIVE), "needs the persistent"),
        (replace(LAST_BASE, schedule=Schedule.PINGPONG, bm=64), "cooperative or basic only"),
        (replace(LAST_BASE, epilogue=Epilogue.TMA), "epilogue=nosmem"),
        (replace(LAST_BASE, pdl=True), "no reduction kernel for pdl"),
        (replace(LAST_BASE, swap_ab=True), "not with the operands swapped"),
        (replace(LAST_BASE, acc=Acc.FP16), "acc=fp32"),
    ],
)
def test_prune_gives_the_reason(config, reason):
    why = FAMILY.prune(config, ARCH)
    assert why is None if reason is None else why is not None and reason in why


def test_unspecialized_takes_three_stages_or_more():
    """The H200's compile error of the nineteenth session (bm64 bn128 stages 2) is pruned; 3 stages are kept."""
    two = cfg(schedule=Schedule.UNSPECIALIZED, bm=64, bn=128, epilogue=Epilogue.NOSMEM, stages=2)
    assert "got 2" in FAMILY.prune(two, ARCH)
    assert FAMILY.prune(replace(two, stages=3), ARCH) is None


def test_ctas_per_sm_takes_the_stages_that_fit_that_many_ctas():
    """ctas_per_sm = k on a one-tile-per-CTA schedule: the most stages whose kernel fits 1/k of an SM's shared memory
    (less the per-CTA reservation), rendered as an explicit StageCount; 1 renders the auto carveout as before."""
    one = cfg(schedule=Schedule.BASIC, bm=64, bn=128, cluster_n=1)
    assert pipeline_stages(one) == 9 and smem_budget(one) == SMEM_CAPACITY
    for k, stages in ((2, 4), (3, 3), (4, 2)):
        c = replace(one, ctas_per_sm=k)
        assert FAMILY.prune(c, ARCH) is None and pipeline_stages(c) == stages, k
        budget = smem_budget(c)
        assert budget == 233472 // k - 1024 and smem_bytes(c) <= budget
        assert smem_bytes(replace(c, stages=stages + 1, ctas_per_sm=1)) > budget  # one stage more would not fit
        src = FAMILY.render(c)
        assert f"StageCount<{stages}>" in src and f"as many as fit {k} CTAs per SM" in src and check_source(src) == []
        assert config_name(FAMILY, c).endswith(f"-ctas_per_sm{k}")
    assert "StageCountAutoCarveout" in FAMILY.render(one) and "ctas_per_sm" not in FAMILY.render(one)
    # unspecialized needs 3 stages: 64x128 fits 3 CTAs, not 4
    plain = replace(one, schedule=Schedule.UNSPECIALIZED, epilogue=Epilogue.NOSMEM)
    assert FAMILY.prune(replace(plain, ctas_per_sm=3), ARCH) is None
    assert "got 2" in FAMILY.prune(replace(plain, ctas_per_sm=4), ARCH)


@pytest.mark.parametrize(
    "params, stored_hash",
    [  # configs of the committed H200 store and the sha256 of the source each was measured as
        (dict(bm=64, bn=64, cluster_n=2, schedule="basic", stages=0),
         "ff1b890777e464fc96a95ab608b2ed18ea15b43c44bc0bad239a7d88774e3a3a"),
        (dict(bm=128, bn=128, cluster_n=1, schedule="basic", stages=4),
         "329cd58bfea55529e24b99ae9ed24ddcdd4dd2a331ceb3a7726f81a7c9c944f3"),
        (dict(bm=128, bn=128, cluster_n=2, schedule="unspecialized", stages=0, epilogue="nosmem"),
         "c8807fa163e9dc733c2bce8154ffe941560c8acccf7b3649f1e9d727ad00a487"),
    ],
)
def test_one_tile_sources_render_as_stored(params, stored_hash):
    """ctas_per_sm and the one-tile smem alignment came after these were measured: their sources must not change, or
    the store's results would no longer count for them (the header's smem estimate stays unrounded at ctas_per_sm 1)."""
    base = dict(bk=64, cluster_m=1, scheduler="persistent", epilogue="tma", swizzle=1, acc="fp32", splits=1)
    source = FAMILY.render(FAMILY.make({**base, **params}))
    assert hashlib.sha256(source.encode()).hexdigest() == stored_hash


def test_settle_drops_ctas_per_sm_where_it_means_nothing():
    two = cfg(schedule=Schedule.BASIC, bm=64, bn=128, cluster_n=1, ctas_per_sm=2)
    assert FAMILY.settle(two) == two
    assert FAMILY.settle(replace(two, schedule=Schedule.PINGPONG)).ctas_per_sm == 1
    assert FAMILY.settle(replace(two, stages=4)) == replace(two, stages=4, ctas_per_sm=1)
    # one step along ctas_per_sm from a basic auto-stage winner: its 2, 3 and 4 CTA twins; from an explicit count or a
    # persistent winner: none
    parent = Candidate(FAMILY, replace(two, ctas_per_sm=1))
    assert [c.cfg.ctas_per_sm for c in one_step(parent, ARCH, ("ctas_per_sm",))] == [2, 3, 4]
    assert one_step(Candidate(FAMILY, replace(two, stages=4, ctas_per_sm=1)), ARCH, ("ctas_per_sm",)) == []
    assert one_step(Candidate(FAMILY, cfg(bn=128)), ARCH, ("ctas_per_sm",)) == []
    # a 2-CTA parent stepping to explicit stages gets them
    assert (4, 1) in [(c.cfg.stages, c.cfg.ctas_per_sm) for c in one_step(Candidate(FAMILY, two), ARCH, ("stages",))]


def test_prune_refuses_other_archs():
    for arch in ("sm_80", "sm_90", "sm_100a"):
        assert "sm_90a" in FAMILY.prune(DEFAULT, arch)


@dataclass(frozen=True)
class Walk:
    """One pruned walk over the space, shared by the tests that need one (each walk prunes ~2.9M configs, about
    five minutes on CI's two cores: walking once per module instead of once per test saves that)."""

    step: int
    total: int  # configs visited
    kept: list[Sm90Config]  # the configs prune keeps, in walk order
    bad_reasons: list[str]  # refusals whose reason is empty or longer than one line (must be none)


@pytest.fixture(scope="module")
def walk() -> Walk:
    # Every 4457th config (a prime, so prime to every dimension's size: the walk visits every value of each): the
    # whole product is ~13G configs since raster, cluster 4, more tile and split sizes, swap_ab, epi_n, ctas_per_sm
    # and reduction=last came (the step grew 4x with ctas_per_sm's 4 values and 1.5x with reduction's third, keeping
    # the walk at ~2.9M configs).
    step, total, kept, bad_reasons = 4457, 0, [], []
    for c in every_config(step=step):
        total += 1
        why = FAMILY.prune(c, ARCH)
        if why is None:
            kept.append(c)
        elif not why or "\n" in why:
            bad_reasons.append(why)
    return Walk(step, total, kept, bad_reasons)


def test_prune_is_consistent_with_the_models_over_the_space(walk):
    assert walk.bad_reasons == []
    for c in walk.kept:
        assert smem_bytes(c) <= smem_budget(c) <= SMEM_CAPACITY and pipeline_stages(c) >= 2 and acc_regs(c) <= 128
        assert c.ctas_per_sm == 1 or (c.schedule in (Schedule.BASIC, Schedule.UNSPECIALIZED) and c.stages == 0)
        assert not (c.schedule is Schedule.COOPERATIVE and c.bm < 128)
        assert not (c.schedule is Schedule.PINGPONG and c.scheduler is Scheduler.STREAMK)
        assert not (c.schedule in (Schedule.BASIC, Schedule.UNSPECIALIZED) and (c.scheduler, c.swizzle, c.raster)
                    != (Scheduler.PERSISTENT, 1, Raster.HEURISTIC))
        assert not (c.schedule is Schedule.UNSPECIALIZED and
                    (c.epilogue is not Epilogue.NOSMEM or pipeline_stages(c) < 3))
        assert c.cluster_m * c.cluster_n <= 8
        assert c.reduction is not Reduction.LAST or (
            batched_split_k(c) and c.schedule in (Schedule.COOPERATIVE, Schedule.BASIC)
            and c.epilogue is Epilogue.NOSMEM and not c.pdl and not c.swap_ab and c.acc is Acc.FP32)
    total, kept = walk.total, len(walk.kept)
    assert total > space_size() // walk.step - 1
    # ~0.2%: split-K, stream-K and the atomic reduction need each other, an epi_n must divide BN, the one-tile
    # schedules take no swizzle or raster order (unspecialized only the no-smem epilogue), and ctas_per_sm > 1 (3/4 of
    # the product) only those schedules with stages 0
    assert 0.001 * total < kept < 0.5 * total


def test_fp16_accumulators_take_half_the_registers():
    assert acc_regs(cfg(bm=256, bn=256, acc=Acc.FP16)) == 128
    assert FAMILY.prune(cfg(bm=256, bn=256, acc=Acc.FP16), ARCH) is None


# ----------------------------------------------------------------------------------------------- supports


def test_supports_alignment_and_accumulation():
    assert FAMILY.supports(DEFAULT, Task(77, 1000, 336)) is None
    assert FAMILY.supports(DEFAULT, Task(1, 4096, 4096)) is None
    assert "K % 8" in FAMILY.supports(DEFAULT, Task(64, 64, 333))
    assert "N % 8" in FAMILY.supports(DEFAULT, Task(64, 1001, 64))
    nosmem = cfg(epilogue=Epilogue.NOSMEM)
    assert FAMILY.supports(nosmem, Task(64, 1001, 64)) is None  # predicated stores: any N
    assert "K % 8" in FAMILY.supports(nosmem, Task(64, 1001, 63))
    fp16 = cfg(acc=Acc.FP16)
    assert "fp16 accumulation" in FAMILY.supports(fp16, Task(64, 64, 64, Acc.FP32))
    assert FAMILY.supports(fp16, Task(64, 64, 64, Acc.FP16)) is None
    assert FAMILY.supports(DEFAULT, Task(64, 64, 64, Acc.FP16)) is None  # fp32 accumulation is always accurate
    batched = cfg(splits=6)  # split-K as a batch: equal K ranges of whole 16-byte rows
    assert FAMILY.supports(batched, Task(64, 64, 12288)) is None
    assert "K % 48 == 0, got K=4096" in FAMILY.supports(batched, Task(64, 64, 4096))
    # 16 fp32 partials of a 12288x16384 C are 12 GiB: the harness would refuse the workspace (a runtime error).
    assert "12.0 GiB of workspace, over the harness's 8 GiB" in FAMILY.supports(cfg(splits=16), Task(12288, 16384, 128))
    assert FAMILY.supports(cfg(splits=8), Task(12288, 16384, 128)) is None  # 6 GiB
    assert FAMILY.supports(cfg(splits=16, scheduler=Scheduler.STREAMK), Task(12288, 16384, 128)) is None  # no batch
    assert FAMILY.supports(cfg(scheduler=Scheduler.STREAMK, splits=6), Task(64, 64, 4096)) is None  # uneven: fine


# ------------------------------------------------------------------------------------------------- render


def test_render_is_readable_and_follows_the_contract_rules():
    src = FAMILY.render(DEFAULT)
    assert src.startswith(f"// {config_name(FAMILY, DEFAULT)}\n")
    for line in ("tile BM x BN x BK  = 128 x 256 x 64", "cluster = 1x2x1", "KernelTmaWarpSpecializedCooperative",
                 "PersistentScheduler", "TmaWarpSpecializedCooperative", "StageCountAutoCarveout"):
        assert line in src
    assert 'extern "C" int cudal2_hgemm(' in src and 'extern "C" size_t cudal2_workspace_bytes(' in src
    assert "Gemm::get_workspace_size" in src and "gemm.initialize(args, workspace, stream)" in src
    assert "$" not in src  # every template field substituted
    assert check_source(src) == []


def test_render_maps_every_choice_into_the_source():
    src = FAMILY.render(cfg(bm=256, bn=64, bk=128, cluster_m=2, cluster_n=1, schedule=Schedule.PINGPONG,
                            epilogue=Epilogue.NOSMEM, stages=3, swizzle=8, acc=Acc.FP16))
    for piece in ("Shape<Int<256>, Int<64>, Int<128>>", "Shape<Int<2>, Int<1>, _1>", "KernelTmaWarpSpecializedPingpong",
                  "NoSmemWarpSpecialized", "StageCount<3>", "max_swizzle_size = 8",
                  "using ElementAccumulator = cutlass::half_t;", "kAlignD = 1;"):
        assert piece in src, piece
    assert "StreamKScheduler" in FAMILY.render(cfg(scheduler=Scheduler.STREAMK))
    assert "DecompositionMode" not in src + FAMILY.render(cfg(scheduler=Scheduler.STREAMK))
    split = FAMILY.render(cfg(scheduler=Scheduler.STREAMK, splits=8))
    assert "args.scheduler.splits = 8;" in split and "DecompositionMode::SplitK" in split
    assert "ReductionMode" not in split and "reduction" not in config_name(FAMILY, cfg(splits=8))
    atomic = FAMILY.render(cfg(scheduler=Scheduler.STREAMK, splits=8, reduction=Reduction.ATOMIC))
    assert "ReductionMode::Nondeterministic;" in atomic and "atomic (nondeterministic) reduction" in atomic
    assert check_source(src) == [] and check_source(split) == [] and check_source(atomic) == []


def test_basic_schedule_renders_one_tile_per_cta():
    """schedule=basic: CUTLASS's non-persistent KernelTmaWarpSpecialized, one consumer warpgroup, the persistent tag
    (the only scheduler it takes); with split-K as a batch grid.z runs the K ranges."""
    basic = cfg(bm=64, bn=64, cluster_n=1, schedule=Schedule.BASIC)
    assert FAMILY.prune(basic, ARCH) is None and acc_regs(basic) == 32 and epilogue_rows(basic) == 64
    src = FAMILY.render(basic)
    for piece in ("cutlass::gemm::KernelTmaWarpSpecialized>::CollectiveOp;", "kernel schedule    = basic",
                  "PersistentScheduler: only the tag, one CTA per tile", "Not persistent: one CTA per output tile",
                  "One consumer warpgroup runs wgmma", "cutlass::epilogue::TmaWarpSpecialized>::CollectiveOp;"):
        assert piece in src, piece
    assert "KernelTmaWarpSpecializedPingpong" not in src and "$" not in src and check_source(src) == []
    split = FAMILY.render(replace(basic, splits=4, pdl=True))
    assert "grid.z is the K range l of 4" in split and "cudaLaunchKernelEx(&launch, cudal2_sm90::splitk_reduce" in split
    # Adding the value renamed nothing: the other schedules' configs keep their names and sources.
    assert config_name(FAMILY, cfg(bm=64, schedule=Schedule.PINGPONG)).count("schedulepingpong") == 1


def test_unspecialized_schedule_renders_cutlass_kernel_tma():
    """schedule=unspecialized: CUTLASS's KernelTma, one tile per CTA with no producer warp, the no-smem epilogue; the
    producer line of the other schedules' sources is unchanged (it is part of their stored hashes)."""
    plain = cfg(bm=128, bn=128, cluster_n=2, schedule=Schedule.UNSPECIALIZED, epilogue=Epilogue.NOSMEM)
    assert FAMILY.prune(plain, ARCH) is None and acc_regs(plain) == 128
    union = pipeline_stages(plain) * stage_bytes(plain) + KERNEL_SMEM_OVERHEAD  # the union, then its alignment
    assert smem_bytes(plain) == -(-union // ONE_TILE_SMEM_ALIGN) * ONE_TILE_SMEM_ALIGN
    src = FAMILY.render(plain)
    for piece in ("cutlass::gemm::KernelTma>::CollectiveOp;", "kernel schedule    = unspecialized (KernelTma)",
                  "PersistentScheduler: only the tag, one CTA per tile", "Not persistent: one CTA per output tile",
                  "Not warp-specialised: the same 128 threads run wgmma", "One thread of the warpgroup issues TMA",
                  "cutlass::epilogue::NoSmemWarpSpecialized>::CollectiveOp;"):
        assert piece in src, piece
    assert "One producer warp" not in src and "$" not in src and check_source(src) == []
    assert "One producer warp issues TMA loads" in FAMILY.render(replace(plain, schedule=Schedule.BASIC))
    split = FAMILY.render(replace(plain, bm=64, splits=4, pdl=True, swap_ab=True))
    assert "grid.z is the K range l of 4" in split and "cudaLaunchKernelEx(&launch, cudal2_sm90::splitk_reduce" in split
    # settle: a TMA-epilogue winner's unspecialized twin stores from registers
    assert FAMILY.settle(replace(plain, epilogue=Epilogue.TMA, epi_n=64, swizzle=2)) == plain


def test_split_k_as_a_batch_renders_partials_and_their_reduction():
    """The persistent scheduler with splits > 1: a batch of K ranges whose fp32 partials a second kernel sums."""
    src = FAMILY.render(cfg(bm=64, bn=96, schedule=Schedule.PINGPONG, cluster_m=4, cluster_n=2, splits=6))
    for piece in ("using ElementD = float;", "kAlignD = 4;", "{M, N, K / 6, 6},", "int64_t(K) / 6);",
                  "GemmUniversalMode::kBatched,", "// M, N, K / 6, L = 6 K ranges",
                  "{{}, nullptr, stride_d, partials, stride_d},", "make_arguments(A, B, static_cast<float*>(workspace)",
                  "splitk_reduce(const float* __restrict__ ws", "MN, 6, vec4);", "if (K % (8 * 6) != 0) return 1;",
                  "return cudal2_sm90::split_workspace_bytes(M, N, K);", "split-K 6 as a batch, summed by splitk_reduce",
                  "PersistentScheduler", "-> fp32 -> swizzled shared memory -> TMA store into the workspace",
                  "constexpr int REDUCE_BATCH = 8;"):
        assert piece in src, piece
    assert "args.scheduler.splits" not in src and "$" not in src and check_source(src) == []
    nosmem = FAMILY.render(cfg(splits=4, epilogue=Epilogue.NOSMEM))
    assert "kAlignD = 1;" in nosmem and "predicated stores straight to the workspace" in nosmem
    # Without a split the persistent render is the one first measured: half C straight from the epilogue.
    plain = FAMILY.render(cfg())
    assert "using ElementD = cutlass::half_t;" in plain and "{M, N, K, 1}," in plain and "splitk_reduce" not in plain
    assert d_bytes(cfg(splits=6)) == 4 and d_bytes(cfg(scheduler=Scheduler.STREAMK, splits=6)) == 2



def separate_reduction(c: Sm90Config) -> bool:
    """Whether the source launches splitk_reduce after the GEMM: split-K as a batch, not summed in the epilogue."""
    return batched_split_k(c) and c.reduction is not Reduction.LAST


def test_reduction_last_sums_the_batch_in_the_gemms_epilogue():
    """reduction=last: split-K as a batch whose D is C itself, with TicketEpilogue (sm90_last) in place of CUTLASS's
    epilogue; tickets in the library (cudal2.ops orders such kernels' launches), no reduction kernel."""
    src = FAMILY.render(LAST_BASE)
    assert check_source(src) == [] and "$" not in src
    for piece in ("using ElementD = cutlass::half_t;", "{M, N, K / 4, 4},", "GemmUniversalMode::kBatched,",
                  "class TicketEpilogue", cuda_parts.TICKETS_DECL, "Sm90TmaWarpSpecializedAdapter<",
                  "TicketEpilogue<cutlass::detail::TagToStrideC_t<LayoutD>, ThreadOp, 128, 64, 4>>;",
                  "{{}, nullptr, stride_d, reinterpret_cast<ElementD*>(C), stride_d, partials},",
                  "make_arguments(A, B, C, static_cast<float*>(workspace), M, N, K)",
                  "if (K % (8 * 4) != 0 || cudal2_sm90::tiles(M, N) > cudal2_sm90::MAX_TICKETS) return 1;",
                  "(size_t(4) * tiles(M, N) * 128 * 64 * sizeof(float) + 255) / 256 * 256",
                  "return cudal2_sm90::split_workspace_bytes(M, N, K);", "summed by its last K range in the epilogue",
                  "#include <cutlass/epilogue/collective/detail.hpp>",
                  # a CTA that pads the grid to whole clusters has a tile past M or N: no ticket, partial or store
                  "if (m0 >= int(M) || n0 >= int(N)) return;"):
        assert piece in src, piece
    assert "splitk_reduce" not in src and "CollectiveBuilder<\n    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, " \
        "TileShape" not in src
    assert src.index("class TicketEpilogue") < src.index("using CollectiveEpilogue")
    assert config_name(FAMILY, LAST_BASE) == config_name(FAMILY, replace(LAST_BASE, reduction=Reduction.ORDERED)) + \
        "-reductionlast"
    tiling = FAMILY.tiling(LAST_BASE)
    assert tiling.last_arrival and not tiling.serial_reduce and tiling.splits == 4
    # One ticket per output tile, at most MAX_TICKETS; its partials are whole tiles (ragged edges included).
    assert FAMILY.supports(LAST_BASE, Task(128 * 256, 64 * 256, 1024, Acc.FP32)) is None
    assert "one ticket per output tile" in FAMILY.supports(LAST_BASE, Task(128 * 256 + 1, 64 * 256, 1024, Acc.FP32))
    assert "K % 32 == 0" in FAMILY.supports(LAST_BASE, Task(77, 1000, 336, Acc.FP32))
    assert FAMILY.supports(replace(LAST_BASE, splits=2), Task(77, 1000, 336, Acc.FP32)) is None  # any N: no TMA store
    # The staging tile takes its shared memory from the mainloop's stages: 128 x (64 + 8) halves and the verdict.
    assert pipeline_stages(LAST_BASE) == (SMEM_CAPACITY // 128 * 128 - (16 + 128 * 72 * 2)) // stage_bytes(LAST_BASE)


def test_pdl_starts_the_reduction_early_and_leaves_older_configs_as_rendered():
    """pdl=True: CUTLASS's grid dependency control on (the GEMM triggers its dependent after its last mainloop),
    splitk_reduce launched with the PDL attribute and waiting in place for the partials. pdl=False renders as before."""
    base = cfg(bm=64, bn=64, schedule=Schedule.PINGPONG, cluster_m=2, cluster_n=2, splits=8)
    early = FAMILY.render(replace(base, pdl=True))
    for piece in ("#define CUTLASS_ENABLE_GDC_FOR_SM90", 'asm volatile("griddepcontrol.wait;" ::: "memory");',
                  "early[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;",
                  "cudaLaunchKernelEx(&launch, cudal2_sm90::splitk_reduce", "summed by splitk_reduce (launched with PDL)"):
        assert piece in early, piece
    assert early.index("#define CUTLASS_ENABLE_GDC_FOR_SM90") < early.index("#include")  # before CUTLASS sees it
    assert check_source(early) == [] and spells_programmatic_launch(early)
    plain = FAMILY.render(base)
    assert not spells_programmatic_launch(plain) and "splitk_reduce<<<blocks" in plain
    assert config_name(FAMILY, replace(base, pdl=True)) == config_name(FAMILY, base) + "-pdl1"

def test_stream_k_sources_clear_their_flags_with_a_kernel_not_a_memset():
    """A memset node costs ~2.3 us per call in graph replay against ~0.6 us for a kernel node (graph_gap.cu):
    stream-K sources zero the flags themselves and skip CUTLASS's initialize(); persistent ones keep the call they
    were measured with (their stored results must keep applying)."""
    streamk = FAMILY.render(cfg(scheduler=Scheduler.STREAMK, splits=8))
    assert "clear_stream_k_flags(params, workspace" in streamk and "__global__ void clear_flags" in streamk
    assert "gemm.initialize(" not in streamk and "cudaMemsetAsync(" not in streamk
    assert "Gemm::run(params, stream)" in streamk and check_source(streamk) == []
    persistent = FAMILY.render(cfg())
    assert "gemm.initialize(args, workspace, stream)" in persistent and "clear_flags" not in persistent


# The three launch paths of host_cache: one tile per CTA (the persistent tag), stream-K's split-K (flags cleared on
# every call) and split-K as a batch with its reduction launched by PDL, operands swapped.
HOST_CACHE_SAMPLE = [
    cfg(bm=128, bn=128, schedule=Schedule.BASIC, cluster_n=1, host_cache=True),
    cfg(bm=128, bn=64, cluster_n=1, scheduler=Scheduler.STREAMK, splits=4, host_cache=True),
    cfg(bm=64, bn=32, schedule=Schedule.PINGPONG, cluster_m=1, cluster_n=2, splits=4, pdl=True, swap_ab=True,
        host_cache=True),
    # split-K as a batch summed in the GEMM's epilogue (reduction=last), cooperative in a 2x1 cluster
    replace(LAST_BASE, bm=128, bn=128, cluster_m=2, schedule=Schedule.COOPERATIVE, splits=2, host_cache=True),
]


@pytest.mark.parametrize("cached", HOST_CACHE_SAMPLE, ids=lambda c: c.scheduler.value + str(c.splits))
def test_host_cache_builds_the_parameters_only_when_the_call_changes(cached):
    """host_cache: CUTLASS's Params are kept per thread and rebuilt only when a call's pointers, shape, workspace or
    device change; the shared memory limit is set once per thread and device; every call launches with
    Gemm::run(params), a stream-K kernel clearing its flags first and split-K as a batch reducing after."""
    plain = replace(cached, host_cache=False)
    assert config_name(FAMILY, cached) == config_name(FAMILY, plain) + "-host_cache1"
    src = FAMILY.render(cached)
    assert check_source(src) == [] and spells_programmatic_launch(src) == cached.pdl
    entry = src[src.index('extern "C" int cudal2_hgemm'):]
    before, rest = entry.split("  if (!(key == built)) {\n")
    changed, every_call = rest.split("    built = key;\n  }\n")
    assert "CallKey key{A, B, C, M, N, K, workspace, workspace_bytes, device}" in before
    assert "static thread_local typename GemmKernel::Params params;" in before
    assert "make_arguments(" in changed and "to_underlying_arguments(args, " in changed
    assert "make_arguments(" not in every_call and "to_underlying_arguments" not in every_call
    assert "gemm.initialize(" not in entry and entry.count("cudaFuncSetAttribute(") == 1
    assert every_call.index("if (device != attribute_device)") < every_call.index("cudaFuncSetAttribute(")
    assert every_call.count("Gemm::run(params, stream)") == 1
    flags = "clear_stream_k_flags(params, workspace, gemm_workspace_bytes, stream)"
    assert (flags in every_call) == (cached.scheduler is Scheduler.STREAMK)
    assert ("cudal2_sm90::splitk_reduce" in every_call) == separate_reduction(cached)
    # without it, the entry point is the one the store's sources were measured with
    assert "thread_local" not in FAMILY.render(plain) and "CallKey" not in FAMILY.render(plain)


def test_host_cache_is_made_but_not_searched():
    """It changes no offline time: searches leave it at its default (their configs never twin a measured one), and
    a stored or hand-written parameter set may still name it."""
    assert "host_cache" not in FAMILY.space()
    assert FAMILY.make({**config_params(DEFAULT), "host_cache": True}).host_cache
    assert not any(c.cfg.host_cache for c in one_step(Candidate(FAMILY, DEFAULT), ARCH))


@pytest.mark.parametrize(
    "params, stored_hash",
    [  # configs of the committed H200 store and the sha256 of the source each was measured as
        (dict(bm=256, bn=128, cluster_n=2, scheduler="streamk", reduction="atomic"),
         "7397dbe77d94ae296e2312ab00d1f3836cbc47e8a35ffc38a4347cc0ca704816"),
        (dict(bm=64, bn=64, cluster_n=1, schedule="pingpong", splits=4),
         "7d1cda16d8e20cbca6983e6797919006fe31fc128061df9786513267b1488012"),
        (dict(bm=64, bn=32, cluster_n=2, schedule="pingpong", epilogue="nosmem", splits=2, pdl=True, swap_ab=True),
         "1f30cafd11047f96bc5052d3d2f84f9842c7040e420ea2634390a844dfff826f"),
    ],
)
def test_launch_paths_render_as_stored(params, stored_hash):
    """host_cache shares the launch text's pieces (the initialize() line, the static run, the batch's checks and
    reduction): stream-K and split-K as a batch, with and without PDL, still render the sources the store measured."""
    base = dict(bk=64, cluster_m=1, schedule="cooperative", scheduler="persistent", epilogue="tma", swizzle=1,
                acc="fp32", splits=1, stages=0)
    source = FAMILY.render(FAMILY.make({**base, **params}))
    assert hashlib.sha256(source.encode()).hexdigest() == stored_hash


def test_the_ordered_reduction_adds_nothing_to_older_configs():
    """`reduction` came after configs were stored: at its default (ordered) the name and source are those of the
    config without it, and a stored parameter set that lacks it builds the same config."""
    params = {k: v for k, v in config_params(cfg(scheduler=Scheduler.STREAMK, splits=4)).items() if k != "reduction"}
    old = FAMILY.make(params)
    assert old.reduction is Reduction.ORDERED and old == cfg(scheduler=Scheduler.STREAMK, splits=4)
    assert "reduction" not in FAMILY.render(old).splitlines()[0]
    atomic = replace(old, reduction=Reduction.ATOMIC)
    assert config_name(FAMILY, atomic) == config_name(FAMILY, old) + "-reductionatomic"


def test_a_forced_raster_order_is_set_and_the_heuristic_adds_nothing():
    """`raster` came after configs were stored: at its default (CUTLASS's heuristic) name and source are unchanged;
    forced, both schedulers get the order in their arguments and the header says so."""
    params = {k: v for k, v in config_params(cfg(swizzle=4)).items() if k != "raster"}
    old = FAMILY.make(params)
    assert old.raster is Raster.HEURISTIC and "raster_order" not in FAMILY.render(old)
    for scheduler in Scheduler:
        for raster, order in ((Raster.ALONG_M, "AlongM"), (Raster.ALONG_N, "AlongN")):
            forced = replace(old, scheduler=scheduler, raster=raster)
            src = FAMILY.render(forced)
            assert f"args.scheduler.raster_order =  // forced, not CUTLASS's heuristic\n      " \
                   f"cutlass::gemm::kernel::detail::RasterOrderOptions::{order};" in src
            assert f"rasterisation swizzle 4 along {order[-1]}," in src and check_source(src) == []
            assert config_name(FAMILY, forced).endswith(f"-raster{raster.value}")
            assert FAMILY.prune(forced, ARCH) is None


def test_swapped_operands_compute_c_transposed_and_older_configs_render_unchanged():
    """swap_ab: the kernel computes C^T[N,M] = B * A^T into a column-major D (which is C row-major), called with A and
    B, M and N traded; it came after configs were stored, so unswapped names and sources stay as they were."""
    params = {k: v for k, v in config_params(cfg()).items() if k != "swap_ab"}
    old = FAMILY.make(params)
    assert old == cfg() and not old.swap_ab and "swap" not in config_name(FAMILY, old)
    plain = FAMILY.render(old)
    assert "make_arguments(A, B, C, M, N, K);" in plain and "LayoutD = cutlass::layout::RowMajor;" in plain
    assert "make_stride(int64_t(N), _1{}, int64_t(M) * N);" in plain and "swapped" not in plain
    swapped = cfg(bm=128, bn=96, cluster_m=1, cluster_n=2, swap_ab=True)
    src = FAMILY.render(swapped)
    assert config_name(FAMILY, swapped) == config_name(FAMILY, replace(swapped, swap_ab=False)) + "-swap_ab1"
    for piece in ("Operands swapped: the kernel computes C^T[N,M] = B[N,K] * A[M,K]^T",
                  "using LayoutD = cutlass::layout::ColumnMajor;", "stride_d = make_stride(_1{}, int64_t(M), int64_t(M) * N);",
                  "make_arguments(B, A, C, N, M, K);", "make_arguments(nullptr, nullptr, nullptr, N, M, K)"):
        assert piece in src, piece
    assert "$" not in src and check_source(src) == []
    batched = FAMILY.render(replace(swapped, splits=4))
    assert "make_arguments(B, A, static_cast<float*>(workspace), N, M, K);" in batched
    assert "split_workspace_bytes(N, M, K);" in batched and "MN, 4, vec4);" in batched
    # The wave model sees C's tile: BN rows x BM columns.
    assert (FAMILY.tiling(swapped).bm, FAMILY.tiling(swapped).bn) == (96, 128)
    # Alignment is C's either way: the TMA store needs N % 8 == 0 (C's rows are C^T's columns).
    assert "N % 8" in FAMILY.supports(swapped, Task(64, 1001, 512, Acc.FP32))
    assert FAMILY.supports(swapped, Task(1001, 64, 512, Acc.FP32)) is None


EXTENDED_N = (48, 80, 112, 144, 160, 176)  # the space's N tiles that CuTe's standard wgmma shapes do not include


def test_n_tiles_off_the_standard_wgmma_shapes_enable_cutes_extended_ones():
    """CuTe's selector picks the widest standard m64nNk16 dividing the tile's N unless its extended shapes are on: a
    64x80 tile ran five m64n16k16 per K step. Only such tiles carry the define, so the others render as measured."""
    for bn in FAMILY.space()["bn"]:
        c = cfg(bm=64, bn=bn, schedule=Schedule.PINGPONG, cluster_n=1)
        src = FAMILY.render(c)
        assert (EXTENDED_GMMA_DEFINE in src) == (bn in EXTENDED_N), bn
        assert FAMILY.rerender_gain(c) == (EXTENDED_GMMA_GAIN if bn in EXTENDED_N else 1.0), bn
    src = FAMILY.render(cfg(bm=128, bn=80, splits=4, swap_ab=True))
    assert src.index("#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED") < src.index("#include <cute/tensor.hpp>")
    assert EXTENDED_GMMA_DEFINE in probe_source(FAMILY, [DEFAULT, cfg(bn=176)])
    assert EXTENDED_GMMA_DEFINE not in probe_source(FAMILY, [DEFAULT, cfg(bn=96)])


def ptx_of(c: Sm90Config, tmp_path) -> str:
    """The PTX nvcc makes of the config's source (compute_90a: no SASS, no library)."""
    (tmp_path / "k.cu").write_text(FAMILY.render(c))
    flags = [f.replace("code=sm_90a", "code=compute_90a") for f in nvcc_flags(ARCH)
             if f not in ("-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v")]
    subprocess.run(["nvcc", *flags, "-ptx", "-o", "k.ptx", "k.cu"], cwd=tmp_path, check=True, capture_output=True,
                   timeout=600)
    return (tmp_path / "k.ptx").read_text()


@pytest.mark.nvcc
def test_an_extended_n_tile_issues_one_wgmma_as_wide_as_the_tile(tmp_path):
    """The PTX of a 64x80 tile: m64n80k16 wgmmas only (CuTe's standard shapes alone gave m64n16k16)."""
    ptx = ptx_of(cfg(bm=64, bn=80, schedule=Schedule.PINGPONG, cluster_n=1), tmp_path)
    assert set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)) == {"m64n80k16"}


def test_epi_n_sets_the_epilogue_subtile_and_leaves_older_configs_as_rendered():
    wide = cfg(bm=128, bn=176, cluster_m=2, cluster_n=1, epi_n=176)
    assert "Shape<_128, Int<176>>" in FAMILY.render(wide) and "EpilogueTileAuto" not in FAMILY.render(wide)
    assert config_name(FAMILY, wide).endswith("-epi_n176")
    # epi_n = 0 is CUTLASS's choice: the text every config stored before epi_n rendered, and the same name.
    auto = replace(wide, epi_n=0)
    assert "cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator" in FAMILY.render(auto)
    assert "epi_n" not in config_name(FAMILY, auto)
    assert "Shape<_64, Int<128>>" in FAMILY.render(cfg(bm=128, bn=128, schedule=Schedule.PINGPONG, epi_n=128))


@pytest.mark.nvcc
def test_a_whole_tile_epilogue_stores_each_tile_in_one_round(tmp_path):
    """CUTLASS's auto epilogue cuts a 128x176 tile into eleven 128x16 subtiles, each its own shared-memory round
    trip: barriers, a TMA store and its commit (PTX: eleven unrolled rounds). With epi_n = 176 the tile goes through
    shared memory once: one commit of its eleven 16-column TMA boxes (32-byte swizzle: a box spans 16 columns)."""
    rounds, barriers = {}, {}
    for epi_n in (0, 176):
        ptx = ptx_of(cfg(bm=128, bn=176, cluster_m=2, cluster_n=1, epi_n=epi_n), tmp_path)
        rounds[epi_n] = ptx.count("cp.async.bulk.commit_group")
        barriers[epi_n] = len(re.findall(r"\bbar(?:rier)?\.sync", ptx))
    assert rounds == {0: 11, 176: 1}
    assert barriers[176] < barriers[0]


def test_configs_like_a_cublaslt_algorithm():
    # cuBLASLt on 256x512x12288 (H200): a 64x96 tile, split-K 5, a 4x2 cluster (tests/sandbox/test_lt_algo.py).
    likes = FAMILY.like_cublaslt(LtAlgo(66, 64, 96, 5, "fp32 workspace", 4, 2))
    first = likes[0]
    assert (first.bm, first.bn, first.cluster_m, first.cluster_n, first.splits) == (64, 96, 4, 2, 5)
    # 64 rows: pingpong, which has no stream-K scheduler, so split-K as a batch only; at 5 ranges (K % 40 == 0) and
    # at the nearest power of two, 4, which divides any K the grid has; each with its reduction launched by PDL (as
    # cuBLAS launches its own), then without.
    assert first.schedule is Schedule.PINGPONG and batched_split_k(first) and first.pdl
    # Then all of them again with one tile per CTA (basic), as nvjet launches its tiles.
    assert [(c.splits, c.pdl, c.epilogue, c.schedule) for c in likes] == [
        (s, p, e, schedule) for schedule in (Schedule.PINGPONG, Schedule.BASIC)
        for s in (5, 4) for p in (True, False) for e in Epilogue]
    assert likes[8:] == [replace(c, schedule=Schedule.BASIC) for c in likes[:8]]
    assert all(FAMILY.prune(c, ARCH) is None for c in likes)
    # Not summed by the last K range (reduction=last): it lost to the batch with PDL on every pair measured.
    assert all(c.reduction is not Reduction.LAST for c in likes)
    # A 128-row tile also takes the stream-K scheduler's atomic, then ordered, reduction (no PDL: no second kernel).
    wide = FAMILY.like_cublaslt(LtAlgo(66, 128, 96, 4, "fp32 workspace", 2, 2))
    # Their basic twins: the split-K-as-a-batch ones only (the basic kernel has no stream-K scheduler).
    assert [(c.scheduler, c.reduction, c.pdl, c.schedule) for c in wide[::2]] == [
        (Scheduler.PERSISTENT, Reduction.ORDERED, True, Schedule.COOPERATIVE),
        (Scheduler.PERSISTENT, Reduction.ORDERED, False, Schedule.COOPERATIVE),
        (Scheduler.STREAMK, Reduction.ATOMIC, False, Schedule.COOPERATIVE),
        (Scheduler.STREAMK, Reduction.ORDERED, False, Schedule.COOPERATIVE),
        (Scheduler.PERSISTENT, Reduction.ORDERED, True, Schedule.BASIC),
        (Scheduler.PERSISTENT, Reduction.ORDERED, False, Schedule.BASIC)]
    # Its 32-row tile (on 256x256x12288) with the operands swapped: the kernel's 64 x 32 tile is 32 rows x 64
    # columns of C, and cuBLASLt's 2 CTAs along C's M are 2 along the kernel's N.
    (swapped, *_) = FAMILY.like_cublaslt(LtAlgo(66, 32, 64, 4, "fp32 workspace", 2, 1))
    assert (swapped.bm, swapped.bn, swapped.cluster_m, swapped.cluster_n, swapped.splits) == (64, 32, 1, 2, 4)
    assert swapped.swap_ab and FAMILY.tiling(swapped).bm == 32 and FAMILY.tiling(swapped).bn == 64
    # A 96-row tile (12288x256x2048): swapped, the cooperative kernel's 128 x 96.
    (rows96, *_) = FAMILY.like_cublaslt(LtAlgo(66, 96, 128, 1, "none", 2, 1))
    assert (rows96.bm, rows96.bn, rows96.cluster_m, rows96.cluster_n, rows96.swap_ab) == (128, 96, 1, 2, True)
    assert rows96.schedule is Schedule.COOPERATIVE
    # The cluster keeps cuBLASLt's footprint in outputs: an 8-column tile (1024x64x1024) in 2 columns of CTAs is one
    # of our 16-column tiles, so no cluster along N.
    (clipped, *_) = FAMILY.like_cublaslt(LtAlgo(66, 64, 8, 4, "fp32 workspace", 1, 2))
    assert (clipped.bm, clipped.bn, clipped.cluster_m, clipped.cluster_n, clipped.swap_ab) == (64, 16, 1, 1, False)
    # cuBLASLt's N tiles that are multiples of 16 are the space's own: 128x80 (256x1024x12288), 64x176 (128x8192x64).
    (n80, *_) = FAMILY.like_cublaslt(LtAlgo(66, 128, 80, 5, "fp32 workspace", 2, 1))
    assert (n80.bm, n80.bn, n80.splits, n80.cluster_m, n80.cluster_n, n80.swap_ab) == (128, 80, 5, 2, 1, False)
    n176_all = FAMILY.like_cublaslt(LtAlgo(66, 64, 176, 1, "none", 2, 4))
    n176 = n176_all[0]
    assert (n176.bm, n176.bn, n176.cluster_m, n176.cluster_n, n176.schedule) == (64, 176, 2, 4, Schedule.PINGPONG)
    # 176 is an odd multiple of 16 (CUTLASS stores it in 16-column subtiles): after the TMA and no-smem configs,
    # the TMA one again with the whole tile as one subtile. 64x96 above (32-column subtiles) has no such variant.
    assert [(c.epilogue, c.epi_n) for c in n176_all] == [(Epilogue.TMA, 0), (Epilogue.NOSMEM, 0), (Epilogue.TMA, 176)] * 2
    assert [c.schedule for c in n176_all] == [Schedule.PINGPONG] * 3 + [Schedule.BASIC] * 3
    assert n176_all[2] == replace(n176_all[0], epi_n=176)
    (n144, *_) = FAMILY.like_cublaslt(LtAlgo(66, 128, 144, 1, "none", 2, 1))
    assert (n144.bm, n144.bn, n144.cluster_m, n144.cluster_n, n144.swap_ab) == (128, 144, 2, 1, False)
    # 168 (an odd multiple of 8, outside the space) rounds in log2 to 176, not 160.
    (n168, *_) = FAMILY.like_cublaslt(LtAlgo(66, 128, 168, 1, "none", 2, 1))
    assert (n168.bm, n168.bn) == (128, 176)
    # Rounded to the space in log2: 7 ranges -> 8, an 88-wide tile -> 96; without a split: persistent.
    (odd, *_) = FAMILY.like_cublaslt(LtAlgo(66, 128, 88, 7, "fp32 workspace", 2, 1))
    assert (odd.bm, odd.bn, odd.splits, odd.cluster_m, odd.cluster_n) == (128, 96, 8, 2, 1)
    (plain, *_) = FAMILY.like_cublaslt(LtAlgo(66, 64, 32, 1, "none", 2, 4))
    assert (plain.schedule, plain.scheduler, plain.reduction) == (Schedule.PINGPONG, Scheduler.PERSISTENT,
                                                                  Reduction.ORDERED)
    # 192x192 rounds to 256x192, whose accumulators would spill: the nearest valid tile instead.
    (big, *_) = FAMILY.like_cublaslt(LtAlgo(66, 192, 192, 1, "none", 1, 2))
    assert (big.bm, big.bn) == (128, 192) and acc_regs(big) <= 128
    assert (big.cluster_m, big.cluster_n) == (2, 2)  # 192 rows in 128-row tiles: 1.5 rounds to 2 in log2
    assert FAMILY.like_cublaslt(LtAlgo(66, 0, 0, 1, "none", 0, 0)) == []  # tile left open: nothing to follow


def test_only_the_ordered_reduction_is_a_serial_chain_in_the_wave_model():
    ordered = FAMILY.tiling(cfg(bn=64, cluster_n=1, scheduler=Scheduler.STREAMK, splits=16))
    atomic = FAMILY.tiling(cfg(bn=64, cluster_n=1, scheduler=Scheduler.STREAMK, splits=16,
                               reduction=Reduction.ATOMIC))
    assert ordered.serial_reduce and not atomic.serial_reduce
    task = Task(256, 1024, 16384, Acc.FP32)
    assert estimate_us(atomic, task, 132) < estimate_us(ordered, task, 132)
    assert not FAMILY.tiling(DEFAULT).serial_reduce  # persistent: no partials at all


def test_every_kept_config_renders_distinct_sources_that_pass_the_static_rules(walk):
    sources = [FAMILY.render(c) for c in walk.kept]
    assert len(set(sources)) == len(sources) > 10
    for src in sources:
        assert check_source(src) == []


# ---------------------------------------------------------------------------------------------------- nvcc

# Configs that together take every value of schedule, scheduler, epilogue, acc, cluster and stages mode, raster
# order, and split-K's arguments.
COMPILE_SAMPLE = [
    cfg(bm=128, bn=128, cluster_m=2, cluster_n=1, scheduler=Scheduler.STREAMK, epilogue=Epilogue.NOSMEM,
        acc=Acc.FP16, splits=4, raster=Raster.ALONG_N),
    cfg(bm=64, bn=256, schedule=Schedule.PINGPONG, stages=4, swizzle=2, raster=Raster.ALONG_M),
    cfg(bm=128, bn=96, cluster_m=4, cluster_n=2, scheduler=Scheduler.STREAMK, splits=5, reduction=Reduction.ATOMIC),
    cfg(bm=64, bn=96, schedule=Schedule.PINGPONG, cluster_m=4, cluster_n=2, splits=4),  # split-K as a batch
    # Operands swapped: half D column-major through the TMA store; and fp32 partials column-major, split as a batch.
    cfg(bm=128, bn=96, cluster_m=1, cluster_n=2, swap_ab=True),
    cfg(bm=64, bn=32, schedule=Schedule.PINGPONG, cluster_m=1, cluster_n=2, splits=4, swap_ab=True),
    # One tile per CTA (not persistent), split as a batch with its reduction launched by PDL.
    cfg(bm=64, bn=64, schedule=Schedule.BASIC, cluster_m=1, cluster_n=2, splits=4, pdl=True),
    # Not warp-specialised (KernelTma): in a 2x1 cluster; swapped and split as a batch with PDL.
    cfg(bm=128, bn=64, schedule=Schedule.UNSPECIALIZED, cluster_m=2, cluster_n=1, epilogue=Epilogue.NOSMEM),
    cfg(bm=64, bn=128, schedule=Schedule.UNSPECIALIZED, cluster_n=2, epilogue=Epilogue.NOSMEM, splits=4, pdl=True,
        swap_ab=True),
    # The kernel's parameters kept between calls (host_cache): each launch path.
    *HOST_CACHE_SAMPLE,
]


@pytest.mark.nvcc
def test_compile_sample_for_sm90a(tmp_path):
    evaluator = Evaluator(EvalOptions(compile_only=True, arch=ARCH, cache_dir=tmp_path))
    task = Task(4096, 4096, 4096, Acc.FP16)
    prepared = prepare_all(evaluator, [(FAMILY.render(c), [task]) for c in COMPILE_SAMPLE])
    for c, p in zip(COMPILE_SAMPLE, prepared, strict=True):
        shape = p.final.shapes[0]
        assert shape.status is Status.COMPILED, f"{config_name(FAMILY, c)}: {shape.status.value}: {shape.reason}"
        names = sorted(k.name for k in p.compile.kernels)
        # stream-K sources clear their barrier flags with a kernel of their own (not CUTLASS's memset); split-K as
        # a batch sums its partials with one, unless its epilogue does (reduction=last)
        assert len(names) == 1 + (c.scheduler is Scheduler.STREAMK or separate_reduction(c)), names
        assert any("clear_flags" in n for n in names) == (c.scheduler is Scheduler.STREAMK), names
        assert any("splitk_reduce" in n for n in names) == separate_reduction(c), names
        for kernel in p.compile.kernels:
            assert kernel.spill_store_bytes == 0 and kernel.stack_bytes == 0, kernel
        assert "C7511" not in p.compile.log  # ptxas: "wgmma.mma_async instructions are serialized"


# Configs whose shared memory the probe measures: auto and fixed stages, both schedules and epilogues, clusters,
# stream-K; the last one is pruned for shared memory and must really be over the limit.
PROBE_SAMPLE = [
    DEFAULT,
    cfg(bm=256, bn=128, cluster_m=2, cluster_n=1, scheduler=Scheduler.STREAMK),
    cfg(bm=128, bn=64, bk=128, epilogue=Epilogue.NOSMEM),
    cfg(bm=64, bn=128, schedule=Schedule.PINGPONG, cluster_n=1),
    cfg(bm=256, bn=64, schedule=Schedule.PINGPONG, epilogue=Epilogue.NOSMEM, stages=5),
    cfg(bm=256, bn=256, acc=Acc.FP16, cluster_m=2, cluster_n=2),
    cfg(bm=128, bn=128, stages=2, scheduler=Scheduler.STREAMK, epilogue=Epilogue.NOSMEM),
    cfg(bm=128, bn=128, stages=7),  # pruned: over the limit
    # The tiles and clusters cuBLASLt takes on skinny long-K shapes (benchmarks/lt_algos.py).
    cfg(bm=64, bn=96, schedule=Schedule.PINGPONG, cluster_m=4, cluster_n=2),
    cfg(bm=128, bn=32, cluster_m=2, cluster_n=4, scheduler=Scheduler.STREAMK, splits=12),
    cfg(bm=128, bn=192, cluster_n=1),
    # Split-K as a batch: fp32 D, so the TMA epilogue stages twice the bytes.
    cfg(bm=64, bn=96, schedule=Schedule.PINGPONG, cluster_m=4, cluster_n=2, splits=6),
    cfg(bm=128, bn=256, splits=4),
    # Operands swapped: a column-major D, whose epilogue takes 1024 bytes more for half D too.
    cfg(bm=64, bn=32, schedule=Schedule.PINGPONG, cluster_m=1, cluster_n=2, swap_ab=True),
    cfg(bm=128, bn=96, cluster_m=2, cluster_n=1, splits=4, swap_ab=True),
    cfg(bm=128, bn=128, cluster_n=1, scheduler=Scheduler.STREAMK, splits=4, swap_ab=True),
    # N tiles of 16-wide epilogue tiles (gcd(32, BN)): a smaller alignment pad.
    cfg(bm=64, bn=176, schedule=Schedule.PINGPONG, cluster_m=2, cluster_n=4),
    cfg(bm=128, bn=80, splits=4),
    cfg(bm=128, bn=48, cluster_m=2, cluster_n=4, swap_ab=True),
    cfg(bm=128, bn=144, cluster_m=2, cluster_n=1),
    cfg(bm=64, bn=112, schedule=Schedule.PINGPONG, cluster_m=1, cluster_n=2, splits=4),
    # One tile per CTA: no scheduler or order-barrier storage, so the model's overhead is an overestimate there.
    cfg(bm=128, bn=128, schedule=Schedule.BASIC, cluster_n=1),
    # Explicit epilogue subtiles (epi_n): one buffer when a single subtile covers the tile, two otherwise.
    cfg(bm=128, bn=176, cluster_m=2, cluster_n=1, epi_n=176),
    cfg(bm=128, bn=128, cluster_n=1, epi_n=64),
    cfg(bm=64, bn=128, schedule=Schedule.PINGPONG, cluster_n=1, epi_n=128),
    cfg(bm=128, bn=96, cluster_m=2, cluster_n=1, splits=4, swap_ab=True, epi_n=96),
    cfg(bm=128, bn=256, epi_n=256),  # one 64 KiB subtile: 3 stages fit beside it instead of 4
    # Several CTAs per SM (one tile each): the stages that fit 1/k of the SM (a CUTLASS stage count under 2 does not
    # compile, so every one here is valid).
    cfg(bm=64, bn=128, schedule=Schedule.BASIC, cluster_n=1, ctas_per_sm=2),
    cfg(bm=128, bn=128, schedule=Schedule.BASIC, cluster_n=2, epi_n=128, ctas_per_sm=3),
    cfg(bm=64, bn=64, schedule=Schedule.UNSPECIALIZED, cluster_n=1, epilogue=Epilogue.NOSMEM, ctas_per_sm=4),
    # reduction=last: its own epilogue's staging tile, beside the stages (cooperative) or in their union (basic)
    replace(LAST_BASE, bm=128, bn=128, cluster_m=2, schedule=Schedule.COOPERATIVE, splits=2),
    LAST_BASE,
    replace(LAST_BASE, bm=64, bn=128, ctas_per_sm=2),
]


@pytest.mark.nvcc
def test_smem_model_matches_cutlass(tmp_path):
    """CUTLASS's own stage count and sizeof(SharedStorage), from a host-only probe, against the Python model."""
    (tmp_path / "probe.cu").write_text(probe_source(FAMILY, PROBE_SAMPLE))
    flags = [f for f in nvcc_flags(ARCH) if f not in ("-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v")]
    subprocess.run(["nvcc", *flags, "-o", str(tmp_path / "probe"), "probe.cu"], cwd=tmp_path, check=True,
                   capture_output=True, timeout=300)
    out = subprocess.run([str(tmp_path / "probe")], check=True, capture_output=True, text=True, timeout=60).stdout
    rows = [tuple(map(int, line.split())) for line in out.splitlines()]
    assert [r[0] for r in rows] == list(range(len(PROBE_SAMPLE)))
    for (_, stages, smem, _epi), c in zip(rows, PROBE_SAMPLE, strict=True):
        name = config_name(FAMILY, c)
        assert stages == pipeline_stages(c), name
        assert smem <= smem_bytes(c) < smem + 2048, f"{name}: CUTLASS {smem} bytes, model {smem_bytes(c)}"
        assert (FAMILY.prune(c, ARCH) is None) == (smem <= smem_budget(c)), name


# ----------------------------------------------------------------------------------------------------- GPU

GPU_SAMPLE = [
    DEFAULT,
    cfg(bm=128, bn=128, cluster_n=1, scheduler=Scheduler.STREAMK),
    cfg(bm=128, bn=128, cluster_m=2, cluster_n=1, schedule=Schedule.PINGPONG, epilogue=Epilogue.NOSMEM, stages=4,
        swizzle=2),
    cfg(bm=256, bn=128, cluster_m=2, cluster_n=1, epilogue=Epilogue.NOSMEM, acc=Acc.FP16),
    cfg(bm=128, bn=64, cluster_n=1, scheduler=Scheduler.STREAMK, splits=16),
    cfg(bm=128, bn=64, cluster_n=1, scheduler=Scheduler.STREAMK, splits=8, reduction=Reduction.ATOMIC),
    cfg(bm=128, bn=128, cluster_n=1, scheduler=Scheduler.STREAMK, reduction=Reduction.ATOMIC),  # stream-K
    cfg(bm=256, bn=128, swizzle=4, raster=Raster.ALONG_N),
    cfg(bm=128, bn=256, scheduler=Scheduler.STREAMK, raster=Raster.ALONG_M),
    cfg(bm=128, bn=96, cluster_m=4, cluster_n=2, scheduler=Scheduler.STREAMK, splits=5, reduction=Reduction.ATOMIC),
    cfg(bm=64, bn=32, schedule=Schedule.PINGPONG, cluster_m=2, cluster_n=4),
    cfg(bm=128, bn=192, cluster_m=4, cluster_n=1, swizzle=2),
    # Split-K as a batch (K % (8 * splits) == 0: the odd shapes with K = 2048 and 512 have it).
    cfg(bm=64, bn=64, schedule=Schedule.PINGPONG, cluster_m=4, cluster_n=2, splits=4),
    cfg(bm=128, bn=128, cluster_n=1, splits=8, epilogue=Epilogue.NOSMEM),
    # Operands swapped (C^T = B * A^T into a column-major D): plain, split as a batch, and stream-K without smem.
    cfg(bm=128, bn=96, cluster_m=1, cluster_n=2, swap_ab=True),
    cfg(bm=64, bn=32, schedule=Schedule.PINGPONG, cluster_m=1, cluster_n=2, splits=4, swap_ab=True),
    cfg(bm=128, bn=64, cluster_m=2, cluster_n=1, scheduler=Scheduler.STREAMK, epilogue=Epilogue.NOSMEM, swap_ab=True),
    # N tiles that are not powers of two, cuBLASLt's: 64x176 in a 2x4 cluster, 128x80 split as a batch, and 16 rows
    # (swapped).
    cfg(bm=64, bn=176, schedule=Schedule.PINGPONG, cluster_m=2, cluster_n=4),
    cfg(bm=128, bn=80, cluster_n=1, splits=4),
    cfg(bm=64, bn=16, schedule=Schedule.PINGPONG, cluster_m=1, cluster_n=2, swap_ab=True),
    # One tile per CTA (not persistent): 64 rows in a 1x2 cluster; 128 rows (one warpgroup, two wgmma rows) split
    # as a batch with PDL; then without warp specialisation (KernelTma): 128x128 in a 1x2 cluster, 64x128 swapped and
    # split as a batch with PDL.
    cfg(bm=64, bn=64, schedule=Schedule.BASIC, cluster_m=1, cluster_n=2),
    cfg(bm=128, bn=128, schedule=Schedule.BASIC, cluster_n=1, splits=4, pdl=True, epilogue=Epilogue.NOSMEM),
    cfg(bm=128, bn=128, schedule=Schedule.UNSPECIALIZED, cluster_n=2, epilogue=Epilogue.NOSMEM),
    cfg(bm=64, bn=128, schedule=Schedule.UNSPECIALIZED, cluster_n=2, epilogue=Epilogue.NOSMEM, splits=4, pdl=True,
        swap_ab=True),
    # Two one-tile CTAs per SM (4 stages each, explicit StageCount).
    cfg(bm=64, bn=128, schedule=Schedule.BASIC, cluster_n=1, ctas_per_sm=2),
    cfg(bm=128, bn=144, cluster_m=2, cluster_n=1),  # cuBLASLt's 128x144
    # Explicit epilogue subtiles: a whole 128x176 tile at once, and 96 columns of fp32 partials, operands swapped.
    cfg(bm=128, bn=176, cluster_m=2, cluster_n=1, epi_n=176),
    cfg(bm=128, bn=96, cluster_m=2, cluster_n=1, splits=4, swap_ab=True, epi_n=96),
    # The reduction of split-K as a batch started with PDL (the GEMM's partials waited for in place).
    cfg(bm=64, bn=64, schedule=Schedule.PINGPONG, cluster_m=2, cluster_n=2, splits=8, pdl=True),
    # Split-K as a batch summed by its last K range in the GEMM's epilogue (reduction=last): 128x64 basic, 4 ranges
    # (the fused benchmark's best on the H100), 64 rows in two CTAs per SM, and cooperative in a 1x2 cluster.
    LAST_BASE,
    replace(LAST_BASE, bm=64, bn=128, splits=8, ctas_per_sm=2),
    replace(LAST_BASE, bm=128, bn=128, cluster_n=2, schedule=Schedule.COOPERATIVE, splits=2),
    # The kernel's parameters kept between calls (host_cache), for each launch path: the evaluator's checks change
    # the data in the same buffers and move between shapes.
    *HOST_CACHE_SAMPLE,
]
LARGE = [(4096, 4096, 4096), (4096, 11008, 4096), (1024, 1024, 1024), (128, 4096, 8192), (64, 256, 16384)]
# (333, 1001, *): N % 8 != 0, the no-smem epilogue only
ODD = [(77, 1000, 336), (1, 4096, 4096), (333, 1001, 72), (77, 1000, 2048), (333, 1001, 512)]
# Correctness only (the runtime checks all run); no baselines, short timing: benchmarks/sm90_gpu.py measures.
GPU_CHECKS = EvalOptions(fresh=True, baselines=False, target_ms=5, warmup_ms=2, min_reps=3, max_reps=10,
                         compile_timeout_s=300, limits=RunLimits(start_timeout_s=60, task_timeout_s=30))


def gpu_tasks(c: Sm90Config) -> list[Task]:
    tasks = [Task(m, n, k, c.acc) for m, n, k in LARGE + ODD]
    return [t for t in tasks if FAMILY.supports(c, t) is None]


@pytest.mark.gpu
def test_gpu_sample_is_correct():
    evaluator = Evaluator(GPU_CHECKS)
    prepared = prepare_all(evaluator, [(FAMILY.render(c), gpu_tasks(c)) for c in GPU_SAMPLE])  # then run one by one
    failures = []
    for c, p in zip(GPU_SAMPLE, prepared, strict=True):
        assert len(p.tasks) >= len(LARGE) + 2
        for s in evaluator.run(p).shapes:
            if s.status is not Status.OK:
                failures.append(f"{config_name(FAMILY, c)} {s.task.mnk} {s.task.acc.value}: {s.status.value}: "
                                f"{s.reason}")
    assert not failures, "\n".join(failures)


@pytest.mark.gpu
def test_host_cache_kernels_follow_changed_data_pointers_and_shapes(tmp_path):
    """Called straight through ctypes, as cudal2.ops calls them: a repeated call with new data in the same buffers
    (the kept parameters), new buffers, another shape, then the first call again (rebuilt) all match torch."""
    import torch

    from cudal2 import ops
    from cudal2.export import sha256_text
    from cudal2.sandbox.evaluator import default_cache_dir

    def build(c: Sm90Config) -> ops.LoadedKernel:
        path = tmp_path / f"{config_name(FAMILY, c)}.cu"
        path.write_text(FAMILY.render(c))
        kernel = ops.build_kernel(path, sha256_text(path.read_text()), ARCH, default_cache_dir())  # precompiled
        assert not isinstance(kernel, ops.Failure), kernel.reason
        return kernel

    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # one workspace: its pointer stays the same

    def gemm_matches(kernel: ops.LoadedKernel, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> bool:
        m, k = a.shape
        n = b.shape[0]
        ws_bytes = int(kernel.workspace_bytes(m, n, k))
        assert ws_bytes <= ws.numel()
        rc = kernel.hgemm(a.data_ptr(), b.data_ptr(), out.data_ptr(), m, n, k, ws.data_ptr(), ws_bytes,
                          torch.cuda.current_stream().cuda_stream)
        ref = a.float() @ b.float().T
        return rc == 0 and float((out.float() - ref).abs().max()) <= 1e-2 * float(ref.abs().max())

    def operands(m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (torch.randn(m, k, device="cuda", dtype=torch.float16), torch.randn(n, k, device="cuda",
                dtype=torch.float16), torch.empty(m, n, device="cuda", dtype=torch.float16))

    with ThreadPoolExecutor(max_workers=len(HOST_CACHE_SAMPLE)) as pool:  # nvcc in parallel, one per kernel
        kernels = list(pool.map(build, HOST_CACHE_SAMPLE))
    torch.manual_seed(0)
    for c, kernel in zip(HOST_CACHE_SAMPLE, kernels, strict=True):
        a, b, out = operands(256, 512, 1024)
        assert gemm_matches(kernel, a, b, out), config_name(FAMILY, c)
        a.normal_()  # same pointers and shape: the kept parameters, new data
        b.normal_()
        assert gemm_matches(kernel, a, b, out), f"{config_name(FAMILY, c)}: new data, same buffers"
        assert gemm_matches(kernel, a, b, torch.empty_like(out)), f"{config_name(FAMILY, c)}: another C"
        assert gemm_matches(kernel, *operands(128, 768, 2048)), f"{config_name(FAMILY, c)}: another shape"
        assert gemm_matches(kernel, a, b, out), f"{config_name(FAMILY, c)}: the first call again"
