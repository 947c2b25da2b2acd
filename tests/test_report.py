"""The leaderboard: report maths on a fixed fixture store, missing shapes, the markdown, the CLI and the heatmap."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cudal2 import cli
from cudal2.data import ShapeRow, write_csv
from cudal2.report import (
    TARGETS,
    Entry,
    Estimator,
    ReportError,
    ReportScope,
    Target,
    Verdict,
    bucket_summaries,
    check_target,
    collect,
    geomean,
    headrooms,
    heat_cells,
    kernel_name,
    load_rows,
    model_passes,
    output_size_summaries,
    render,
    resolve_gpu,
    slowest,
    summarise,
    summarise_headroom,
    target_caveat,
    token_summaries,
)
from cudal2.roofline import figures_for
from cudal2.sandbox.store import Rank, ResultStore
from cudal2.sandbox.types import Acc, Mode, PairedSpeedup, ShapeResult, Task
from cudal2.tune_log import ConfigRecord, TuneLog
from tests.sandbox.corpus import ROOT
from tests.sandbox.test_store import GPU, failed_result, ok_result, timing
from tests.test_cli import run as run_cli


def row(m: int, n: int, k: int, source: str = "test") -> ShapeRow:
    return ShapeRow(m, n, k, "fp32", "train", source)


def result(task: Task, cand_us: float, cublas_us: float, lt_heur_us: float | None = None,
           lt_auto_us: float | None = None) -> ShapeResult:
    extra = {name: timing(us) for name, us in (("cublaslt_heuristic", lt_heur_us), ("cublaslt_autotuned", lt_auto_us))
             if us is not None}
    return ok_result(task, cand_us, cublas_us, **extra)


# The fixture: five shapes, one per bucket plus one missing, with hand-computable speedups vs cuBLAS.
SMALL = row(64, 64, 64)  # MNK = 2^18: bucket < 2^24, small target
SMALL2 = row(64, 64, 128)  # 2^19
MID = row(512, 512, 512)  # 2^27: bucket 2^24-2^30, just outside the small target
LARGE = row(4096, 4096, 4096)  # 2^36: bucket >= 2^36, large target
MISSING = row(1024, 1024, 1024)  # only a wrong answer and results elsewhere: no verified result
ROWS = [SMALL, SMALL2, MID, LARGE, MISSING]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "results.sqlite"
    with ResultStore(path) as s:
        s.put_source("fast-small", "// tiny_kernel.cu -- the small-shape path\n#include <cuda_fp16.h>\n")
        s.put_result("fast-small", GPU, "offline", result(SMALL.task, 1.0, 4.0, 2.0, 2.0))  # 4x, 2x, 2x
        s.put_result("slow-small", GPU, "offline", result(SMALL.task, 2.0, 4.0, 2.0, 2.0))  # slower: not the best
        s.put_result("no-source", GPU, "offline", result(SMALL2.task, 1.0, 1.0, 1.0, 0.5))  # 1x, 1x, 0.5x
        s.put_result("mid", GPU, "offline", result(MID.task, 2.0, 1.0, 1.0, 4.0))  # 0.5x, 0.5x, 2x
        s.put_result("large", GPU, "offline", result(LARGE.task, 100.0, 125.0, 125.0, 110.0))  # 1.25x, 1.25x, 1.1x
        s.put_result("wrong", GPU, "offline", failed_result(MISSING.task))
        s.put_result("elsewhere", "NVIDIA A100 (sm_80)", "offline", result(MISSING.task, 1.0, 9.0))
        s.put_result("server", GPU, "server", result(MISSING.task, 1.0, 9.0))
        s.put_result("old", GPU, "offline", result(MISSING.task, 1.0, 9.0), evaluator_version="0.0.1")
    return path


@pytest.fixture
def entries(db: Path) -> list[Entry]:
    with ResultStore(db) as s:
        return collect(ROWS, s, GPU, Mode.OFFLINE)


@pytest.mark.parametrize("mode", [Mode.CONFIRM, Mode.SERVER, Mode.WALLCLOCK])
def test_modes_after_offline_report_the_offline_winners_figure(db, mode):
    """Confirm, server and wallclock: the kernel is the one the offline search chose; its figure the mode's, never a
    faster figure in that mode of a kernel that no longer wins (that would pick the best of several again). A shape
    with no verified offline result shows its fastest kernel of the mode."""
    with ResultStore(db) as s:
        s.put_result("fast-small", GPU, mode.value, result(SMALL.task, 1.25, 4.0))  # the winner, 3.2x this time
        s.put_result("slow-small", GPU, mode.value, result(SMALL.task, 0.5, 4.0))  # faster, but not the chosen one
        s.put_result("mid", GPU, mode.value, failed_result(MID.task))  # a run in this mode that failed: no figure
        s.put_result("only-here", GPU, mode.value, result(MISSING.task, 0.5, 9.0))  # no offline result: fastest
        got = {e.task: e for e in collect(ROWS, s, GPU, mode)}
    assert got[SMALL.task].kernel_hash == "fast-small" and got[SMALL.task].speedups["cublas"] == pytest.approx(3.2)
    assert got[MID.task].result is None and got[LARGE.task].result is None  # not timed in the mode: missing
    assert got[MISSING.task].kernel_hash == "only-here" and got[MISSING.task].speedups["cublas"] == pytest.approx(18)


def paired(**medians: float) -> dict[str, PairedSpeedup]:
    return {b: PairedSpeedup(m, m * 0.98, m * 1.02, 10) for b, m in medians.items()}


@pytest.fixture
def confirmed(db: Path) -> Path:
    """The fixture's chosen kernels timed once more in confirm mode: SMALL and LARGE with the paired speedup
    (unlike their ratio of medians), MID before the harness reported one, SMALL2 and MISSING not at all."""
    with ResultStore(db) as s:
        s.put_result("fast-small", GPU, "confirm", replace(result(SMALL.task, 1.0, 4.0, 2.0, 2.0),
                                                           paired=paired(cublas=3.5, cublaslt_autotuned=1.9)))
        s.put_result("large", GPU, "confirm", replace(result(LARGE.task, 100.0, 125.0, 125.0, 110.0),
                                                      paired=paired(cublas=1.2, cublaslt_autotuned=1.05)))
        s.put_result("mid", GPU, "confirm", result(MID.task, 2.0, 1.0, 1.0, 4.0))
    return db


def test_paired_estimator_scores_only_results_with_the_paired_speedup(confirmed):
    with ResultStore(confirmed) as s:
        got = {e.task: e for e in collect(ROWS, s, GPU, Mode.CONFIRM, estimator=Estimator.PAIRED)}
        ratio = {e.task: e for e in collect(ROWS, s, GPU, Mode.CONFIRM)}
    assert got[SMALL.task].speedups == {"cublas": 3.5, "cublaslt_autotuned": 1.9}  # the paired medians
    assert ratio[SMALL.task].speedups["cublas"] == 4.0  # the same result by the ratio of medians
    assert got[LARGE.task].speedups["cublas"] == 1.2 and not got[LARGE.task].unpaired
    assert got[MID.task].result is not None and got[MID.task].unpaired and got[MID.task].speedups == {}
    assert got[SMALL2.task].result is None and not got[SMALL2.task].unpaired  # missing, not unpaired
    large = check_target(TARGETS[3], got.values())
    assert (large.verdict, large.stats.geomean) == (Verdict.PASS, pytest.approx(1.2))
    small = check_target(TARGETS[2], got.values())  # SMALL2 has no confirm figure: no verdict on part of the range
    assert (small.verdict, small.stats.n, small.shapes) == (Verdict.INCOMPLETE, 1, 2)
    mid = next(g for g in bucket_summaries(list(got.values())) if g.name == "2^24-2^30")
    assert (mid.verified, mid.stats["cublas"].n) == (1, 0)  # verified, yet unscored under this estimator


def test_cli_paired_estimator_names_the_shapes_without_a_paired_figure(capsys, confirmed, shapes_csv):
    code, out, _ = run(capsys, "report", "--shapes", str(shapes_csv), "--db", str(confirmed), "--mode", "confirm",
                       "--estimator", "paired")
    assert code == 0 and " · confirm · fp32 · paired estimator" in out.splitlines()[0]
    assert "**Coverage: 3/5 shapes have a verified result, 2 missing, 1 of the verified without a paired figure**" in out
    assert "#### Verified without a paired figure (1)\n\n512_512_512" in out
    assert "| 4096 | 4096 | 4096 | `large` | 100.00 | 125.00 | 1.200x | - | 1.050x |" in out
    code, out, _ = run(capsys, "report", "--shapes", str(shapes_csv), "--db", str(confirmed), "--mode", "confirm")
    assert code == 0 and "paired estimator" not in out and "without a paired figure" not in out
    assert "| 4096 | 4096 | 4096 | `large` | 100.00 | 125.00 | 1.250x |" in out


# -- maths -----------------------------------------------------------------------------------------------------------


def test_geomean():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([0.5, 2.0, 1.0]) == pytest.approx(1.0)
    assert geomean([]) is None
    with pytest.raises(ValueError, match="non-positive"):
        geomean([1.0, 0.0])


def test_summarise():
    s = summarise([0.5, 2.0, 1.0])
    assert s.n == 3 and s.geomean == pytest.approx(1.0) and s.mean == pytest.approx(3.5 / 3)
    assert s.faster == pytest.approx(1 / 3)  # 1.0x is not faster
    assert summarise([]) == summarise(()) and summarise([]).n == 0 and summarise([]).geomean is None


def test_where_it_loses_groups_by_output_size_and_lists_the_slowest(entries):
    # SMALL and SMALL2: M*N = 2^12; MID 2^18; LARGE 2^24; MISSING (2^20) has no verified result.
    groups = {g.name: g for g in output_size_summaries(entries)}
    assert list(groups) == ["2^12-2^14", "2^18-2^20", "2^20-2^22", "2^24-2^26"]
    assert groups["2^12-2^14"].stats["cublas"].geomean == pytest.approx(2.0)  # 4x and 1x
    assert groups["2^18-2^20"].stats["cublas"].geomean == pytest.approx(0.5)
    assert (groups["2^20-2^22"].shapes, groups["2^20-2^22"].verified) == (1, 0)
    assert [e.task for e in slowest(entries, 2)] == [MID.task, SMALL2.task]  # 0.5x, then 1x
    assert len(slowest(entries, 99)) == 4  # the missing shape is never listed


@pytest.mark.parametrize("shape, small, large", [
    ((512, 512, 511), True, False),  # MNK just under 2^27
    ((512, 512, 512), False, False),  # = 2^27: no longer small
    ((4096, 4096, 4095), False, False),  # just under 2^36
    ((4096, 4096, 4096), False, True),  # = 2^36
    ((16384, 16384, 16384), False, True),
])
def test_target_range_edges(shape, small, large):
    small_target, large_target = TARGETS[2], TARGETS[3]
    assert small_target.selects(Task(*shape)) is small
    assert large_target.selects(Task(*shape)) is large
    assert TARGETS[0].selects(Task(*shape))


# -- collecting from the store ------------------------------------------------------------------------------------


def test_collect_takes_the_fastest_verified_kernel_of_this_gpu_mode_and_version(entries):
    by_task = {e.task: e for e in entries}
    small = by_task[SMALL.task]
    assert small.kernel_hash == "fast-small" and small.kernel_name == "tiny_kernel.cu"
    assert small.speedups == pytest.approx({"cublas": 4.0, "cublaslt_heuristic": 2.0, "cublaslt_autotuned": 2.0})
    assert by_task[SMALL2.task].kernel_name == ""  # no stored source text
    missing = by_task[MISSING.task]
    assert missing.result is None and missing.kernel_hash is None and missing.speedups == {}
    assert [e.task for e in entries] == [r.task for r in ROWS]


def test_bucket_summaries_never_count_missing_shapes(entries):
    groups = {g.name: g for g in bucket_summaries(entries)}
    assert list(groups) == ["< 2^24", "2^24-2^30", "2^30-2^36", ">= 2^36", "all"]
    small = groups["< 2^24"]
    assert (small.shapes, small.verified) == (2, 2)
    assert small.stats["cublas"].geomean == pytest.approx(2.0)  # sqrt(4 x 1)
    assert small.stats["cublas"].mean == pytest.approx(2.5)
    assert small.stats["cublas"].faster == pytest.approx(0.5)
    assert small.stats["cublaslt_autotuned"].geomean == pytest.approx(1.0)  # sqrt(2 x 0.5)
    assert small.stats["cublaslt_autotuned"].faster == pytest.approx(0.5)
    assert (groups["2^30-2^36"].shapes, groups["2^30-2^36"].verified) == (1, 0)  # only MISSING
    assert groups["2^30-2^36"].stats["cublas"].n == 0 and groups["2^30-2^36"].stats["cublas"].geomean is None
    everything = groups["all"]
    assert (everything.shapes, everything.verified) == (5, 4)
    # over the 4 verified shapes only: (4 x 1 x 0.5 x 1.25)^(1/4); a missing shape scored 1.0 would give ^(1/5)
    assert everything.stats["cublas"].geomean == pytest.approx(2.5 ** 0.25)
    assert everything.stats["cublas"].faster == pytest.approx(0.5)


def test_bucket_summaries_skip_empty_buckets(entries):
    assert [g.name for g in bucket_summaries([e for e in entries if e.task == LARGE.task])] == [">= 2^36", "all"]


def test_targets_need_every_shape_in_range(entries):
    complete = [e for e in entries if e.result is not None]
    verdicts = [check_target(t, complete).verdict for t in TARGETS]
    # all vs cuBLAS: 2.5^(1/4) = 1.257 >= 1.15; vs Lt autotuned: (2 x 0.5 x 2 x 1.1)^(1/4) = 1.218 >= 1.05;
    # small (the two 64-shapes): 2.0 >= 2.0; large: 1.25 >= 1.0
    assert verdicts == [Verdict.PASS, Verdict.PASS, Verdict.PASS, Verdict.PASS]
    assert check_target(Target("x", "cublas", 1.3), complete).verdict is Verdict.FAIL
    with_missing = check_target(TARGETS[0], entries)
    assert with_missing.verdict is Verdict.INCOMPLETE and (with_missing.stats.n, with_missing.shapes) == (4, 5)
    assert check_target(TARGETS[3], [e for e in entries if e.task == SMALL.task]).verdict is Verdict.NO_SHAPES


def test_target_caveat():
    grid = [Task(m, n, k) for m in (64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384)
            for n in (64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384)
            for k in (64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384)]
    assert target_caveat(grid, Mode.OFFLINE) == ""
    assert "not the full 1000-shape grid" in target_caveat(grid[:10], Mode.OFFLINE)
    assert "offline" in target_caveat(grid, Mode.SERVER)
    assert target_caveat(grid, Mode.CONFIRM) == ""  # the offline method, timed again: the targets apply
    assert "fp32" in target_caveat([Task(t.m, t.n, t.k, Acc.FP16) for t in grid], Mode.OFFLINE)
    assert target_caveat(grid, Mode.OFFLINE, "NVIDIA H200 (sm_90a)") == ""
    assert "for the H200" in target_caveat(grid, Mode.OFFLINE, "NVIDIA H100 80GB HBM3 (sm_90a)")


def test_heat_cells_aggregate_over_k(entries):
    cells = heat_cells(entries)
    assert cells[(64, 64)].geomean == pytest.approx(2.0) and (cells[(64, 64)].verified, cells[(64, 64)].shapes) == (2, 2)
    assert cells[(1024, 1024)].geomean is None and cells[(1024, 1024)].shapes == 1


@pytest.mark.parametrize("source, name", [
    ("// mma_multistage.cu -- seed kernel: the serious one\n", "mma_multistage.cu"),
    ("\n  // sm80_mma-BM128-BN128\n__global__ void k();", "sm80_mma-BM128-BN128"),
    ("#include <cuda_fp16.h>\n// late comment\n", ""),
    (None, ""),
    ("// " + "x" * 80, "x" * 40),
])
def test_kernel_name(source, name):
    assert kernel_name(source) == name


def test_resolve_gpu_takes_a_unique_part_of_a_stored_label():
    stored = ["NVIDIA H200 (sm_90a)", "NVIDIA A100 (sm_80)"]
    assert resolve_gpu("h200", None, stored) == "NVIDIA H200 (sm_90a)"
    assert resolve_gpu(None, "NVIDIA A100 (sm_80)", stored) == "NVIDIA A100 (sm_80)"
    assert resolve_gpu(None, None, ["C"]) == "C"
    for requested, machine, message in (("nvidia", None, "matches several"), ("v100", None, "matches none"),
                                        (None, None, "several GPUs have results")):
        with pytest.raises(ReportError, match=message):
            resolve_gpu(requested, machine, stored)
    with pytest.raises(ReportError, match="no ok"):
        resolve_gpu("h200", None, [])


def test_acc_override_keeps_one_row_per_shape(tmp_path):
    path = tmp_path / "s.csv"
    write_csv([row(64, 64, 64, "a"), ShapeRow(64, 64, 64, "fp16", "train", "b"), row(128, 64, 64)], path)
    assert [(r.acc, r.source) for r in load_rows(str(path), None)] == [("fp32", "a"), ("fp16", "b"), ("fp32", "test")]
    assert [(r.acc, r.source) for r in load_rows(str(path), Acc.FP16)] == [("fp16", "a"), ("fp16", "test")]


# -- markdown ------------------------------------------------------------------------------------------------------


def test_headroom_against_the_h200_bound_by_hand(entries):
    """64^3 and 64x64x128 are bound by one graph node (0.541 us): kernel 1 us, cuBLAS 4 and 1 us."""
    rows = headrooms(entries, figures_for(GPU))
    assert len(rows) == 4  # the missing shape has no times
    small = summarise_headroom("< 2^24", [r for r in rows if r.entry.task.k <= 128])
    assert small.kernel_x == pytest.approx(1 / 0.541)
    assert small.ceiling == pytest.approx(math.sqrt(4 / 0.541 * 1 / 0.541))
    assert small.speedup == pytest.approx(2.0)
    assert small.share == pytest.approx(math.log(2.0) / math.log(small.ceiling))
    large = summarise_headroom("large", [r for r in rows if r.entry.task == LARGE.task])
    assert large.ceiling == pytest.approx(125 / (2 * 4096**3 / 989.4e6)) and large.ceiling < 1
    assert large.share is None  # cuBLAS under the bound (the fixture's times are made up): no room to share


def test_headroom_section_in_replayed_modes_only(entries, db):
    text = render(ReportScope("fixture.csv", GPU, Mode.OFFLINE, db), entries)
    assert text.index("#### Where it loses") < text.index("#### Headroom") < text.index("#### Missing shapes")
    assert "| < 2^24 | 2 | 1.848x | 3.697x | 2.000x | 53% |" in text
    assert "| small: MNK < 2^27 | >= 2.00x | 2.000x | 3.697x |" in text
    assert "| 64 | 64 | 64 | 1.00 | 4.00 | 0.54 | launch | 1.848x | 7.394x |" in text
    assert "on 3 of these 4 shapes (32 x 2(MK + KN + MN) bytes within the 60 MB L2) the inputs are still in L2" in text
    assert "#### Headroom" in render(ReportScope("fixture.csv", GPU, Mode.CONFIRM, db), entries)
    cold = render(ReportScope("fixture.csv", GPU, Mode.COLD, db), entries)
    assert "#### Headroom" in cold and "still in L2" not in cold  # cold mode flushes: no shape finds its inputs
    assert "#### Headroom" not in render(ReportScope("fixture.csv", GPU, Mode.SERVER, db), entries)
    other = render(ReportScope("fixture.csv", "NVIDIA A100-SXM4-80GB (sm_80)", Mode.OFFLINE, db), entries)
    assert "#### Headroom\n\nNo bound for NVIDIA A100-SXM4-80GB (sm_80): `cudal2/roofline.py` has figures for" in other


def test_markdown(entries, db):
    text = render(ReportScope("fixture.csv", GPU, Mode.OFFLINE, db), entries)
    assert f"`fixture.csv` · {GPU} · offline · fp32" in text
    assert "**Coverage: 4/5 shapes have a verified result, 1 missing**" in text
    assert "torch.matmul makes (there is no separate torch timing)" in text
    assert "leans optimistic" in text and "Confirm mode" not in text  # the best of many figures, and it says so
    confirm = render(ReportScope("fixture.csv", GPU, Mode.CONFIRM, db), entries)
    assert "Confirm mode: each shape's fastest offline kernel timed once more" in confirm
    assert "leans optimistic" not in confirm
    assert "#### Missing shapes (1)\n\n1024_1024_1024\n" in text
    assert "| 1024 | 1024 | 1024 | missing | - | - | - | - | - |" in text
    assert "| 64 | 64 | 64 | `fast-small` tiny_kernel.cu | 1.00 | 4.00 | 4.000x | 2.000x | 2.000x |" in text
    assert "| all shapes | torch.matmul / cuBLAS | 4/5 | 1.257x | >= 1.15x | INCOMPLETE |" in text
    assert "| < 2^24 | 2 | 2 | torch.matmul / cuBLAS | 2 | 2.000x | 2.500x | 50% |" in text
    assert "Indicative only here: this set is not the full 1000-shape grid." in text
    assert "#### Where it loses" in text and "| 2^18-2^20 | 1 | 1 | torch.matmul / cuBLAS | 1 | 0.500x |" in text
    assert text.index("The 4 slowest shapes") < text.index("| 512 | 512 | 512 | `mid`") < text.index("#### Per shape")
    for table_line in (line for line in text.splitlines() if line.startswith("| ")):
        # every row of a table has as many cells as its header
        header = next(h for h in text.split("\n\n") if table_line in h).splitlines()[0]
        assert table_line.count(" | ") == header.count(" | ")


def test_rank_speedup_chooses_by_the_same_evaluations_speedup(db):
    """SMALL: 'fast-small' 1 us (4x) beats 'slow-small' 2 us (2x) either way. MID: a second kernel timed in a slower
    evaluation (3 us against cuBLAS's 2 us, 0.67x) beats 'mid' (2 us against 1 us, 0.5x) by speedup only; confirm
    mode then shows the figure of the kernel chosen that way."""
    with ResultStore(db) as s:
        s.put_result("mid-steady", GPU, "offline", result(MID.task, 3.0, 2.0))
        s.put_result("mid-steady", GPU, "confirm", result(MID.task, 3.0, 2.4))
        s.put_result("mid", GPU, "confirm", result(MID.task, 2.0, 1.0))
        by_time = {e.task: e for e in collect(ROWS, s, GPU, Mode.CONFIRM)}
        by_speedup = {e.task: e for e in collect(ROWS, s, GPU, Mode.CONFIRM, rank=Rank.SPEEDUP)}
        offline = {e.task: e.kernel_hash for e in collect(ROWS, s, GPU, Mode.OFFLINE, rank=Rank.SPEEDUP)}
    assert by_time[MID.task].kernel_hash == "mid" and by_time[MID.task].speedups["cublas"] == pytest.approx(0.5)
    assert by_speedup[MID.task].kernel_hash == "mid-steady"
    assert by_speedup[MID.task].speedups["cublas"] == pytest.approx(0.8)
    assert offline[MID.task] == "mid-steady" and offline[SMALL.task] == "fast-small"
    text = render(ReportScope("fixture.csv", GPU, Mode.CONFIRM, db, rank=Rank.SPEEDUP), list(by_speedup.values()))
    assert "· kernels chosen by speedup" in text and "(`--rank speedup`)" in text


def test_a_tuned_kernel_is_named_by_its_config(db):
    with ResultStore(db) as s, TuneLog(s) as log:
        log.put_config("mid", ConfigRecord("sm80_mma", "sm80_mma-bm64-bn64", {"bm": 64}))
    with ResultStore(db) as s:
        names = {e.task: e.kernel_name for e in collect(ROWS, s, GPU, Mode.OFFLINE)}
    assert names[MID.task] == "sm80_mma-bm64-bn64" and names[SMALL.task] == "tiny_kernel.cu"


def test_markdown_source_column_only_when_sources_differ(db):
    rows = [row(64, 64, 64, "Llama-3-8B/q_proj"), row(64, 64, 128, "Qwen2.5-7B/k_proj")]
    with ResultStore(db) as s:
        text = render(ReportScope("x", GPU, Mode.OFFLINE, db), collect(rows, s, GPU, Mode.OFFLINE))
    assert "| M | N | K | source | kernel |" in text and "| 64 | 64 | 64 | Llama-3-8B/q_proj |" in text


# Model layers over the fixture's shapes (speedups vs cuBLAS: SMALL 4x at 1 vs 4 us, SMALL2 1x at 1 vs 1 us, MID 0.5x
# at 2 vs 1 us, MISSING unverified). Model A at M = 64: q_proj and o_proj share SMALL's shape, up_proj is SMALL2.
LAYER_ROWS = [row(64, 64, 64, "A/q_proj;A/o_proj;B/q_proj"), row(64, 64, 128, "A/up_proj"),
              row(512, 512, 512, "B/k_proj"), row(1024, 1024, 1024, "B/v_proj")]


def test_model_passes_count_each_layer_and_weigh_by_time(db):
    with ResultStore(db) as s:
        layer_entries = collect(LAYER_ROWS, s, GPU, Mode.OFFLINE)
    passes = {(p.model, p.tokens): p for p in model_passes(layer_entries)}
    assert list(passes) == [("A", 64), ("B", 64), ("B", 512), ("B", 1024)]
    a = passes[("A", 64)]
    assert (a.layers, a.verified) == (3, 3)
    assert a.geomean == pytest.approx((4 * 4 * 1) ** (1 / 3))  # SMALL counted for q_proj and for o_proj
    assert a.time_ratio == pytest.approx((4 + 4 + 1) / (1 + 1 + 1))  # cuBLAS us over ours, summed over layers
    assert passes[("B", 512)].time_ratio == pytest.approx(0.5)
    missing = passes[("B", 1024)]
    assert (missing.layers, missing.verified, missing.geomean, missing.time_ratio) == (1, 0, None, None)
    tokens = {g.name: g for g in token_summaries(layer_entries)}
    assert list(tokens) == ["M = 64", "M = 512", "M = 1024"]
    assert (tokens["M = 64"].shapes, tokens["M = 64"].stats["cublas"].geomean) == (2, pytest.approx(2.0))  # once each


def test_time_ratio_needs_every_layer_verified(db):
    rows = [row(64, 64, 64, "A/q_proj"), row(64, 100, 100, "A/k_proj")]  # the second shape has no result
    with ResultStore(db) as s:
        (only,) = model_passes(collect(rows, s, GPU, Mode.OFFLINE))
    assert (only.layers, only.verified, only.geomean) == (2, 1, pytest.approx(4.0))
    assert only.time_ratio is None  # a sum over the verified layer alone would claim 4x for the block


def test_markdown_by_model_only_for_sets_that_name_layers(db, entries):
    with ResultStore(db) as s:
        text = render(ReportScope("llm.csv", GPU, Mode.OFFLINE, db), collect(LAYER_ROWS, s, GPU, Mode.OFFLINE))
    assert "#### By token count and model" in text
    assert "| M = 64 | 2 | 2 | torch.matmul / cuBLAS | 2 | 2.000x |" in text
    assert "| A | 64 | 3 | 3 | 2.520x | 3.000x |" in text and "| B | 1024 | 1 | 0 | - | - |" in text
    assert "By token count" not in render(ReportScope("grid.csv", GPU, Mode.OFFLINE, db), entries)


# -- the command -----------------------------------------------------------------------------------------------------


@pytest.fixture
def shapes_csv(tmp_path: Path) -> Path:
    path = tmp_path / "shapes.csv"
    write_csv([*ROWS[:-1], ShapeRow(*(MISSING.M, MISSING.N, MISSING.K), "fp32", "heldout", "test")], path)
    return path


@pytest.fixture(autouse=True)
def _no_gpu(monkeypatch):
    monkeypatch.setenv("CUDAL2_NO_GPU", "1")  # the GPU label then comes from --gpu or the store


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """`cudal2 *argv`, with --gpu GPU unless given (the fixture store also holds an A100 result)."""
    return run_cli(capsys, *argv, *([] if "--gpu" in argv else ["--gpu", GPU]))


def test_cli_prints_the_report(capsys, db, shapes_csv):
    code, out, err = run(capsys, "report", "--shapes", str(shapes_csv), "--db", str(db))
    assert code == 0 and err == ""
    assert out.startswith(f"### Leaderboard: `{shapes_csv}` · {GPU} · offline · fp32")
    assert "**Coverage: 4/5 shapes" in out and "| 4096 | 4096 | 4096 | `large` |" in out


def test_cli_on_the_committed_grid(capsys, db):
    code, out, _ = run(capsys, "report", "--shapes", str(ROOT / "data" / "grid.csv"), "--db", str(db))
    assert code == 0 and "Coverage: 4/1000" in out and "Indicative only" not in out  # the targets' own set
    assert "| small: MNK < 2^27 | torch.matmul / cuBLAS | 2/174 | 2.000x | >= 2.00x | INCOMPLETE |" in out


def test_cli_gpu_label_defaults_to_the_stores_only_one(capsys, shapes_csv, tmp_path):
    with ResultStore(tmp_path / "one.sqlite") as s:
        s.put_result("h", "gpu A", "offline", result(SMALL.task, 1.0, 2.0))
        s.put_result("h", "gpu B", "offline", failed_result(SMALL.task))  # not ok: not a candidate label
    code = cli.main(["report", "--shapes", str(shapes_csv), "--db", str(tmp_path / "one.sqlite")])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith(f"### Leaderboard: `{shapes_csv}` · gpu A ·") and "Coverage: 1/5" in out


def test_cli_split_and_out_file(capsys, db, shapes_csv, tmp_path):
    out_md = tmp_path / "sub" / "report.md"
    code, out, _ = run(capsys, "report", "--shapes", f"{shapes_csv}:heldout", "--db", str(db), "--gpu", GPU,
                       "--out", str(out_md))
    assert code == 0 and out.splitlines()[0] == f"report written to {out_md}: 0/1 shapes verified"
    assert "**Coverage: 0/1 shapes have a verified result, 1 missing**" in out_md.read_text()


def test_cli_unknown_gpu_label_says_which_labels_exist(capsys, db, shapes_csv):
    code, _, err = run(capsys, "report", "--shapes", str(shapes_csv), "--db", str(db), "--gpu", "B200")
    assert code == 2 and "--gpu 'B200' matches none" in err and GPU in err


@pytest.mark.parametrize("argv, message", [
    (["--shapes", "/no/such.csv"], "cannot read"),
    (["--shapes", "{csv}:held"], "unknown split 'held'"),
    (["--shapes", "{csv}", "--db", "{tmp}/none.sqlite"], "no result store there"),
    (["--shapes", "{csv}", "--db", "{tmp}/garbage.sqlite"], "cannot open as a cudal2 result store"),
    # an empty --gpu counts as none given: with no GPU here and two labels in the store, none can be chosen
    (["--shapes", "{csv}", "--db", "{tmp}/two-gpus.sqlite", "--gpu", ""], "choose one with --gpu"),
    (["--shapes", "{csv}", "--out", "{csv}/x.md"], "cannot write"),
])
def test_cli_bad_input_is_one_line_exit_2(capsys, db, shapes_csv, tmp_path, argv, message):
    (tmp_path / "garbage.sqlite").write_bytes(b"not a database" * 50)
    with ResultStore(tmp_path / "two-gpus.sqlite") as s:
        s.put_result("h", "gpu A", "offline", result(SMALL.task, 1.0, 1.0))
        s.put_result("h", "gpu B", "offline", result(SMALL.task, 1.0, 1.0))
    argv = [a.format(csv=shapes_csv, tmp=tmp_path) for a in argv]
    if "--db" not in argv:
        argv += ["--db", str(db)]
    code, _, err = run(capsys, "report", *argv)
    assert code == 2 and message in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("cudal2: error:") and "Traceback" not in err
    assert (tmp_path / "garbage.sqlite").read_bytes() == b"not a database" * 50
    assert not (tmp_path / "none.sqlite").exists()


def test_cli_heatmap_without_matplotlib(capsys, db, shapes_csv, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    png = tmp_path / "h.png"
    code, out, err = run(capsys, "report", "--shapes", str(shapes_csv), "--db", str(db), "--heatmap", str(png))
    assert code == 2 and out == "" and "--heatmap needs matplotlib" in err and len(err.strip().splitlines()) == 1
    assert not png.exists()


def test_cli_heatmap_written(capsys, db, shapes_csv, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "plots" / "h.png"
    code, out, _ = run(capsys, "report", "--shapes", str(shapes_csv), "--db", str(db), "--heatmap", str(png))
    assert code == 0 and f"heatmap written to {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_heatmap_of_the_fixture_has_grey_missing_cells(entries, tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    from cudal2.report import write_heatmap

    png = tmp_path / "h.png"
    write_heatmap(entries, png, "fixture")
    pixels = imread(png)
    grey = (abs(pixels[..., 0] - 0.6) < 0.01) & (abs(pixels[..., 1] - 0.6) < 0.01) & (abs(pixels[..., 2] - 0.6) < 0.01)
    assert grey.any()  # (1024, 1024) has no verified K
    assert not math.isnan(float(pixels.mean()))


def test_against_offline_pairs_each_shapes_chosen_kernel_and_splits_by_l2(db):
    """Cold figures of two chosen kernels: 64^3 (offline 1 us vs cuBLAS 4; cold 2 vs 6) and 4096^3 (100 vs 125; cold
    110 vs 130). Per group: speedups offline and cold, and the cold / offline time ratios of kernel and cuBLAS. 64^3's
    32 input sets fit the H200's L2, 4096^3's do not. Shapes without a cold figure are left out."""
    with ResultStore(db) as s:
        s.put_result("fast-small", GPU, "cold", result(SMALL.task, 2.0, 6.0))
        s.put_result("large", GPU, "cold", result(LARGE.task, 110.0, 130.0))
        cold, offline = collect(ROWS, s, GPU, Mode.COLD), collect(ROWS, s, GPU, Mode.OFFLINE)
    text = render(ReportScope("fixture.csv", GPU, Mode.COLD, db), cold, offline)
    section = text[text.index("#### Against offline"):text.index("#### Missing shapes")]
    assert "over the 2 shapes verified in both" in section
    for line in ("| < 2^24 | 1 | 4.000x | 3.000x | 2.000x | 1.500x |",
                 "| >= 2^36 | 1 | 1.250x | 1.182x | 1.100x | 1.040x |",
                 f"| all | 2 | {math.sqrt(4 * 1.25):.3f}x | {math.sqrt(3 * 130 / 110):.3f}x | "
                 f"{math.sqrt(2 * 1.1):.3f}x | {math.sqrt(1.5 * 1.04):.3f}x |",
                 "| inputs in L2 offline (32 sets <= 60 MB) | 1 | 4.000x | 3.000x | 2.000x | 1.500x |",
                 "| inputs not in L2 offline | 1 | 1.250x | 1.182x | 1.100x | 1.040x |"):
        assert line in section
    assert "#### Against offline" not in render(ReportScope("fixture.csv", GPU, Mode.OFFLINE, db), offline, offline)
    assert "#### Against offline" not in render(ReportScope("fixture.csv", GPU, Mode.COLD, db), cold)
    nothing = render(ReportScope("fixture.csv", GPU, Mode.SERVER, db), offline[:0], offline)
    assert "No shape verified both in offline and in server mode" in nothing


def test_cli_report_in_another_mode_compares_with_offline(capsys, db, shapes_csv):
    with ResultStore(db) as s:
        s.put_result("fast-small", GPU, "server", result(SMALL.task, 5.0, 10.0))
    code, out, err = run(capsys, "report", "--shapes", str(shapes_csv), "--db", str(db), "--mode", "server")
    assert code == 0 and err == ""
    assert "| < 2^24 | 1 | 4.000x | 2.000x | 5.000x | 2.500x |" in out[out.index("#### Against offline"):]


H100 = "NVIDIA H100 80GB HBM3 (sm_90a)"


@pytest.fixture
def chosen_elsewhere(db: Path) -> Path:
    """The H200-chosen small kernel ("fast-small": `GPU`'s offline winner) timed on an H100 by `remeasure --chosen-on`:
    confirm (1.5 us vs cuBLAS 3.0) and cold (2.0 vs 3.5). The H100 also has its own offline winner on SMALL and on MID,
    which a report of the H200's choice must not show."""
    with ResultStore(db) as s:
        s.put_result("fast-small", H100, "confirm", result(SMALL.task, 1.5, 3.0))
        s.put_result("fast-small", H100, "cold", result(SMALL.task, 2.0, 3.5))
        s.put_result("h100-own", H100, "offline", result(SMALL.task, 0.5, 3.0))
        s.put_result("h100-own", H100, "offline", result(MID.task, 0.5, 3.0))
    return db


def test_kernels_chosen_on_another_gpu_take_their_figures_on_this_one(chosen_elsewhere):
    with ResultStore(chosen_elsewhere) as s:
        cold = {e.task: e for e in collect(ROWS, s, H100, Mode.COLD, chosen_on=GPU)}
        confirm = collect(ROWS, s, H100, Mode.CONFIRM, chosen_on=GPU)
        offline = {e.task: e for e in collect(ROWS, s, H100, Mode.OFFLINE, chosen_on=GPU)}
        own = {e.task: e for e in collect(ROWS, s, H100, Mode.OFFLINE)}
    assert cold[SMALL.task].kernel_hash == "fast-small" and cold[SMALL.task].speedups["cublas"] == pytest.approx(1.75)
    assert [e.task for e in confirm if e.result is not None] == [SMALL.task]
    assert all(e.result is None for e in offline.values())  # the H200's kernels have no H100 offline figure
    assert own[SMALL.task].kernel_hash == "h100-own" and own[MID.task].kernel_hash == "h100-own"
    scope = ReportScope("fixture.csv", H100, Mode.COLD, chosen_elsewhere, chosen_on=GPU, against=Mode.CONFIRM)
    text = render(scope, list(cold.values()), confirm)
    assert f"· kernels chosen on {GPU}" in text.splitlines()[0]
    caveat = text[text.index("**Indicative only here:"):].split("**")[1]
    assert "the targets are for the H200" in caveat and "the targets are for offline mode" in caveat
    section = text[text.index("#### Against confirm"):text.index("#### Missing shapes")]
    assert "| < 2^24 | 1 | 2.000x | 1.750x | 1.333x | 1.167x |" in section  # 3/1.5, 3.5/2, 2/1.5, 3.5/3
    empty = render(replace(scope, against=Mode.OFFLINE), list(cold.values()), list(offline.values()))
    assert "--against confirm compares with the offline method's figures" in empty


def test_cli_report_chosen_on_another_gpu_and_its_one_line_errors(capsys, chosen_elsewhere, shapes_csv):
    args = ("report", "--shapes", str(shapes_csv), "--db", str(chosen_elsewhere), "--gpu", "h100")
    code, out, err = run(capsys, *args, "--chosen-on", "h200", "--mode", "cold", "--against", "confirm")
    assert code == 0 and err == "" and "| < 2^24 | 1 | 2.000x | 1.750x |" in out[out.index("#### Against confirm"):]
    code, out, err = run(capsys, *args, "--chosen-on", "nvidia")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--chosen-on 'nvidia' matches several" in err
