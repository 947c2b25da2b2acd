"""`cudal2` command line.

    cudal2 eval FILE.cu [FILE.cu ...] --mnk 64_4096_64 [--mnk ...] [--acc fp32|fp16]
                [--mode offline|cold|server|wallclock] [--target-qps N] [--compile-only] [--json] [--gpu ID]
                [--db PATH] [--fresh]
    cudal2 baseline --mnk 64_4096_64 [--mnk ...] [--acc ...] [--mode ...] [--json] [--gpu ID]
    cudal2 explain [--library DIR] (--mnk 128_4096_4096 [--bias] | --model Llama-3-8B [--tokens 1,16]) ...

Exit status: 0 when every result is ok (`compiled` under --compile-only), 1 when any candidate failed,
2 on bad usage or an internal error. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from cudal2.sandbox.evaluator import EvalOptions, Evaluator
from cudal2.sandbox.gpu import detect_gpu
from cudal2.sandbox.store import Rank, ResultStore, StoreError, default_db_path
from cudal2.sandbox.types import (
    RUN_FAILURES,
    Acc,
    BadTask,
    EvalResult,
    Mode,
    ShapeResult,
    Status,
    Task,
    to_jsonable,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
BASELINES = ("cublas", "cublaslt_heuristic", "cublaslt_autotuned")


class UsageError(Exception):
    """Bad command-line input; printed as one line, exit 2."""


def _add_task_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mnk", action="append", required=True, help="shape M_N_K, e.g. 64_4096_64 (repeatable)")
    p.add_argument("--acc", default="fp32", choices=[a.value for a in Acc], help="accumulation precision required")
    p.add_argument("--mode", default="offline", choices=[m.value for m in Mode],
                   help="offline: back-to-back CUDA-graph replay; server: L2 flushed, Poisson arrivals")
    p.add_argument("--target-qps", type=float, default=2000.0, help="server mode: mean arrivals per second")
    p.add_argument("--json", action="store_true", help="one JSON object per line per (file, shape)")
    p.add_argument("--gpu", type=int, default=0, help="GPU index")


class _OneLineErrors(argparse.ArgumentParser):
    """A bad argument is one line on stderr and exit 2, as every other bad input is: argparse's default prints the
    whole usage block first, which buries the line that says what was wrong. Subcommands inherit the class."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrors(prog="cudal2", description="RL for fast CUDA HGEMM kernels")
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("eval", help="compile, verify and time candidate kernels against cuBLAS")
    ev.add_argument("files", nargs="+", help="candidate .cu files (the cudal2_hgemm contract)")
    _add_task_args(ev)
    ev.add_argument("--compile-only", action="store_true", help="static checks, compile and link check only")
    ev.add_argument("--db", default=None, help=f"result store (default {default_db_path()})")
    ev.add_argument("--fresh", action="store_true", help="re-measure even if the store has the result")
    ev.add_argument("--arch", default=None, help="nvcc target override, e.g. sm_90a or sm_80")
    ev.set_defaults(func=cmd_eval)
    bl = sub.add_parser("baseline", help="time cuBLAS / cuBLASLt alone")
    _add_task_args(bl)
    bl.set_defaults(func=cmd_baseline)
    _add_pool_parser(sub)
    _add_sample_parser(sub)
    ab = sub.add_parser("ablate", help="the same training with reward terms switched off, compared in a table")
    ab.add_argument("--config", required=True, help="training YAML (as for train.py)")
    ab.add_argument("--drop", action="append", default=[], help="a reward term to switch off (repeatable): "
                    "speed, accuracy, length, status, ptxas")
    ab.add_argument("--out", default="runs/ablate", help="one output dir per run is made under this")
    ab.add_argument("train_args", nargs=argparse.REMAINDER, help="after --: more train.py arguments for every run")
    ab.set_defaults(func=cmd_ablate)
    _add_report_parser(sub)
    _add_carry_parser(sub)
    _add_store_parser(sub)
    _add_export_parser(sub)
    _add_explain_parser(sub)
    _add_tune_parser(sub)
    _add_remeasure_parser(sub)
    return parser


def _add_remeasure_parser(sub) -> None:
    from cudal2.remeasure import RemeasureRequest

    d = RemeasureRequest(None)
    rm = sub.add_parser("remeasure", help="time the best verified offline kernels again in server, wallclock, "
                                          "confirm (offline once more, free of the search's selection) or cold mode")
    rm.add_argument("--shapes", default=None, help="shape CSV, optionally :train or :heldout (data/grid.csv:heldout)")
    rm.add_argument("--mnk", action="append", default=[], help="shape M_N_K (repeatable)")
    rm.add_argument("--mode", required=True, choices=[m.value for m in Mode],
                    help="server, wallclock, confirm or cold (offline results are what is remeasured)")
    rm.add_argument("--acc", default=d.acc.value, choices=[a.value for a in Acc], help="accumulation for --mnk shapes")
    rm.add_argument("--top", type=int, default=d.top, help="offline kernels per shape, fastest first")
    rm.add_argument("--db", default=None, help=f"result store (default {default_db_path()})")
    rm.add_argument("--gpu", type=int, default=d.gpu_index, help="GPU index")
    rm.add_argument("--target-ms", type=float, default=d.target_ms, help="timing budget per kernel per shape")
    rm.add_argument("--budget-minutes", type=float, default=d.budget_s / 60, help="wall clock for the whole run")
    rm.add_argument("--jobs", type=int, default=d.compile_workers, help="concurrent compiles (default: CPU cores)")
    rm.add_argument("--host-cache-twins", action="store_true",
                    help="server or wallclock: measure each chosen sm90 kernel's host_cache twin (same device code, "
                         "CUTLASS's parameters kept between calls) instead of the kernel")
    rm.add_argument("--min-log2-mnk", type=int, default=d.min_log2_mnk,
                    help="only the shapes with M*N*K >= 2^this (36: issue #6's large bucket)")
    rm.add_argument("--max-log2-mnk", type=int, default=d.max_log2_mnk,
                    help="only the shapes with M*N*K < 2^this (30: the shapes whose offline inputs can sit in L2, "
                         "where cold mode differs)")
    rm.add_argument("--chosen-on", default=None, metavar="GPU",
                    help="time the kernels another GPU's offline results chose (its label or a unique part, e.g. "
                         "h200) on this GPU; `--mode confirm` gives this GPU's offline-method figure of them")
    rm.add_argument("--paired", action="store_true",
                    help="also time again the kernels whose ok result in this mode has no paired speedup (timed "
                         "before the harness reported it), for `cudal2 report --estimator paired`")
    add_rank_argument(rm)
    rm.set_defaults(func=cmd_remeasure)


def cmd_remeasure(args) -> int:
    from cudal2 import remeasure

    req = remeasure.RemeasureRequest(args.shapes, tuple(args.mnk), Acc(args.acc), Mode(args.mode), args.top, args.db,
                                     args.gpu, args.target_ms, args.budget_minutes * 60, args.jobs,
                                     args.host_cache_twins, args.min_log2_mnk, args.paired, Rank(args.rank),
                                     args.max_log2_mnk, args.chosen_on)
    try:
        summary = remeasure.run(req)
    except remeasure.RemeasureError as e:
        print(f"cudal2 remeasure: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(summary.render())
    return EXIT_OK if summary.ok else EXIT_FAILED


def _add_tune_parser(sub) -> None:
    from cudal2.tune import FAMILIES, TuneOptions
    from cudal2.tune_search import Strategy

    d = TuneOptions()
    tu = sub.add_parser("tune", help="search the generated kernel families for the fastest kernel per shape")
    tu.add_argument("--shapes", default=None, help="shape CSV, optionally :train or :heldout (data/grid.csv:train)")
    tu.add_argument("--mnk", action="append", default=[], help="shape M_N_K (repeatable)")
    tu.add_argument("--acc", default="fp32", choices=[a.value for a in Acc], help="accumulation for --mnk shapes")
    tu.add_argument("--family", action="append", default=None, choices=[f.name for f in FAMILIES] + ["all"],
                    help="kernel family to search (repeatable; default all)")
    tu.add_argument("--strategy", default=d.strategy.value, choices=[s.value for s in Strategy],
                    help="transfer: no search, the best configs of the nearest tuned shapes on every shape; fill: the "
                    "store's winners re-cut (tile, split-K, scheduler) to fill the SMs, ranked by a wave model; neighbours: "
                    "every one-parameter change of each shape's fastest stored config; cublaslt: the configs nearest to the "
                    "cuBLASLt algorithm autotuned on each shape; rerender: today's source of configs stored from older "
                    "code; model: the configs a cost model fitted on the store predicts fastest on each shape; given: the configs "
                    "--configs names")
    tu.add_argument("--budget-minutes", type=float, default=d.budget_s / 60, help="wall clock for proposing")
    tu.add_argument("--max-configs", type=int, default=d.max_configs, help="configs evaluated or resumed at most")
    tu.add_argument("--seed", type=int, default=d.seed, help="a re-run with the same seed resumes where it stopped")
    tu.add_argument("--target-ms", type=float, default=d.target_ms, help="timing budget per kernel per shape")
    tu.add_argument("--jobs", type=int, default=0, help="concurrent compiles (default: CPU cores)")
    tu.add_argument("--compile-only", action="store_true", help="no GPU: compile and record compile outcomes only")
    tu.add_argument("--arch", default=None, help="nvcc target (default: the GPU's, else sm_90a)")
    tu.add_argument("--gpu", type=int, default=0, help="GPU index")
    tu.add_argument("--db", default=None, help=f"result store (default {default_db_path()})")
    tu.add_argument("--show", action="store_true", help="print the best stored kernel per shape and exit")
    tu.add_argument("--worst", type=int, default=0, help="tune only the N shapes of the set where the best stored "
                    "kernel is slowest vs cuBLAS on this GPU (none yet: first)")
    tu.add_argument("--won-only", action="store_true", help="tune only the shapes whose fastest stored kernel on "
                    "this GPU comes from the families searched (--family), before --worst")
    tu.add_argument("--sms", type=int, default=0, help="SM count for --strategy fill and model (default: the GPU's)")
    tu.add_argument("--plan-as", default=None, metavar="GPU", help="with --compile-only: plan as a run on this "
                    "stored GPU would (label or unique part, e.g. h200: --worst, warm start, cuBLASLt algorithms), to "
                    "fill a compile cache for it on a CPU machine")
    tu.add_argument("--vary", action="append", default=[], metavar="PARAM", help="with --strategy neighbours: "
                    "step only along this parameter (repeatable; default every parameter), e.g. --vary epi_n")
    tu.add_argument("--retry", action="append", default=[], choices=[f.value for f in RUN_FAILURES], metavar="STATUS",
                    help="measure again the (config, shape) pairs whose stored result has this status instead of "
                    "resuming from it (repeatable; one of " + ", ".join(f.value for f in RUN_FAILURES) + "), e.g. "
                    "--retry rejected_behaviour after a false positive of a run-time check")
    tu.add_argument("--cublas-kernels", default=None, metavar="REPORT", help="with --strategy cublaslt: also follow "
                    "the kernels cuBLAS's heuristic runs per shape, from benchmarks/cublas_graph.cu's output (e.g. "
                    "benchmarks/cublas_kernels_h200.txt)")
    # extend, not the default store: a repeated --configs (or --also below) adds its files instead of replacing them
    tu.add_argument("--configs", nargs="+", action="extend", default=None, metavar="FILE",
                    help="with --strategy given: the configs to measure, one name per line as the tuner prints them "
                    "(e.g. small-bm16-bn16-warps_m1-warps_n2-warps_k8-k_unroll2-accfp32-grid_k8); # starts a comment; "
                    "several files (after one flag or repeated): all their names, each once")
    tu.set_defaults(func=cmd_tune)


def cmd_tune(args) -> int:
    from cudal2 import tune
    from cudal2.tune_search import Strategy

    try:
        tasks = tune.load_tasks(args.shapes, args.mnk, args.acc)
        if args.show:
            print(tune.show(tasks, args.db))
            return EXIT_OK
        options = tune.TuneOptions(
            families=tuple(args.family or ["all"]), strategy=Strategy(args.strategy),
            budget_s=args.budget_minutes * 60, max_configs=args.max_configs, seed=args.seed,
            compile_only=args.compile_only, gpu_index=args.gpu, arch=args.arch, db_path=args.db,
            target_ms=args.target_ms, compile_workers=args.jobs, worst=args.worst, won_only=args.won_only, sms=args.sms,
            plan_as=args.plan_as, vary=tuple(args.vary), retry=frozenset(Status(r) for r in args.retry),
            cublas_kernels=Path(args.cublas_kernels) if args.cublas_kernels else None,
            given=tune.read_config_lists(args.configs) if args.configs else ())
        summary = tune.run(options, tasks)
    except (tune.TuneInputError, StoreError) as e:
        raise UsageError(str(e)) from None
    print(summary.render())
    if not args.compile_only:
        print(tune.best_table(summary.shapes, summary.best))
    return EXIT_OK if summary.succeeded else EXIT_FAILED


def add_rank_argument(parser) -> None:
    """--rank: how each shape's kernel is chosen out of its offline results (cudal2.sandbox.store.Rank)."""
    parser.add_argument("--rank", default=Rank.TIME.value, choices=[r.value for r in Rank],
                        help="how each shape's kernel is chosen: time: the lowest median time; speedup: the highest "
                             "speedup over cuBLAS timed in the same evaluation (corrects for most of the GPU's drift "
                             "between evaluations; on the H200 it chose no better, RESULTS thirty-second session)")


def _add_gpu_label_arg(parser) -> None:
    """--gpu for commands that read stored results (resolved by cudal2.sandbox.store.resolve_gpu_label)."""
    parser.add_argument("--gpu", default=None, help="GPU label the results were stored under, or a unique part of "
                        "it, e.g. h200 (default: this machine's GPU, else the store's only one)")


def _add_export_parser(sub) -> None:
    ex = sub.add_parser("export", help="write the best verified kernel per shape as a library for cudal2.ops")
    ex.add_argument("--out", required=True, help="library directory: <M>_<N>_<K>.cu per shape plus manifest.json")
    _add_gpu_label_arg(ex)
    ex.add_argument("--acc", default="fp32", choices=[a.value for a in Acc])
    ex.add_argument("--mode", default="offline", choices=[m.value for m in Mode])
    ex.add_argument("--min-speedup", type=float, default=1.02, help="export a kernel only this much faster than "
                    "--baseline (0: every verified kernel)")
    ex.add_argument("--baseline", default="cublas", choices=BASELINES)
    ex.add_argument("--db", default=None, help=f"result store (default {default_db_path()})")
    ex.add_argument("--host-cache-twins", action="store_true",
                    help="export an sm90 kernel's host_cache twin in its place where the twin was verified on the "
                         "shape (same device code, less host time per eager call)")
    ex.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    from cudal2 import export

    db = Path(args.db) if args.db else default_db_path()
    if not db.is_file():
        raise UsageError(f"{db}: no result store there (evaluate kernels first, or pass --db)")
    try:
        with _open_store(str(db)) as store:
            gpu = export.resolve_gpu(store.ok_gpus(), args.gpu, getattr(detect_gpu(), "label", None))
            plan = export.plan_export(store, export.ExportRequest(gpu, Acc(args.acc), Mode(args.mode),
                                                                  args.min_speedup, args.baseline,
                                                                  args.host_cache_twins))
        print(export.render(plan))
        if not plan.manifest.kernels:
            print("cudal2: nothing to export: no library written", file=sys.stderr)
            return EXIT_FAILED
        print(f"library written: {export.write_library(Path(args.out), plan)}")
    except export.ExportError as e:
        raise UsageError(str(e)) from None
    return EXIT_OK


def _add_explain_parser(sub) -> None:
    from cudal2.data import LLM_MODELS, TOKEN_COUNTS

    xp = sub.add_parser("explain", help="which path cudal2.ops takes for shapes or a model's linear layers, by an "
                                        "exported library's measurements (no GPU needed)")
    xp.add_argument("--library", default=None, help="exported library directory (default: $CUDAL2_OPS_LIBRARY, else "
                                                    "~/.cache/cudal2/ops)")
    xp.add_argument("--mnk", action="append", default=[], help="shape M_N_K, e.g. 128_4096_4096 (repeatable)")
    xp.add_argument("--bias", action="store_true", help="the --mnk shapes as linear layers with a bias")
    xp.add_argument("--model", action="append", default=[], choices=[m.name for m in LLM_MODELS],
                    help="a model of cudal2.data whose decoder-layer projections to explain at each --tokens "
                         "(repeatable)")
    xp.add_argument("--tokens", default=",".join(map(str, TOKEN_COUNTS)), help="with --model: token counts M")
    xp.add_argument("--min-speedup", type=float, default=1.0,
                    help="as cudal2.ops.load_library's: an exact kernel is used only this much faster than torch")
    xp.set_defaults(func=cmd_explain)


def cmd_explain(args) -> int:
    """cudal2.ops.decide on the library's manifest, as on the GPU it was measured on (the rule, not this machine)."""
    from cudal2 import ops
    from cudal2.data import LLM_MODELS
    from cudal2.export import Manifest, ManifestError

    if not args.mnk and not args.model:
        raise UsageError("explain: name shapes (--mnk M_N_K) or a model (--model NAME)")
    if not (math.isfinite(args.min_speedup) and args.min_speedup >= 0):
        raise UsageError(f"--min-speedup {args.min_speedup} must be a finite number >= 0")
    tasks = [_parse_task(mnk) for mnk in args.mnk]
    tokens = _token_counts(args.tokens)
    directory = ops.library_dir(args.library)
    try:
        manifest = Manifest.load(directory)
    except ManifestError as e:
        raise UsageError(str(e)) from None

    def decide(m: int, n: int, k: int, bias: bool) -> ops.Decision:
        return ops.decide(manifest, m, n, k, manifest.gpu, min_speedup=args.min_speedup, bias=bias)

    print(f"library {directory}: {len(manifest.kernels)} kernel(s) measured on {manifest.gpu}, min_speedup "
          f"{args.min_speedup:g}")
    for t in tasks:
        print(decide(t.m, t.n, t.k, args.bias))
    for model in (m for m in LLM_MODELS if m.name in args.model):
        print(f"\n{model.name}, one decoder layer's projections: the path, its GEMM's est. speedup vs torch.matmul "
              "(+b: with a bias, whose separate add comes off the saving)\n")
        print(_model_routes(model, tokens, decide))
    return EXIT_OK


def _model_routes(model, tokens: Sequence[int], decide) -> str:
    """A markdown table: per token count M, the path of each projection, and the GPU time a decoder layer saves."""
    layers = model.linears()
    head = "| M | " + " | ".join(f"{name} ({n} x {k})" for name, n, k in layers) + " | us saved per layer |"
    lines = [head, "|---" * (len(layers) + 2) + "|"]
    for m in tokens:
        cells, saved = [], 0.0
        for name, n, k in layers:
            d = decide(m, n, k, model.has_bias(name))
            saved += d.saving_us
            bias = " +b" if model.has_bias(name) else ""
            cells.append(f"torch{bias}" if d.kernel is None else f"{d.route.value} {d.est_speedup:.2f}x{bias}")
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {saved:.1f} |")
    return "\n".join(lines)


def _token_counts(text: str) -> tuple[int, ...]:
    from cudal2.data import parse_token_counts

    try:
        return parse_token_counts(text)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _parse_task(mnk: str) -> Task:
    try:
        return Task.parse(mnk)
    except BadTask as e:
        raise UsageError(str(e)) from None


def _add_carry_parser(sub) -> None:
    from cudal2.sandbox.types import FAMILY_RESULTS_CARRY

    ca = sub.add_parser("carry", help="keep a store's results of kernel-family sources across an evaluator version "
                                      "that cannot change them")
    ca.add_argument("--db", default=None, help=f"result store (default {default_db_path()})")
    ca.add_argument("--from", dest="from_version", default=None, choices=list(FAMILY_RESULTS_CARRY),
                    help="the older evaluator version whose results to carry (default: the newest one, "
                         f"{list(FAMILY_RESULTS_CARRY)[-1]})")
    ca.set_defaults(func=cmd_carry)


def cmd_carry(args) -> int:
    from cudal2 import carry

    try:
        summary = carry.run(Path(args.db) if args.db else default_db_path(), args.from_version)
    except (carry.CarryError, StoreError) as e:
        raise UsageError(str(e)) from None
    print(summary.render())
    return EXIT_OK


def _add_store_parser(sub) -> None:
    st = sub.add_parser("store", help="a result store committed as a gzipped base plus small deltas "
                                      "(NAME.sqlite.gz, NAME.deltas/0001.sqlite.gz, ...)")
    ssub = st.add_subparsers(dest="store_command", required=True)
    asm = ssub.add_parser("assemble", help="base and deltas -> one plain SQLite store (a new file)")
    asm.add_argument("committed", help="the committed store, e.g. benchmarks/stores/h200_grid.sqlite.gz")
    asm.add_argument("--out", required=True, help="the plain store to write (must not exist)")
    asm.add_argument("--also", nargs="+", action="extend", default=[], metavar="STORE",
                     help="stores kept apart from the committed one's deltas (another GPU's rows, e.g. "
                          "benchmarks/stores/h100_chosen_small.sqlite.gz), added after them with the next ids "
                          "(several after one flag or repeated)")
    dl = ssub.add_parser("delta", help="the rows a grown store (or a delta sent back by a device call) adds to the "
                                       "committed store, as its next delta")
    dl.add_argument("--db", required=True, help="the grown store, plain or gzipped")
    dl.add_argument("--committed", required=True, help="the committed store it started from")
    dl.add_argument("--out", default=None, help="write the delta here (default: the committed store's next delta)")
    st.set_defaults(func=cmd_store)


def cmd_store(args) -> int:
    from cudal2.sandbox import store_pack

    try:
        if args.store_command == "assemble":
            done = store_pack.assemble(Path(args.committed), Path(args.out), [Path(p) for p in args.also])
            apart = f", {done.apart} kept apart" if done.apart else ""
            print(f"{done.path}: {done.rows.render()} (base and {done.deltas} deltas{apart})")
        else:
            print(store_pack.write_delta(Path(args.db), Path(args.committed), Path(args.out) if args.out else None)
                  .render())
    except StoreError as e:
        raise UsageError(str(e)) from None
    return EXIT_OK


def _add_report_parser(sub) -> None:
    from cudal2.report import Estimator

    rp = sub.add_parser("report", help="leaderboard: best verified kernel per shape vs the baselines, as markdown")
    rp.add_argument("--shapes", required=True, help="shape CSV, optionally :train or :heldout (data/grid.csv:heldout)")
    _add_gpu_label_arg(rp)
    rp.add_argument("--mode", default="offline", choices=[m.value for m in Mode])
    rp.add_argument("--acc", default=None, choices=[a.value for a in Acc], help="override the shape file's acc")
    rp.add_argument("--db", default=None, help=f"result store (default {default_db_path()})")
    rp.add_argument("--out", default=None, help="write the markdown here instead of printing it")
    rp.add_argument("--heatmap", default=None, help="also draw a PNG heatmap of speedup vs cuBLAS (needs matplotlib)")
    rp.add_argument("--host-cache-twins", action="store_true",
                    help="server or wallclock: where `cudal2 remeasure --host-cache-twins` timed a chosen sm90 "
                         "kernel's host_cache twin, report the twin's figure in its place")
    rp.add_argument("--estimator", default="ratio", choices=[e.value for e in Estimator],
                    help="ratio: baseline median time / kernel median time (every result); paired: the median over "
                         "repetitions of baseline / kernel time, steadier, only in results timed since 2026-12-03 "
                         "(others count as unscored: `cudal2 remeasure --paired` times them again)")
    rp.add_argument("--chosen-on", default=None, metavar="GPU",
                    help="the kernels another GPU's offline results chose (a label or a unique part of one, e.g. "
                         "h200), with their figures on --gpu: what `cudal2 remeasure --chosen-on` timed")
    rp.add_argument("--against", default="offline", choices=[m.value for m in Mode],
                    help="the mode a report in another mode is compared with, shape by shape (section \"Against ...\"); "
                         "confirm: the offline method's fresh figures, which --chosen-on kernels have")
    add_rank_argument(rp)
    rp.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from cudal2 import report

    req = report.ReportRequest(args.shapes, args.gpu, Mode(args.mode), Acc(args.acc) if args.acc else None,
                               Path(args.db) if args.db else default_db_path(),
                               Path(args.out) if args.out else None, Path(args.heatmap) if args.heatmap else None,
                               args.host_cache_twins, report.Estimator(args.estimator), Rank(args.rank),
                               args.chosen_on, Mode(args.against))
    try:
        print(report.run(req))
    except report.ReportError as e:
        raise UsageError(str(e)) from None
    return EXIT_OK


def cmd_ablate(args) -> int:
    from cudal2 import ablate
    from cudal2.reward.config import TERMS

    if not Path(args.config).is_file():
        raise UsageError(f"{args.config}: no such config file")
    bad = [d for d in args.drop if d not in TERMS]
    if bad or not args.drop:
        raise UsageError(f"--drop takes reward terms ({', '.join(TERMS)}), at least one; got {bad or 'none'}")
    extra = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    rows = ablate.run(args.config, args.drop, Path(args.out), extra)
    print(ablate.table(rows))
    return EXIT_OK if all(r.exit_code == 0 for r in rows) else EXIT_FAILED


def _add_sample_parser(sub) -> None:
    sp = sub.add_parser("sample", help="sample kernels for a shape from a policy, evaluate them, keep the best")
    sp.add_argument("--mnk", required=True, help="shape M_N_K")
    sp.add_argument("--acc", default="fp32", choices=[a.value for a in Acc])
    sp.add_argument("--n", type=int, default=16, help="samples (first turn)")
    sp.add_argument("--model", default="tiny-local", help="hub name or local path of a causal LM, or tiny-local")
    sp.add_argument("--turns", type=int, default=1, help="refinement turns: feedback from each evaluation, then retry")
    sp.add_argument("--temperature", type=float, default=0.8)
    sp.add_argument("--max-new-tokens", type=int, default=2048)
    sp.add_argument("--batch", type=int, default=8, help="samples generated at once")
    sp.add_argument("--pool", default=None, help="state file of a running `cudal2 pool start` server")
    sp.add_argument("--gpus", default=None, help="GPUs for a private pool, comma-separated (default: all)")
    sp.add_argument("--compile-only", action="store_true", help="no GPU: reward compile success only")
    sp.add_argument("--db", default=None, help="result store path")
    sp.add_argument("--out", default="best.cu", help="where the best kernel is written")
    sp.set_defaults(func=cmd_sample)


def cmd_sample(args) -> int:
    from cudal2.policy.config import PolicyConfig
    from cudal2.policy.model import PolicyLoadError
    from cudal2.policy.sample import Sampler, progress_printer, report, write_best
    from cudal2.sandbox.pool import PoolConfig, SandboxPool
    from cudal2.sandbox.pool.server import PoolClient, PoolNotRunning

    task = _tasks(argparse.Namespace(mnk=[args.mnk], acc=args.acc))[0]
    if args.n < 1 or args.turns < 1 or args.batch < 1:
        raise UsageError("--n, --turns and --batch must be >= 1")
    if not args.compile_only and args.pool is None and detect_gpu() is None:
        raise UsageError("no CUDA GPU visible on this machine: use --compile-only or --pool")
    try:
        cfg = PolicyConfig(model=args.model, max_completion_tokens=args.max_new_tokens)
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        if args.pool:
            pool = PoolClient(Path(args.pool))
        else:
            gpus = tuple(int(g) for g in args.gpus.split(",")) if args.gpus else None
            pool = SandboxPool(PoolConfig(gpus=() if args.compile_only else gpus, db_path=args.db,
                                          eval=EvalOptions(compile_only=args.compile_only)))
        sampler = Sampler(cfg, pool, args.temperature, args.batch)
    except (PolicyLoadError, PoolNotRunning) as e:
        raise UsageError(str(e)) from None
    try:
        with _open_store(args.db) as store:
            gpu = detect_gpu()
            samples = sampler.run(task, args.n, args.turns, store, gpu.label if gpu else "none",
                                  progress_printer(args.n * args.turns))
    finally:
        pool.shutdown()
    print(report(samples))
    if write_best(samples, Path(args.out)):
        print(f"best kernel written to {args.out}")
    return EXIT_OK if samples and samples[0].status in ("ok", "compiled") else EXIT_FAILED


def _add_pool_parser(sub) -> None:
    from cudal2.sandbox.pool.server import default_state_file

    pool = sub.add_parser("pool", help="a long-lived sandbox pool shared by several processes")
    psub = pool.add_subparsers(dest="pool_command", required=True)
    start = psub.add_parser("start", help="start a pool server on loopback (in the background)")
    start.add_argument("--backend", default="local", choices=["local", "ray"])
    start.add_argument("--gpus", default=None, help="comma-separated GPU indices (default: all visible)")
    start.add_argument("--port", type=int, default=0, help="loopback port (default: any free one)")
    start.add_argument("--ray-address", default=None)
    start.add_argument("--db", default=None, help="result store path")
    start.add_argument("--foreground", action="store_true", help="serve in this process until stopped")
    start.add_argument("--runner", default=None, help=argparse.SUPPRESS)
    for p in (start, psub.add_parser("stats", help="print the pool's queue, throughput and GPU use"),
              psub.add_parser("stop", help="finish accepted jobs and stop the pool server")):
        p.add_argument("--state-file", default=str(default_state_file()), help="where the server's address is kept")
    pool.set_defaults(func=cmd_pool)


def cmd_pool(args) -> int:
    from cudal2.sandbox.pool import server

    state = Path(args.state_file)
    try:
        if args.pool_command == "start":
            forwarded = [f"--{k}={v}" for k, v in (("backend", args.backend), ("gpus", args.gpus),
                                                   ("port", args.port), ("ray-address", args.ray_address),
                                                   ("db", args.db), ("runner", args.runner)) if v is not None]
            if args.foreground:
                return server.main([*forwarded, f"--state-file={state}"])
            pid = server.start_background(forwarded, state)
            print(f"pool server started (pid {pid}); address in {state}")
            return EXIT_OK
        client = server.PoolClient(state)
        if args.pool_command == "stats":
            print(client.stats().render())
        else:
            client.stop()
            print("pool server stopping after its accepted jobs")
        return EXIT_OK
    except server.PoolNotRunning as e:
        raise UsageError(str(e)) from None


def _tasks(args) -> list[Task]:
    try:
        return [Task.parse(s, args.acc) for s in args.mnk]
    except BadTask as e:
        raise UsageError(str(e)) from None


def _read_sources(files: Sequence[str]) -> list[tuple[str, str]]:
    out = []
    for f in files:
        p = Path(f)
        if not p.is_file():
            raise UsageError(f"{f}: no such file")
        try:
            out.append((f, p.read_text()))
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"{f}: cannot read as text ({e.__class__.__name__})") from None
    return out


def _shape_json(file: str | None, s: ShapeResult, res: EvalResult | None = None) -> dict:
    d = {"file": file, "mnk": s.task.mnk, "acc": s.task.acc.value, "status": s.status.value, "reason": s.reason}
    d.update({k: v for k, v in to_jsonable(s).items() if k not in ("task", "status", "reason")})
    d["speedups"] = s.speedups()
    if res is not None:
        d["source_hash"] = res.source_hash
        d["gpu"] = res.gpu
        d["ptxas"] = to_jsonable(res.compile.kernels) if res.compile else []
    return d


def _ptxas_lines(file: str, res: EvalResult) -> list[str]:
    if res.compile is None or not res.compile.kernels:
        return []
    out = [f"{Path(file).name}: compiled for {res.compile.arch}"]
    for k in res.compile.kernels:
        out.append(f"  {k.name[:70]:<70} {k.registers:4d} regs {k.smem_bytes:7d} B smem "
                   f"{k.stack_bytes:5d} B stack {k.spill_store_bytes + k.spill_load_bytes:5d} B spills")
    return out


def _fmt_us(s: ShapeResult, name: str) -> str:
    t = s.timings.get(name)
    return f"{t.median_us:9.2f}" if t else f"{'-':>9}"


def _table(rows: list[tuple[str, ShapeResult]], with_candidate: bool) -> str:
    head = f"{'file':<28} {'shape':<18} {'status':<19}" if with_candidate else f"{'shape':<18}"
    cols = (["candidate"] if with_candidate else []) + list(BASELINES)
    lines = [head + "".join(f" {c[:9]:>9}" for c in cols) + ("  speedup(cublas)  paired  reason" if with_candidate else "")]
    for file, s in rows:
        line = (f"{Path(file).name[:28]:<28} {s.task.mnk:<18} {s.status.value:<19}" if with_candidate
                else f"{s.task.mnk:<18}")
        line += "".join(f" {_fmt_us(s, c)}" for c in cols)
        if with_candidate:
            sp = s.speedup("cublas")
            line += f"  {sp:14.3f}x  " if sp else f"  {'-':>15}  "
            pp = s.paired_speedup("cublas")
            line += f"{pp:5.3f}x  " if pp else f"{'-':>6}  "
            line += s.reason[:100]
        lines.append(line)
    lines.append("(times: median microseconds per call; speedup: ratio of the medians; paired: median over "
                 "repetitions of cuBLAS's time over the candidate's in that repetition)")
    return "\n".join(lines)


def _open_store(path: str | None) -> ResultStore:
    try:
        return ResultStore(path)
    except StoreError as e:
        raise UsageError(str(e)) from None


def cmd_eval(args) -> int:
    tasks = _tasks(args)
    sources = _read_sources(args.files)
    if not args.compile_only and detect_gpu(args.gpu) is None:
        raise UsageError("no CUDA GPU visible on this machine: only --compile-only evaluation is possible here")
    opts = EvalOptions(mode=Mode(args.mode), compile_only=args.compile_only, gpu_index=args.gpu, arch=args.arch,
                       fresh=args.fresh, target_qps=args.target_qps)
    with _open_store(args.db) as store:
        ev = Evaluator(opts, store)
        results: list[tuple[str, EvalResult]] = []
        for file, src in sources:
            res = ev.evaluate(src, tasks)
            results.append((file, res))
            if args.json:
                for s in res.shapes:
                    print(json.dumps(_shape_json(file, s, res)), flush=True)
    if not args.json:
        print(f"evaluator on {ev.gpu_label}, mode {args.mode}")
        print(_table([(f, s) for f, r in results for s in r.shapes], with_candidate=True))
        if args.compile_only:
            print("\n".join(line for f, r in results for line in _ptxas_lines(f, r)))
    statuses = [s.status for _, r in results for s in r.shapes]
    if any(s == Status.INTERNAL_ERROR for s in statuses):
        return EXIT_USAGE
    return EXIT_OK if all(s.success for s in statuses) else EXIT_FAILED


def cmd_baseline(args) -> int:
    tasks = _tasks(args)
    if detect_gpu(args.gpu) is None:
        raise UsageError("no CUDA GPU visible on this machine: baselines need one")
    ev = Evaluator(EvalOptions(mode=Mode(args.mode), gpu_index=args.gpu, target_qps=args.target_qps))
    res = ev.baselines(tasks)
    if args.json:
        for s in res:
            print(json.dumps(_shape_json(None, s)))
    else:
        print(f"baselines on {ev.gpu_label}, mode {args.mode}")
        print(_table([("", s) for s in res], with_candidate=False))
    return EXIT_OK if all(s.status == Status.OK for s in res) else EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse already printed a one-line usage error
        return EXIT_USAGE if e.code else EXIT_OK
    try:
        return args.func(args)
    except UsageError as e:
        print(f"cudal2: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # an evaluator bug: one line for the user, the traceback on request
        if os.environ.get("CUDAL2_DEBUG"):
            raise
        print(f"cudal2: internal error: {e!r} (set CUDAL2_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("cudal2: interrupted", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
