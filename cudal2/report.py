"""The leaderboard (`cudal2 report`): the best verified kernel per shape of a shape set, against the baselines.

For each shape of the set the result store is asked for its fastest kernel whose newest offline result (current
evaluator version, this GPU label) is `ok`; a report in another mode shows that kernel's figure in that mode.
Speedups are the ones measured in that same evaluation: baseline median time over kernel median time (> 1 = the
kernel is faster). A shape with no such result is *missing*: it is counted and listed, never scored as 1.0x.

Baselines (the harness's timings): `cublas` is cublasGemmEx with torch's settings, the call torch.matmul makes on
these half tensors, so it is reported as the "torch.matmul / cuBLAS" column (there is no separate torch timing);
`cublaslt_heuristic` is cuBLASLt's top-1 heuristic algorithm; `cublaslt_autotuned` the fastest of up to 32 of its
heuristic candidates, timed on this GPU.

The maths (geometric mean, bucket membership, fraction faster, target verdicts) are small pure functions over
speedup lists, so they are tested on a fixture without a GPU; rendering is separate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import TypeVar

from cudal2.data import BUCKETS, GRID_VALUES, BadShapeFile, ShapeRow, bucket, load_shape_spec, mnk_log2
from cudal2.roofline import FIGURES, OFFLINE_MAX_SETS, Bound, GpuFigures, bound, figures_for, offline_inputs_in_l2
from cudal2.sandbox.gpu import detect_gpu
from cudal2.sandbox.store import GpuLabelError, Rank, ResultStore, StoreError, resolve_gpu_label
from cudal2.sandbox.types import EVALUATOR_VERSION, Acc, Mode, ShapeResult, Status, Task
from cudal2.tune_log import TuneLog
from cudal2.twins import host_cache_twin

# Column titles of the store's baselines (its SPEEDUP_COLUMNS), in display order.
BASELINE_TITLES = {
    "cublas": "torch.matmul / cuBLAS",
    "cublaslt_heuristic": "cuBLASLt heuristic",
    "cublaslt_autotuned": "cuBLASLt autotuned",
}
ALL_SHAPES = "all"
T = TypeVar("T")


class Estimator(str, Enum):
    """How one evaluation's timings become a speedup. Both come from the same harness process; they differ in how
    they meet the GPU's drift between repetitions (RESULTS, thirtieth session: at MNK >= 2^36 the paired figure of
    one kernel varied between fresh evaluations by a median 0.43% against 1.18% vs cuBLAS; thirty-first session:
    over the 1000 grid shapes' confirm figures the paired one reads 0.12% higher in geomean)."""

    RATIO = "ratio"  # baseline median time / kernel median time: every stored result has it
    PAIRED = "paired"  # median over repetitions r of baseline_r / kernel_r: results stored since 2026-12-03 only


class ReportError(ValueError):
    """The report cannot be made as asked (one-line message)."""


# -- data ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One shape of the set and its best verified result (None: missing)."""

    row: ShapeRow
    kernel_hash: str | None = None
    kernel_name: str = ""  # the tuner's config name, else the source's first comment line ("mma_multistage.cu"), or ""
    result: ShapeResult | None = None
    twin: bool = False  # the figure is the chosen kernel's host_cache twin's (report --host-cache-twins)
    estimator: Estimator = Estimator.RATIO

    @property
    def task(self) -> Task:
        return self.row.task

    @property
    def speedups(self) -> dict[str, float]:
        """Baseline -> speedup by the entry's estimator; empty when missing, or when the estimator is paired and the
        result predates the paired figure (then the shape counts as verified but unscored, like a missing one)."""
        if self.result is None:
            return {}
        return self.result.paired_speedups() if self.estimator is Estimator.PAIRED else self.result.speedups()

    @property
    def unpaired(self) -> bool:
        """Verified, but the paired estimator was asked for and this result has no paired figure."""
        return self.estimator is Estimator.PAIRED and self.result is not None and not self.result.paired


def kernel_name(source: str | None) -> str:
    """A short name for a kernel: its first line when that is a `//` comment, up to a ` -- ` (40 chars at most).

    Seed kernels start `// mma_multistage.cu -- seed kernel: ...`; generated ones may put their config name there.
    """
    if not source:
        return ""
    first = source.lstrip().split("\n", 1)[0].strip()
    if not first.startswith("//"):
        return ""
    return first.lstrip("/").strip().split(" -- ", 1)[0][:40]


def collect(rows: Sequence[ShapeRow], store: ResultStore, gpu: str, mode: Mode,
            host_cache_twins: bool = False, estimator: Estimator = Estimator.RATIO,
            rank: Rank = Rank.TIME, chosen_on: str | None = None) -> list[Entry]:
    """The best verified result of every row (one store query per shape; 1000 shapes take well under a second).
    A kernel the tuner generated is named by its config, any other by its source's first comment line. The choice
    of kernel does not depend on `estimator`, only the figures the entries give do; `rank` is how the offline
    search's choice is made (`ResultStore.chosen`). `chosen_on`: another GPU's label whose offline results choose
    each shape's kernel (`cudal2 remeasure --chosen-on` timed them on `gpu`); a shape it never verified is missing.
    `host_cache_twins` (server or wallclock mode): where the chosen kernel's host_cache twin has an ok figure in
    `mode`, that figure stands in the kernel's place, faster or not (the better of the two would be a best-of-2 on
    noise); a twin counts even where its kernel was not timed in the mode."""
    entries = []
    with TuneLog(store) as log:
        for row in rows:
            # once per shape: the kernel, and the one whose twin counts
            chosen = store.chosen(row.task, chosen_on or gpu, rank)
            best = _best(store, row.task, gpu, mode, chosen, elsewhere=chosen_on not in (None, gpu))
            twin = measured_twin(store, log, chosen[0][0], row.task, gpu, mode) if host_cache_twins and chosen else None
            if twin is not None:
                best = twin
            if best is None:
                entries.append(Entry(row, estimator=estimator))
                continue
            source_hash, result = best
            record = log.config_of(source_hash)
            name = record.name if record else kernel_name(store.get_source(source_hash))
            entries.append(Entry(row, source_hash, name, result, twin=twin is not None, estimator=estimator))
    return entries


def measured_twin(store: ResultStore, log: TuneLog, kernel_hash: str, task: Task, gpu: str,
                  mode: Mode) -> tuple[str, ShapeResult] | None:
    """The ok figure in `mode` on `task` of the host_cache twin of kernel `kernel_hash` (the one the offline search
    chose: `ResultStore.chosen`), if any."""
    twin = host_cache_twin(log.config_of(kernel_hash))
    result = store.get_result(twin.source_hash, task, gpu, mode) if twin else None
    return (twin.source_hash, result) if result is not None and result.status is Status.OK else None


def _best(store: ResultStore, task: Task, gpu: str, mode: Mode, chosen: list[tuple[str, ShapeResult]],
          elsewhere: bool = False) -> tuple[str, ShapeResult] | None:
    """Offline: the chosen kernel's result (`chosen`: `ResultStore.chosen`). Every other mode (confirm, server, wallclock): that mode's figure of the
    kernel the offline search chose, the one a user deploys. The fastest of several figures in that mode (earlier
    winners were timed there too) would be a best-of-N again, and server timings are noisy enough for it to show: on
    the H200 grid's small bucket 2.26x best-of-N against 2.01x for the chosen kernels (RESULTS, twenty-third
    session). A chosen kernel not yet timed in the mode leaves the shape missing (`cudal2 remeasure` times it); a
    shape with no verified offline result at all (a kernel evaluated only in server mode, say) takes the fastest
    verified figure of the mode. None if there is none.
    `elsewhere`: `chosen` is another GPU's choice; in every mode, offline too, the figure is its kernel's on `gpu`,
    and a shape without a choice is missing."""
    if not chosen and not elsewhere:
        fastest = store.best(task, gpu, mode=mode, baseline=None, limit=1)
        return fastest[0] if fastest else None
    if not chosen:
        return None
    if mode is Mode.OFFLINE and not elsewhere:
        return chosen[0]
    result = store.get_result(chosen[0][0], task, gpu, mode)
    return (chosen[0][0], result) if result is not None and result.status is Status.OK else None


# -- maths ---------------------------------------------------------------------------------------------------------


def geomean(values: Sequence[float]) -> float | None:
    """Geometric mean of positive values; None for none."""
    if not values:
        return None
    if any(v <= 0 for v in values):
        raise ValueError(f"geometric mean of a non-positive value: {min(values)}")
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


@dataclass(frozen=True)
class Stats:
    """Summary of n speedups vs one baseline (None where n = 0)."""

    n: int
    geomean: float | None
    mean: float | None  # arithmetic mean
    faster: float | None  # fraction of the n with speedup > 1 (strictly faster than the baseline)


def summarise(speedups: Sequence[float]) -> Stats:
    if not speedups:
        return Stats(0, None, None, None)
    n = len(speedups)
    return Stats(n, geomean(speedups), math.fsum(speedups) / n, sum(1 for s in speedups if s > 1.0) / n)


def baseline_speedups(entries: Iterable[Entry], baseline: str) -> list[float]:
    """The speedups vs `baseline` of the entries that have one (missing shapes contribute nothing)."""
    return [e.speedups[baseline] for e in entries if baseline in e.speedups]


@dataclass(frozen=True)
class GroupSummary:
    """A group of shapes (a size bucket, or all): how many, how many verified, and stats per baseline."""

    name: str
    shapes: int
    verified: int
    stats: dict[str, Stats]  # baseline -> Stats


def summarise_group(name: str, entries: Sequence[Entry]) -> GroupSummary:
    verified = sum(1 for e in entries if e.result is not None)
    return GroupSummary(name, len(entries), verified,
                        {b: summarise(baseline_speedups(entries, b)) for b in BASELINE_TITLES})


def by_bucket(items: Sequence[T], task_of: Callable[[T], Task]) -> list[tuple[str, list[T]]]:
    """The items of each size bucket of `data.BUCKETS` that has any, smallest first, then (ALL_SHAPES) all of them."""
    out = []
    for _, _, name in BUCKETS:
        members = [i for i in items if bucket(task_of(i).m, task_of(i).n, task_of(i).k) == name]
        if members:
            out.append((name, members))
    return [*out, (ALL_SHAPES, list(items))]


def bucket_summaries(entries: Sequence[Entry]) -> list[GroupSummary]:
    """One summary per size bucket of `data.BUCKETS` that has shapes, then one over all shapes."""
    return [summarise_group(name, members) for name, members in by_bucket(entries, lambda e: e.task)]


OUTPUT_OCTAVES = 2  # output-size groups span this many powers of two of M*N
SLOWEST_SHOWN = 10  # shapes listed under "Where it loses"


def output_size_summaries(entries: Sequence[Entry]) -> list[GroupSummary]:
    """One summary per output size M*N (groups of OUTPUT_OCTAVES powers of two, smallest first): where a family
    loses, it is usually for want of output tiles to fill the SMs, whatever K is."""
    groups: dict[int, list[Entry]] = {}
    for e in entries:
        lo = int(math.log2(e.task.m * e.task.n)) // OUTPUT_OCTAVES * OUTPUT_OCTAVES
        groups.setdefault(lo, []).append(e)
    return [summarise_group(f"2^{lo}-2^{lo + OUTPUT_OCTAVES}", groups[lo]) for lo in sorted(groups)]


def slowest(entries: Sequence[Entry], n: int, baseline: str = "cublas") -> list[Entry]:
    """The `n` verified shapes where the kernel is slowest against `baseline`, slowest first."""
    timed = [e for e in entries if e.speedups.get(baseline) is not None]
    return sorted(timed, key=lambda e: e.speedups[baseline])[:n]


def token_summaries(entries: Sequence[Entry]) -> list[GroupSummary]:
    """For a set of model layers (rows that name a model/layer): one summary per token count M, fewest first (M = 1
    is one decode step, M = 8192 a long prefill). Each shape once. Empty for a set that names no layer."""
    groups: dict[int, list[Entry]] = {}
    for e in entries:
        if e.row.layers:
            groups.setdefault(e.task.m, []).append(e)
    return [summarise_group(f"M = {m}", groups[m]) for m in sorted(groups)]


@dataclass(frozen=True)
class ModelPass:
    """One model's linear layers at one token count M: the GEMMs of one transformer block's forward pass. A layer
    counts once per name (Llama-3-8B's q_proj and o_proj share a shape, and both run)."""

    model: str
    tokens: int  # M
    layers: int  # layer names at this M (q, k, v, o, gate, up, down: 7 for the models in data/llm_shapes.csv)
    verified: int  # of which the shape has a verified result
    geomean: float | None  # of the verified layers' speedups vs cuBLAS, by the report's estimator
    # Σ cuBLAS median us / Σ kernel median us over the layers: how much less time the block's GEMMs take, each
    # layer weighted by its time. None unless every layer is verified (a partial sum would mislead).
    time_ratio: float | None


def model_passes(entries: Sequence[Entry]) -> list[ModelPass]:
    """One ModelPass per (model, token count) the set's rows name, by model name then M."""
    groups: dict[tuple[str, int], list[Entry]] = {}
    for e in entries:
        for model, _ in e.row.layers:
            groups.setdefault((model, e.task.m), []).append(e)
    out = []
    for (model, tokens), members in sorted(groups.items()):
        verified = [e for e in members if e.result is not None]
        times = [(e.result.timings.get("cublas"), e.result.timings.get("candidate")) for e in verified]
        timed = [(b.median_us, c.median_us) for b, c in times if b is not None and c is not None]
        ratio = (math.fsum(b for b, _ in timed) / math.fsum(c for _, c in timed)
                 if len(timed) == len(members) else None)
        out.append(ModelPass(model, tokens, len(members), len(verified),
                             geomean(baseline_speedups(verified, "cublas")), ratio))
    return out


@dataclass(frozen=True)
class Target:
    """A goal of issue #6: the geometric-mean speedup vs `baseline` over shapes with 2^lo <= MNK < 2^hi."""

    label: str
    baseline: str
    threshold: float
    lo: int | None = None  # MNK >= 2^lo (None: no lower bound)
    hi: int | None = None  # MNK < 2^hi (None: no upper bound)

    def selects(self, task: Task) -> bool:
        lg = mnk_log2(task.m, task.n, task.k)
        return (self.lo is None or lg >= self.lo) and (self.hi is None or lg < self.hi)


# Issue #6's targets: H200, fp32 accumulation, offline mode, over the full 1000-shape grid.
TARGETS = (
    Target("all shapes", "cublas", 1.15),
    Target("all shapes", "cublaslt_autotuned", 1.05),
    Target("small: MNK < 2^27", "cublas", 2.0, hi=27),
    Target("large: MNK >= 2^36", "cublas", 1.0, lo=36),
)


class Verdict(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    INCOMPLETE = "incomplete"  # some shapes in range have no result: no verdict on a partial set
    NO_SHAPES = "no shapes"  # the set has no shape in the target's range


@dataclass(frozen=True)
class TargetResult:
    target: Target
    shapes: int  # shapes of the set in the target's range
    stats: Stats  # over those with a speedup vs the target's baseline
    verdict: Verdict


def check_target(target: Target, entries: Sequence[Entry]) -> TargetResult:
    selected = [e for e in entries if target.selects(e.task)]
    stats = summarise(baseline_speedups(selected, target.baseline))
    if not selected:
        verdict = Verdict.NO_SHAPES
    elif stats.n < len(selected):
        verdict = Verdict.INCOMPLETE
    else:
        verdict = Verdict.PASS if stats.geomean >= target.threshold else Verdict.FAIL
    return TargetResult(target, len(selected), stats, verdict)


TARGET_GPU = "H200"  # the targets are for the lent H200


def target_caveat(tasks: Sequence[Task], mode: Mode, gpu: str = TARGET_GPU) -> str:
    """Why the targets' figures are only indicative for this report ("" when they apply as defined). `gpu`: the
    label the figures were taken on."""
    reasons = []
    if TARGET_GPU not in gpu:
        reasons.append(f"the targets are for the {TARGET_GPU}")
    if {(t.m, t.n, t.k) for t in tasks} != {(m, n, k) for m in GRID_VALUES for n in GRID_VALUES for k in GRID_VALUES}:
        reasons.append("this set is not the full 1000-shape grid")
    if any(t.acc is not Acc.FP32 for t in tasks):
        reasons.append("the targets are for fp32 accumulation")
    if mode.method is not Mode.OFFLINE:
        reasons.append("the targets are for offline mode")
    return "; ".join(reasons)


# -- heatmap data --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeatCell:
    geomean: float | None  # over the verified K values of this (M, N); None: none verified
    verified: int
    shapes: int


def heat_cells(entries: Sequence[Entry], baseline: str = "cublas") -> dict[tuple[int, int], HeatCell]:
    """Speedup vs `baseline` per (M, N), aggregated over K by geometric mean."""
    groups: dict[tuple[int, int], list[Entry]] = {}
    for e in entries:
        groups.setdefault((e.task.m, e.task.n), []).append(e)
    out = {}
    for key, members in groups.items():
        speedups = baseline_speedups(members, baseline)
        out[key] = HeatCell(geomean(speedups), len(speedups), len(members))
    return out


# -- markdown ------------------------------------------------------------------------------------------------------


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(r) for r in rows)])


def shape_label(task: Task) -> str:
    return f"{task.m}x{task.n}x{task.k}"


def _targets_md(results: Sequence[TargetResult], caveat: str) -> str:
    rows = [[r.target.label, BASELINE_TITLES[r.target.baseline], f"{r.stats.n}/{r.shapes}",
             _x(r.stats.geomean), f">= {r.target.threshold:.2f}x", r.verdict.value.upper()] for r in results]
    note = ("Issue #6 targets (H200, fp32, offline, full grid; geometric mean). A verdict needs every shape in range "
            "verified: otherwise it is INCOMPLETE and the geomean shown is over the verified ones only.")
    if caveat:
        note += f" **Indicative only here: {caveat}.**"
    return note + "\n\n" + md_table(["target", "vs", "verified", "geomean", "needed", "verdict"], rows)


def _buckets_md(groups: Sequence[GroupSummary], group_title: str = "MNK bucket",
                baselines: Sequence[str] = tuple(BASELINE_TITLES)) -> str:
    rows = []
    for g in groups:
        for b in baselines:
            s = g.stats[b]
            rows.append([g.name, str(g.shapes), str(g.verified), BASELINE_TITLES[b], str(s.n),
                         _x(s.geomean), _x(s.mean), _pct(s.faster)])
    return md_table([group_title, "shapes", "verified", "vs", "n", "geomean", "mean", "faster"], rows)


def _shapes_md(entries: Sequence[Entry]) -> str:
    with_source = len({e.row.source for e in entries}) > 1
    header = ["M", "N", "K", *(["source"] if with_source else []), "kernel", "kernel us", "cuBLAS us",
              *(f"vs {t}" for t in BASELINE_TITLES.values())]
    rows = []
    for e in entries:
        cells = [str(e.task.m), str(e.task.n), str(e.task.k), *([e.row.source] if with_source else [])]
        if e.result is None:
            rows.append([*cells, "missing", *["-"] * (2 + len(BASELINE_TITLES))])
            continue
        cand, cublas = e.result.timings.get("candidate"), e.result.timings.get("cublas")
        kernel = f"`{e.kernel_hash[:12]}`" + (f" {e.kernel_name}" if e.kernel_name else "")
        rows.append([*cells, kernel, _us(cand.median_us if cand else None), _us(cublas.median_us if cublas else None),
                     *(_x(e.speedups.get(b)) for b in BASELINE_TITLES)])
    return md_table(header, rows)


def _models_md(passes: Sequence[ModelPass]) -> str:
    rows = [[p.model, str(p.tokens), str(p.layers), str(p.verified), _x(p.geomean), _x(p.time_ratio)] for p in passes]
    return md_table(["model", "tokens (M)", "layers", "verified", "geomean vs torch.matmul / cuBLAS",
                     "block GEMM time, cuBLAS / ours"], rows)


@dataclass(frozen=True)
class ReportScope:
    """What the report covers, for its heading."""

    shapes: str  # the --shapes spec, e.g. data/grid.csv:heldout
    gpu: str
    mode: Mode
    db: Path
    twins: int | None = None  # shapes reported by their host_cache twin's figure; None: --host-cache-twins not asked
    estimator: Estimator = Estimator.RATIO
    rank: Rank = Rank.TIME
    chosen_on: str | None = None  # the GPU whose offline results chose the kernels; None: `gpu`'s own
    against: Mode = Mode.OFFLINE  # the mode the section "Against ..." compares `mode` with


def _twins_note(twins: int | None) -> str:
    if twins is None:
        return ""
    return (f" With --host-cache-twins: on {twins} shapes the figure is the chosen kernel's host_cache twin's (same "
            "device code; its entry point keeps CUTLASS's parameters between calls with the same pointers and "
            "shape), timed by `cudal2 remeasure --host-cache-twins`, faster or not.")


def _chosen_on_note(chosen_on: str | None, gpu: str) -> str:
    if chosen_on is None:
        return ""
    return (f" Kernels chosen on another GPU: each shape's kernel is the one {chosen_on}'s offline results chose, and "
            f"every figure is that kernel's on {gpu} (`cudal2 remeasure --chosen-on`), offline too; a shape it never "
            "verified is missing.")


def _mode_note(mode: Mode) -> str:
    if mode is Mode.OFFLINE:
        return (" Each shape's figure is the fastest of every kernel measured on it, so it leans optimistic by about "
                "the timing noise; `cudal2 remeasure --mode confirm` times the chosen kernels again.")
    if mode is Mode.CONFIRM:
        return (" Confirm mode: each shape's fastest offline kernel timed once more, offline, in a new evaluation "
                "(`cudal2 remeasure --mode confirm`): one fresh figure, not the best of many.")
    return (f" {mode.value.capitalize()} mode: each shape's fastest offline kernel (the one a user deploys) timed in "
            f"this mode (`cudal2 remeasure --mode {mode.value}`), not the fastest of all kernels timed in it; a shape "
            "with no offline result shows its fastest kernel of this mode.")


def _estimator_note(estimator: Estimator) -> str:
    if estimator is Estimator.PAIRED:
        return ("Speedup = the paired estimator: the median over the evaluation's repetitions r of baseline_r / "
                "kernel_r, both timed in repetition r (> 1: the kernel is faster). ")
    return "Speedup = baseline median time / kernel median time from the same evaluation (> 1: the kernel is faster). "


def _coverage_md(entries: Sequence[Entry]) -> str:
    missing = sum(e.result is None for e in entries)
    unpaired = sum(e.unpaired for e in entries)
    line = (f"**Coverage: {len(entries) - missing}/{len(entries)} shapes have a verified result, {missing} missing"
            + (f", {unpaired} of the verified without a paired figure" if unpaired else "") + "** (never counted as 1.0x).")
    if unpaired:
        line += (" A result without a paired figure was timed before the harness reported it (2026-12-03): "
                 "`cudal2 remeasure --paired` times such chosen kernels again.")
    return line


def render(scope: ReportScope, entries: Sequence[Entry], reference: Sequence[Entry] | None = None) -> str:
    """The whole report as markdown (pasteable into benchmarks/RESULTS.md). `reference`: the same rows collected in
    `scope.against` (offline unless asked); for a report in another mode, it adds what the mode changes (section
    "Against offline", or the mode asked)."""
    missing = [e for e in entries if e.result is None]
    unpaired = [e for e in entries if e.unpaired]
    accs = ", ".join(sorted({e.task.acc.value for e in entries}))
    parts = [
        f"### Leaderboard: `{scope.shapes}` · {scope.gpu} · {scope.mode.value} · {accs}"
        + (" · paired estimator" if scope.estimator is Estimator.PAIRED else "")
        + (" · kernels chosen by speedup" if scope.rank is Rank.SPEEDUP else "")
        + (f" · kernels chosen on {scope.chosen_on}" if scope.chosen_on else ""),
        f"Best verified (`ok`) kernel per shape from `{scope.db}` (evaluator {EVALUATOR_VERSION}), "
        + ("the one with the highest speedup over cuBLAS in its own evaluation (`--rank speedup`). "
           if scope.rank is Rank.SPEEDUP else "the one with the lowest median time (`--rank time`). ")
        + _estimator_note(scope.estimator) +
        "\"torch.matmul / cuBLAS\" is the harness's `cublas` baseline, cublasGemmEx with torch's settings: the call "
        "torch.matmul makes (there is no separate torch timing)." + _mode_note(scope.mode)
        + _twins_note(scope.twins) + _chosen_on_note(scope.chosen_on, scope.gpu),
        _coverage_md(entries),
        "#### Targets",
        _targets_md([check_target(t, entries) for t in TARGETS],
                    target_caveat([e.task for e in entries], scope.mode, scope.gpu)),
        "#### By size bucket",
        _buckets_md(bucket_summaries(entries)),
    ]
    passes = model_passes(entries)
    if passes:
        parts += ["#### By token count and model",
                  "Against torch.matmul / cuBLAS, each shape once:",
                  _buckets_md(token_summaries(entries), "tokens", ("cublas",)),
                  "Per model: its linear layers at each token count, a layer once per name (shapes shared by two "
                  "layers count twice, as both run). The last column is Σ cuBLAS median time / Σ kernel median time "
                  "over those layers (> 1: one block's GEMMs take less time), shown when every layer is verified.",
                  _models_md(passes)]
    worst = slowest(entries, SLOWEST_SHOWN)
    if worst:
        parts += ["#### Where it loses",
                  "By output size M*N, against torch.matmul / cuBLAS:",
                  _buckets_md(output_size_summaries(entries), "M*N", ("cublas",)),
                  f"The {len(worst)} slowest shapes against torch.matmul / cuBLAS:", _shapes_md(worst)]
    if scope.mode.replays:  # graph replay: the bound's floor is a graph node (roofline.py)
        parts += ["#### Headroom", _headroom_md(entries, scope.gpu, scope.mode)]
    if reference is not None and scope.mode is not scope.against:
        parts += [f"#### Against {scope.against.value}",
                  _against_md(entries, reference, scope.gpu, scope.mode, scope.against)]
    if missing:
        parts += [f"#### Missing shapes ({len(missing)})", ", ".join(e.task.mnk for e in missing)]
    if unpaired:
        parts += [f"#### Verified without a paired figure ({len(unpaired)})", ", ".join(e.task.mnk for e in unpaired)]
    parts += ["#### Per shape", _shapes_md(entries)]
    return "\n\n".join(parts) + "\n"


# -- headroom ------------------------------------------------------------------------------------------------------

HEADROOM_SHOWN = 10  # shapes listed with the most room between the kernel and the bound


@dataclass(frozen=True)
class Headroom:
    """One verified shape against the GPU's bound: its kernel's and cuBLAS's median times, microseconds."""

    entry: Entry
    bound: Bound
    kernel_us: float
    cublas_us: float

    @property
    def kernel_x(self) -> float:
        """The kernel's time over the bound (>= 1 unless the bound's figures are off)."""
        return self.kernel_us / self.bound.us

    @property
    def ceiling(self) -> float:
        """cuBLAS's time over the bound: the largest speedup over cuBLAS that any kernel could show here."""
        return self.cublas_us / self.bound.us


def medians_us(entry: Entry) -> tuple[float, float] | None:
    """The kernel's and cuBLAS's median times of a verified entry, microseconds; None if either is missing."""
    timings = entry.result.timings if entry.result is not None else {}
    cand, cublas = timings.get("candidate"), timings.get("cublas")
    return (cand.median_us, cublas.median_us) if cand is not None and cublas is not None else None


def headrooms(entries: Iterable[Entry], gpu: GpuFigures) -> list[Headroom]:
    """The verified entries that have both a kernel and a cuBLAS median, against `gpu`'s bound."""
    return [Headroom(e, bound(e.task, gpu), *times) for e in entries if (times := medians_us(e)) is not None]


@dataclass(frozen=True)
class HeadroomSummary:
    """Geometric means over a group of shapes: kernel / bound, cuBLAS / bound (the ceiling) and cuBLAS / kernel."""

    name: str
    n: int
    kernel_x: float | None
    ceiling: float | None
    speedup: float | None

    @property
    def share(self) -> float | None:
        """How much of the ceiling the speedup reached, in log terms (0: cuBLAS's time, 1: the bound); None where the
        ceiling is 1x or less (cuBLAS at the bound leaves no room to share)."""
        if self.speedup is None or self.ceiling is None or self.ceiling <= 1.0:
            return None
        return math.log(self.speedup) / math.log(self.ceiling)


def summarise_headroom(name: str, rows: Sequence[Headroom]) -> HeadroomSummary:
    return HeadroomSummary(name, len(rows), geomean([r.kernel_x for r in rows]), geomean([r.ceiling for r in rows]),
                           geomean([r.cublas_us / r.kernel_us for r in rows]))


def _headroom_md(entries: Sequence[Entry], gpu_label: str, mode: Mode) -> str:
    gpu = figures_for(gpu_label)
    if gpu is None:
        return f"No bound for {gpu_label}: `cudal2/roofline.py` has figures for {', '.join(f.name for f in FIGURES)}."
    rows = headrooms(entries, gpu)
    if not rows:
        return "No verified shape with a kernel and a cuBLAS time."
    note = (f"Against a lower bound per call on the {gpu.name} (`cudal2/roofline.py`): the largest of one graph node "
            f"({gpu.node_us:.3f} us), 2MNK at the tensor-core peak ({gpu.tensor_flop_per_us / 1e6:.0f} TFLOP/s) and "
            f"A, B, C moved once at HBM bandwidth ({gpu.hbm_bytes_per_us / 1e6:.2f} TB/s); median times. "
            "cuBLAS / bound is the largest speedup over cuBLAS any kernel could show; \"share\" is how much of it the "
            "kernels reached, log(speedup) / log(ceiling).")
    warm = sum(offline_inputs_in_l2(r.entry.task, gpu) for r in rows) if mode.method is Mode.OFFLINE else 0
    if warm:
        note += (f" Offline timing rotates at most {OFFLINE_MAX_SETS} input sets, so on {warm} of these {len(rows)} "
                 f"shapes ({OFFLINE_MAX_SETS} x 2(MK + KN + MN) bytes within the {gpu.l2_bytes >> 20} MB L2) the "
                 "inputs are still in L2 at each call, for cuBLAS as for the kernels; `cudal2 remeasure --mode cold` "
                 "times them from DRAM.")
    groups = [summarise_headroom(name, members) for name, members in by_bucket(rows, lambda r: r.entry.task)]
    table = md_table(["MNK bucket", "shapes", "kernel / bound", "cuBLAS / bound", "speedup vs cuBLAS", "share"],
                     [[g.name, str(g.n), _x(g.kernel_x), _x(g.ceiling), _x(g.speedup), _pct(g.share)] for g in groups])
    targets = md_table(["target", "needed", "reached", "ceiling (cuBLAS / bound)"],
                       [[t.label, f">= {t.threshold:.2f}x", _x(g.speedup), _x(g.ceiling)]
                        for t in TARGETS if t.baseline == "cublas"
                        for g in [summarise_headroom(t.label, [r for r in rows if t.selects(r.entry.task)])]])
    most = sorted(rows, key=lambda r: r.kernel_x, reverse=True)[:HEADROOM_SHOWN]
    shapes = md_table(["M", "N", "K", "kernel us", "cuBLAS us", "bound us", "bound by", "kernel / bound",
                       "cuBLAS / bound"],
                      [[str(r.entry.task.m), str(r.entry.task.n), str(r.entry.task.k), _us(r.kernel_us),
                        _us(r.cublas_us), _us(r.bound.us), r.bound.limit.value, _x(r.kernel_x), _x(r.ceiling)]
                       for r in most])
    return "\n\n".join([note, table, "The targets against torch.matmul / cuBLAS under their ceilings (a target above "
                          "its ceiling could not be met by any kernel):", targets,
                          f"The {len(most)} shapes with the most room (kernel / bound):", shapes])


# -- against a reference mode ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModeShift:
    """One shape verified in the reference mode (offline, or confirm) and in the report's mode (the same chosen
    kernel's figures): speedups vs cuBLAS by the report's estimator, median times in microseconds."""

    task: Task
    speedup_ref: float
    speedup_mode: float
    kernel_ref_us: float
    kernel_mode_us: float
    cublas_ref_us: float
    cublas_mode_us: float


def mode_shifts(entries: Sequence[Entry], reference: Sequence[Entry]) -> list[ModeShift]:
    """The shapes of `entries` (one mode) that `reference` (the same rows in the reference mode) also has, both with a
    speedup over cuBLAS and both medians. Entries pair by shape, so a kernel's host_cache twin pairs with its kernel."""
    ref_by_task = {e.task: e for e in reference}
    out = []
    for e in entries:
        r = ref_by_task.get(e.task)
        if r is None or "cublas" not in e.speedups or "cublas" not in r.speedups:
            continue
        times, times_ref = medians_us(e), medians_us(r)
        if times is None or times_ref is None:
            continue
        out.append(ModeShift(e.task, r.speedups["cublas"], e.speedups["cublas"], times_ref[0], times[0],
                             times_ref[1], times[1]))
    return out


def _shift_row(name: str, rows: Sequence[ModeShift]) -> list[str]:
    return [name, str(len(rows)), _x(geomean([r.speedup_ref for r in rows])),
            _x(geomean([r.speedup_mode for r in rows])),
            _x(geomean([r.kernel_mode_us / r.kernel_ref_us for r in rows])),
            _x(geomean([r.cublas_mode_us / r.cublas_ref_us for r in rows]))]


def _against_md(entries: Sequence[Entry], reference: Sequence[Entry], gpu_label: str, mode: Mode, against: Mode) -> str:
    """What the mode changes: per size bucket, the speedup in `against` and in `mode` over the same shapes, and how
    much the mode stretches the kernel's and cuBLAS's times. Where `against` is the offline method and the GPU has
    figures, also split by whether offline timing finds the inputs in L2 (roofline.offline_inputs_in_l2): cold mode's
    difference is made there."""
    rows = mode_shifts(entries, reference)
    if not rows:
        hint = (" (kernels another GPU chose have no offline figure here: --against confirm compares with the offline "
                "method's figures `cudal2 remeasure --mode confirm` took)" if against is Mode.OFFLINE else "")
        return f"No shape verified both in {against.value} and in {mode.value} mode{hint}."
    groups = [_shift_row(name, members) for name, members in by_bucket(rows, lambda r: r.task)]
    gpu = figures_for(gpu_label)
    if gpu is not None and against.method is Mode.OFFLINE:
        in_l2 = {r.task: offline_inputs_in_l2(r.task, gpu) for r in rows}
        groups += [_shift_row(name, members) for name, members in
                   ((f"inputs in L2 offline ({OFFLINE_MAX_SETS} sets <= {gpu.l2_bytes >> 20} MB)",
                     [r for r in rows if in_l2[r.task]]),
                    ("inputs not in L2 offline", [r for r in rows if not in_l2[r.task]])) if members]
    note = (f"The same chosen kernel per shape, in {against.value} and in {mode.value} mode, over the {len(rows)} "
            "shapes verified in both: speedups vs torch.matmul / cuBLAS, and each side's median time in this mode over "
            f"its {against.value} median (> 1: slower in this mode).")
    return "\n\n".join([note, md_table(["group", "shapes", f"speedup {against.value}", f"speedup {mode.value}",
                                         "kernel time ratio", "cuBLAS time ratio"], groups)])


# -- heatmap -------------------------------------------------------------------------------------------------------


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ReportError("--heatmap needs matplotlib, which is not installed (pip install matplotlib)") from None


def write_heatmap(entries: Sequence[Entry], path: Path, title: str) -> None:
    """log2 speedup vs torch.matmul/cuBLAS over (M, N), geomean over K; diverging map centred on 1.0x, grey missing.

    RdBu is one of ColorBrewer's colour-blind-safe diverging schemes (blue: faster than cuBLAS, red: slower).
    """
    import numpy as np
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    cells = heat_cells(entries)
    ms, ns = sorted({m for m, _ in cells}), sorted({n for _, n in cells})
    log2 = np.full((len(ms), len(ns)), np.nan)
    for (m, n), cell in cells.items():
        if cell.geomean is not None:
            log2[ms.index(m), ns.index(n)] = math.log2(cell.geomean)
    finite = log2[np.isfinite(log2)]
    limit = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0  # symmetric: 1.0x sits mid-scale
    cmap = _colormap("RdBu").with_extremes(bad="0.6")
    fig = Figure(figsize=(max(6.0, 0.7 * len(ns) + 2), max(4.5, 0.5 * len(ms) + 2)), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(log2), cmap=cmap, norm=Normalize(-limit, limit), aspect="auto",
                      origin="lower")
    ax.set_xticks(range(len(ns)), [str(n) for n in ns], rotation=90)
    ax.set_yticks(range(len(ms)), [str(m) for m in ms])
    ax.set_xlabel("N")
    ax.set_ylabel("M")
    ax.set_title(title + "\ngrey: no verified result; *: some K values missing", fontsize=9)
    if len(ms) * len(ns) <= 400:  # annotate when the numbers stay legible
        for (m, n), cell in cells.items():
            if cell.geomean is not None:
                dark = abs(math.log2(cell.geomean)) > limit / 2
                ax.text(ns.index(n), ms.index(m), f"{cell.geomean:.2f}" + ("*" if cell.verified < cell.shapes else ""),
                        ha="center", va="center", fontsize=7, color="white" if dark else "black")
    ticks = list(range(-math.ceil(limit), math.ceil(limit) + 1))
    bar = fig.colorbar(image, ax=ax, ticks=ticks)
    bar.ax.set_yticklabels([f"{2.0 ** t:g}x" for t in ticks])
    bar.set_label("speedup vs torch.matmul / cuBLAS (geomean over K)")
    fig.savefig(path, dpi=120)


def _colormap(name: str):
    from matplotlib import colormaps

    return colormaps[name]


# -- the command ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportRequest:
    shapes: str  # PATH or PATH:SPLIT
    gpu: str | None  # the label results were stored under, e.g. "NVIDIA H200 (sm_90a)"; None: see resolve_gpu
    mode: Mode
    acc: Acc | None  # None: each row's own acc
    db: Path
    out: Path | None  # markdown file; None: returned for printing
    heatmap: Path | None
    host_cache_twins: bool = False  # server or wallclock: measured host_cache twins in their kernels' place
    estimator: Estimator = Estimator.RATIO
    rank: Rank = Rank.TIME  # how each shape's kernel is chosen out of its offline results
    chosen_on: str | None = None  # another GPU (a label or a unique part of one) whose offline results choose kernels
    against: Mode = Mode.OFFLINE  # the reference mode of the section "Against ..." (confirm: for --chosen-on)


def load_rows(spec: str, acc: Acc | None) -> list[ShapeRow]:
    """The set's rows, acc overridden when asked (a shape listed with several accs then appears once)."""
    try:
        rows = load_shape_spec(spec)
    except BadShapeFile as e:
        raise ReportError(str(e)) from None
    if acc is None:
        return rows
    unique: dict[tuple[int, int, int], ShapeRow] = {}
    for r in rows:
        unique.setdefault((r.M, r.N, r.K), replace(r, acc=acc.value))  # the first row of a shape wins
    return list(unique.values())


def resolve_gpu(requested: str | None, machine: str | None, stored: Sequence[str]) -> str:
    """The GPU label to report on (cudal2.sandbox.store.resolve_gpu_label: the one asked for or a unique part of
    one, else this machine's GPU, else the store's only one); raises ReportError."""
    try:
        return resolve_gpu_label(list(stored), requested, machine)
    except GpuLabelError as e:
        raise ReportError(str(e)) from None


def _write(path: Path, write: Callable[[Path], object]) -> None:
    """`write(path)` after making its folder; an OSError becomes a one-line ReportError."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
    except OSError as e:
        raise ReportError(f"{path}: cannot write ({e.strerror or e})") from None


def run(req: ReportRequest) -> str:
    """Make the report; returns what to print (the markdown, or a summary line when it went to --out)."""
    if req.host_cache_twins and req.mode.replays:
        raise ReportError(f"--host-cache-twins with --mode {req.mode.value}: a twin's graph-replay time is its "
                          "kernel's; twins are reported in server or wallclock mode, where a call's host code is timed")
    if req.heatmap is not None:
        require_matplotlib()  # before any work
    rows = load_rows(req.shapes, req.acc)
    if not req.db.is_file():
        raise ReportError(f"{req.db}: no result store there (evaluate kernels first, or pass --db)")
    try:
        with ResultStore(req.db) as store:
            stored = store.ok_gpus()
            gpu = resolve_gpu(req.gpu or None, getattr(detect_gpu(), "label", None), stored)
            chooser = None if req.chosen_on is None else resolve_gpu_label(stored, req.chosen_on, None, "--chosen-on")
            entries = collect(rows, store, gpu, req.mode, req.host_cache_twins, req.estimator, req.rank, chooser)
            reference = (None if req.mode is req.against else
                         collect(rows, store, gpu, req.against, estimator=req.estimator, rank=req.rank, chosen_on=chooser))
    except (StoreError, GpuLabelError) as e:
        raise ReportError(str(e)) from None
    twins = sum(e.twin for e in entries) if req.host_cache_twins else None
    scope = ReportScope(req.shapes, gpu, req.mode, req.db, twins, req.estimator, req.rank, chooser, req.against)
    text = render(scope, entries, reference)
    verified = sum(1 for e in entries if e.result is not None)
    lines = []
    if req.heatmap is not None:
        _write(req.heatmap, lambda p: write_heatmap(entries, p, f"{req.shapes} · {gpu} · {req.mode.value}"))
        lines.append(f"heatmap written to {req.heatmap}")
    if req.out is not None:
        _write(req.out, lambda p: p.write_text(text))
    if not verified:
        lines.append(f"note: no verified result for GPU {gpu!r}, mode {req.mode.value} in {req.db}; labels with "
                     f"verified results there: {', '.join(map(repr, stored)) or 'none'}")
    if req.out is None:
        return text + "".join(f"\n{line}" for line in lines)
    return "\n".join([f"report written to {req.out}: {verified}/{len(entries)} shapes verified", *lines])
