"""Where the family's best kernel loses to cuBLAS on a shape: Nsight Compute counters of both, side by side (GPU).

For each shape: the store's fastest verified kernel (offline mode) is compiled as the evaluator compiles it, then
benchmarks/kernel_profile.cu calls it once and cuBLAS once under `ncu` (caches flushed before each kernel, clocks
left alone as the device notes ask). Per kernel: duration, launch shape, registers, dynamic shared memory, DRAM
bytes, instructions, SM and memory throughput, and the warp stall reasons that cost most. The store's graph-replay
times of the same shape come alongside (ncu's duration of one isolated launch runs ~1 us over a kernel's replay
time, so compare ours with cuBLAS's within a column, not across).

    python3 benchmarks/kernel_profile.py --db STORE --shapes 1024x512x256 128x128x16384 --out profile.md [--raw DIR]
                                         [--config NAME ...]

`--config NAME` (repeatable; a name as `cudal2 tune` prints it) profiles those configs, rendered today, on every shape
instead of the store's fastest kernel (e.g. a cut next to its `spread` twin); their replay times come from the store
where it measured that very source on the shape, else the column says so.

It measures; it asserts nothing. Duration under ncu is one cold call in isolation, not the evaluator's figure.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cudal2 import tune
from cudal2.sandbox.compiler import compile_source
from cudal2.sandbox.evaluator import default_cache_dir, source_hash
from cudal2.sandbox.gpu import detect_gpu
from cudal2.sandbox.store import ResultStore
from cudal2.sandbox.types import Mode, ShapeResult, Status, Task

ROOT = Path(__file__).resolve().parent.parent
DRIVER_SRC = ROOT / "benchmarks" / "kernel_profile.cu"
METRICS = (
    "gpu__time_duration.sum",
    "launch__grid_size",
    "launch__block_size",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "smsp__inst_executed.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
)
# WarpStateStats reports, per reason, the average number of warps stalled on it per issued instruction.
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio")


@dataclass(frozen=True)
class KernelRow:
    """One profiled kernel: which call launched it ("candidate" or "cublas"), its name and its counters."""

    caller: str
    name: str
    metrics: dict[str, float]
    stalls: tuple[tuple[str, float], ...]  # (reason, warps per issued instruction), largest first


@dataclass(frozen=True)
class Pick:
    """One kernel to profile on one shape: its source and, where the store measured that source there (offline),
    the replay medians of it and of cuBLAS in that evaluation, microseconds."""

    shape: str  # MxNxK as given
    task: Task
    source: str
    replay_us: tuple[float, float] | None  # (ours, cuBLAS's); None: never measured on this shape


def store_picks(store: ResultStore, tasks: dict[str, Task], gpu: str) -> list[Pick]:
    """The store's fastest verified kernel (offline) per shape; shapes without one are named on stderr."""
    picks = []
    for text, task in tasks.items():
        best = store.best(task, gpu, mode=Mode.OFFLINE, baseline="cublas", limit=1)
        if not best:
            print(f"{text}: no verified kernel in the store", file=sys.stderr)
            continue
        h, result = best[0]
        picks.append(Pick(text, task, store.get_source(h), _replay(result)))
    return picks


def named_picks(store: ResultStore, tasks: dict[str, Task], gpu: str, names: list[str]) -> list[Pick]:
    """Every named config (rendered today) on every shape; SystemExit naming a config that does not parse."""
    sources = []
    for name in names:
        try:
            cand = tune.candidate_named(tune.FAMILIES, name)
        except tune.TuneInputError as e:
            raise SystemExit(f"kernel_profile: {e}") from None
        sources.append(cand.family.render(cand.cfg))
    picks = []
    for source in sources:
        for text, task in tasks.items():
            result = store.get_result(source_hash(source), task, gpu, Mode.OFFLINE)
            ok = result is not None and result.status is Status.OK
            picks.append(Pick(text, task, source, _replay(result) if ok else None))
    return picks


def source_title(source: str) -> str:
    """What names a source in the summary: its `// Config NAME` header line (the families' sources), else its first
    line."""
    lines = [line.lstrip("/ ").strip() for line in source.lstrip().splitlines()[:40]]
    return next((line for line in lines if line.startswith("Config ")), lines[0] if lines else "")


def _replay(result: ShapeResult) -> tuple[float, float]:
    return result.timings["candidate"].median_us, result.timings["cublas"].median_us


def parse_shape(text: str) -> Task:
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", text.strip())
    if not m:
        raise SystemExit(f"shape {text!r}: expected MxNxK, e.g. 1024x512x256")
    return Task(*(int(g) for g in m.groups()))


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> list[KernelRow]:
    """ncu `--csv --page raw --print-units base`: a header row, a units row, one row per kernel in launch order.
    The stream that launched first is the candidate's (the driver calls it first, on its own stream)."""
    lines = [line for line in text.splitlines() if line.startswith('"')]  # ncu's own "==PROF==" lines are not CSV
    table = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(table) < 2:
        return []
    header, body = table[0], [r for r in table[1:] if r and r[0].strip().isdigit()]  # skip the units row
    col = {name: i for i, name in enumerate(header)}
    if "Stream" not in col or "Kernel Name" not in col:
        raise ValueError("ncu's CSV has no Stream or Kernel Name column (not `--page raw`?)")
    stall_cols = [(m.group(1), i) for h, i in col.items() if (m := STALL.fullmatch(h))]
    streams: list[str] = []
    rows = []
    for r in body:
        stream = r[col["Stream"]]
        if stream not in streams:
            streams.append(stream)
        metrics = {m: v for m in METRICS if m in col and (v := _number(r[col[m]])) is not None}
        stalls = sorted(((reason, v) for reason, i in stall_cols if (v := _number(r[i])) is not None),
                        key=lambda kv: -kv[1])
        caller = "candidate" if stream == streams[0] else "cublas"
        rows.append(KernelRow(caller, r[col["Kernel Name"]], metrics, tuple(stalls)))
    return rows


def short_name(name: str, width: int = 48) -> str:
    """nvjet names whole; a template instantiation cut to its first `width` characters."""
    return name if len(name) <= width else name[: width - 3] + "..."


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "" if value is None else f"{value / scale:.{digits}f}"


def kernel_table(shape: str, rows: list[KernelRow], top: int) -> list[str]:
    out = []
    for r in rows:
        g = r.metrics.get
        stalls = ", ".join(f"{k} {v:.2f}" for k, v in r.stalls[:top])
        out.append(
            f"| {shape} | {r.caller} | `{short_name(r.name)}` | {_fmt(g('gpu__time_duration.sum'), 1e3)} "
            f"| {_fmt(g('launch__grid_size'), 1, 0)} | {_fmt(g('launch__block_size'), 1, 0)} "
            f"| {_fmt(g('launch__registers_per_thread'), 1, 0)} "
            f"| {_fmt(g('launch__shared_mem_per_block_dynamic'), 1024, 0)} "
            f"| {_fmt(g('dram__bytes_read.sum'), 1e6)} / {_fmt(g('dram__bytes_write.sum'), 1e6)} "
            f"| {_fmt(g('smsp__inst_executed.sum'), 1e3, 0)} "
            f"| {_fmt(g('sm__throughput.avg.pct_of_peak_sustained_elapsed'), 1, 0)} "
            f"| {_fmt(g('gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed'), 1, 0)} | {stalls} |")
    return out


def total_us(rows: list[KernelRow], caller: str) -> float:
    return sum(r.metrics.get("gpu__time_duration.sum", 0.0) for r in rows if r.caller == caller) / 1e3


def build_driver(out: Path) -> None:
    cmd = ["nvcc", "-O2", "-std=c++17", "-arch=sm_90a", "-o", str(out), str(DRIVER_SRC), "-lcublas", "-ldl"]
    subprocess.run(cmd, check=True, cwd=ROOT / "benchmarks")


def profile(driver: Path, lib: str, task: Task, timeout_s: float) -> str:
    cmd = ["ncu", "--clock-control", "none", "--cache-control", "all", "-k", "regex:^(?!kp_)",
           "--section", "WarpStateStats", "--metrics", ",".join(METRICS),
           "--csv", "--page", "raw", "--print-units", "base",
           str(driver), lib, str(task.m), str(task.n), str(task.k)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"ncu exit {done.returncode}: {(done.stderr or done.stdout).strip()[-400:]}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, help="result store with the shapes' verified kernels")
    ap.add_argument("--shapes", nargs="+", required=True, help="MxNxK, fp32 accumulate")
    ap.add_argument("--out", required=True, help="markdown table to write")
    ap.add_argument("--raw", help="folder for ncu's raw CSV per shape")
    ap.add_argument("--top", type=int, default=3, help="stall reasons shown per kernel")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per ncu run")
    ap.add_argument("--jobs", type=int, default=12, help="parallel nvcc processes")
    ap.add_argument("--config", action="append", default=[],
                    help="profile this config (a `cudal2 tune` name, rendered today) on every shape instead of the "
                         "store's fastest kernel (repeatable)")
    args = ap.parse_args(argv)

    gpu = detect_gpu(0)
    if gpu is None:
        raise SystemExit("kernel_profile: no GPU")
    store = ResultStore(args.db)
    tasks = {text: parse_shape(text) for text in args.shapes}
    picks = (named_picks(store, tasks, gpu.label, args.config) if args.config
             else store_picks(store, tasks, gpu.label))
    driver = Path("/tmp/kernel_profile")
    # nvcc takes ~40 s per CUTLASS source on one core: all of them at once, and the driver alongside.
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        built = pool.submit(build_driver, driver)
        unique = {p.source: None for p in picks}  # one compile per source, whichever shapes it runs on
        jobs = {src: pool.submit(compile_source, src, gpu.arch, default_cache_dir()) for src in unique}
        compiled = {src: job.result() for src, job in jobs.items()}
        built.result()
    table = ["| shape | call | kernel | us (ncu) | grid | block | regs | smem KiB | DRAM MB r / w | kinst | SM % "
             "| mem % | top stalls (warps per issue) |", "|" + "---|" * 13]
    summary = ["| shape | candidate config | replay us: ours / cuBLAS | kernels us (ncu): ours / cuBLAS |",
               "|---|---|---|---|"]
    for pick in picks:
        text, comp = pick.shape, compiled[pick.source]
        if comp.status is not Status.COMPILED:
            print(f"{text}: {comp.status.value}: {comp.reason}", file=sys.stderr)
            continue
        try:
            raw = profile(driver, comp.lib_path, pick.task, args.timeout)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"{text}: {e}", file=sys.stderr)
            continue
        title = source_title(pick.source)
        label = f"{text} {source_hash(pick.source)[:8]}"  # a shape may be profiled with several sources
        if args.raw:
            Path(args.raw).mkdir(parents=True, exist_ok=True)
            (Path(args.raw) / f"{label.replace(' ', '-')}.csv").write_text(raw)
        try:
            rows = parse_ncu_csv(raw)
        except ValueError as e:
            print(f"{text}: {e}", file=sys.stderr)
            continue
        table += kernel_table(label, rows, args.top)
        replay = "not measured" if pick.replay_us is None else f"{pick.replay_us[0]:.2f} / {pick.replay_us[1]:.2f}"
        k_ours, k_theirs = total_us(rows, "candidate"), total_us(rows, "cublas")
        summary.append(f"| {label} | `{title[:110]}` | {replay} | {k_ours:.2f} / {k_theirs:.2f} |")
        print(f"{text}: replay {replay} us, kernels {k_ours:.2f} / {k_theirs:.2f} us", flush=True)
        # Written after every shape: a run cut short by its time limit keeps what it measured.
        Path(args.out).write_text("\n".join(summary) + "\n\n" + "\n".join(table) + "\n")
    print("\n".join(table))
    return 0 if len(summary) > 2 else 1  # no shape profiled: say so in the exit status


if __name__ == "__main__":
    sys.exit(main())
