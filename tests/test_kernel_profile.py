"""benchmarks/kernel_profile.py on the CPU: reading Nsight Compute's raw CSV (a real run's rows, columns cut down)."""

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
kernel_profile = importlib.import_module("kernel_profile")

# ncu 2025.3 on the H200, 128x128x16384 (split-K on both sides), `--csv --page raw --print-units base`: its banner
# lines, the header, the units row, then one row per kernel; thousands separators inside quoted numbers.
NCU_CSV = """\
==PROF== Connected to process 4944 (/tmp/kernel_profile)
128x128x16384 candidate and cuBLAS called once each (candidate workspace 524288 bytes)
==PROF== Disconnected from process 4944
"ID","Kernel Name","Stream","gpu__time_duration.sum","launch__grid_size","launch__registers_per_thread",\
"dram__bytes_read.sum","smsp__inst_executed.sum","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",\
"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
"","","","ns","","register/thread","byte","inst","inst","inst"
"0","void cutlass::device_kernel<cutlass::GemmUniversal<...>>(T1::Params)","13","7,328","64","168","8,410,624",\
"679,906","1.55","1.25"
"1","cudal2_sm90::splitk_reduce(const float *, __half *, long long, int, int)","13","4,800","16","32","536,832",\
"21,120","17.02","1.75"
"2","nvjet_sm90_hsh_64x32_64x16_2x4_h_bz_splitK_TNT","14","6,688","96","168","8,404,480","639,366","5.88","1.79"
"3","void cublasLt::splitKreduce_kernel<32, 16, int, float>(cublasLt::cublasSplitKParams<T6>)","14","3,808","32",\
"32","795,392","72,704","11.30","2.48"
"""


def test_rows_are_told_apart_by_the_stream_that_launched_them():
    rows = kernel_profile.parse_ncu_csv(NCU_CSV)
    assert [r.caller for r in rows] == ["candidate", "candidate", "cublas", "cublas"]
    assert rows[1].name.startswith("cudal2_sm90::splitk_reduce") and rows[2].name.startswith("nvjet_sm90")
    assert rows[0].metrics["dram__bytes_read.sum"] == 8410624.0  # "8,410,624"
    assert rows[0].metrics["launch__grid_size"] == 64.0
    assert kernel_profile.total_us(rows, "candidate") == pytest.approx(12.128)
    assert kernel_profile.total_us(rows, "cublas") == pytest.approx(10.496)


def test_stall_reasons_come_largest_first():
    rows = kernel_profile.parse_ncu_csv(NCU_CSV)
    assert rows[1].stalls == (("long_scoreboard", 17.02), ("wait", 1.75))
    assert rows[0].stalls[0] == ("long_scoreboard", 1.55)


def test_table_rows_carry_the_figures():
    rows = kernel_profile.parse_ncu_csv(NCU_CSV)
    line = kernel_profile.kernel_table("128x128x16384", rows, top=1)[1]
    assert "| candidate |" in line and "| 4.80 |" in line and "long_scoreboard 17.02" in line and "wait" not in line


def test_output_without_a_table_gives_no_rows():
    assert kernel_profile.parse_ncu_csv("==PROF== No kernels were profiled.\n") == []


def test_a_csv_of_another_page_is_refused_in_one_line():
    with pytest.raises(ValueError, match="no Stream or Kernel Name column"):
        kernel_profile.parse_ncu_csv('"Section Name","Metric Name"\n"SOL","Duration"\n"0","x"\n')


def test_a_malformed_shape_is_one_line():
    with pytest.raises(SystemExit, match="expected MxNxK"):
        kernel_profile.parse_shape("1024x512")


def _store_with(tmp_path, source, task, median_us):
    """A store holding one offline result of `source` on `task` (H200 label), timed at `median_us` against cuBLAS."""
    from cudal2.sandbox.evaluator import source_hash
    from cudal2.sandbox.store import ResultStore
    from cudal2.sandbox.types import Mode, ShapeResult, Status, Timing

    store = ResultStore(tmp_path / "s.sqlite")
    h = source_hash(source)
    store.put_source(h, source)
    def timing(us: float) -> Timing:
        return Timing(median_us=us, min_us=us, p10_us=us, p90_us=us, p99_us=us, spread=0.0, reps=10)

    result = ShapeResult(task=task, status=Status.OK, reason="", timings={"candidate": timing(median_us),
                                                                        "cublas": timing(2 * median_us)})
    store.put_result(h, "h200", Mode.OFFLINE, result)
    return store


def test_named_configs_are_profiled_on_every_shape_with_the_stores_replay_where_measured(tmp_path):
    from cudal2 import tune
    from cudal2.sandbox.types import Task

    names = ["small-bm16-bn32-warps_m1-warps_n2-warps_k4-k_unroll1-accfp32-grid_k8",
             "small-bm16-bn32-warps_m1-warps_n2-warps_k4-k_unroll1-accfp32-grid_k8-spread1"]
    plain = tune.candidate_named(tune.FAMILIES, names[0])
    measured, other = Task(64, 64, 8192), Task(128, 64, 4096)
    store = _store_with(tmp_path, plain.family.render(plain.cfg), measured, 4.0)
    picks = kernel_profile.named_picks(store, {"64x64x8192": measured, "128x64x4096": other}, "h200", names)
    assert [(p.shape, p.replay_us) for p in picks] == [("64x64x8192", (4.0, 8.0)), ("128x64x4096", None),
                                                       ("64x64x8192", None), ("128x64x4096", None)]
    assert [kernel_profile.source_title(p.source) for p in picks[::2]] == [f"Config {name}" for name in names]


def test_a_config_name_that_does_not_parse_is_one_line(tmp_path):
    from cudal2.sandbox.store import ResultStore
    from cudal2.sandbox.types import Task

    with pytest.raises(SystemExit, match="kernel_profile: config .*bogus"):
        kernel_profile.named_picks(ResultStore(tmp_path / "s.sqlite"), {"64x64x64": Task(64, 64, 64)}, "h200",
                                   ["small-bogus1"])
