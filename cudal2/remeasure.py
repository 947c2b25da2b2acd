"""`cudal2 remeasure`: time the best verified offline kernels of a shape set again in another mode (server,
wallclock or cold), so that the leaderboard (`cudal2 report --mode ...`) has those figures too; or in confirm mode
(the offline method in a new evaluation, stored apart), so that the leaderboard's figure of a shape is not the fastest
of many noisy measurements (see Mode).

    shapes (--shapes PATH[:split] / --mnk, those with 2^--min-log2-mnk <= MNK < 2^--max-log2-mnk)
        ──► per shape: store.best(offline, this GPU or the --chosen-on GPU, top N), newest ok results
        ──► (kernel, shape) already measured in the target mode on this GPU? count it, skip it (with --paired: unless
            that result is ok but has no paired speedup, timed before the harness reported one)
        ──► group by source hash: one job = one kernel on up to MAX_JOB_SHAPES of its shapes
        ──► SandboxPool.submit(source, shapes) with EvalOptions(mode=target): one compile per kernel (cached), one
            harness process times the kernel and the baselines per job; the evaluator stores every result under
            the target mode, so `report --mode target` finds kernel and baseline figures of the same process
    until every job is done or the time budget is spent (jobs still queued then are cancelled: a re-run does them).

With --host-cache-twins (server or wallclock), each chosen kernel that the tuner generated from an sm90 config is
replaced by its host_cache twin: the same config and device code, whose entry point keeps CUTLASS's parameters
between calls with the same pointers and shape (cudal2/kernels/sm90.py). The twin's source and config go into the
store, and its figures compete with the kernel's own in that mode (`cudal2 export --mode wallclock` ships the faster);
offline they tie, so the tuner never searches host_cache. Kernels without a twin (other families, hand-written
sources, twins already, and configs of an older version of sm90's space, which the tuner skips for the same reason:
they no longer build) are counted and skipped.

Shapes without a verified offline kernel on this GPU are counted and listed, never measured.
Units: times in seconds unless named `_ms` / `_us`; speedups are baseline time over kernel time.
"""

from __future__ import annotations

import os
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path

from cudal2.data import mnk_log2
from cudal2.report import kernel_name
from cudal2.sandbox.evaluator import EvalOptions
from cudal2.sandbox.gpu import detect_gpu
from cudal2.sandbox.pool import PoolConfig, RunnerSpec, SandboxPool
from cudal2.sandbox.store import GpuLabelError, Rank, ResultStore, StoreError, default_db_path, resolve_gpu_label
from cudal2.sandbox.types import Acc, EvalResult, Mode, Status, Task
from cudal2.tune import MAX_JOB_SHAPES, TuneInputError, load_tasks, shapes_text
from cudal2.tune_log import TuneLog
from cudal2.twins import Twin, host_cache_twin

SHOWN_MISSING = 8  # shapes without a kernel named in the summary; the rest are counted


class RemeasureError(ValueError):
    """Bad input (shapes, mode, budgets, store, no GPU); one line for the user."""


@dataclass(frozen=True)
class RemeasureRequest:
    shapes: str | None  # PATH or PATH:train|heldout (a shape CSV, cudal2.data); None: only `mnks`
    mnks: tuple[str, ...] = ()  # extra M_N_K shapes, accumulation `acc`
    acc: Acc = Acc.FP32
    mode: Mode = Mode.SERVER  # the mode to measure in; never OFFLINE (that is what is remeasured)
    # --top N > 1 in confirm mode would pick the fastest of N fresh figures again: the bias it is there to remove.
    top: int = 1  # offline kernels per shape, fastest first
    db_path: str | None = None  # result store; None = default_db_path()
    gpu_index: int = 0
    target_ms: float = 30.0  # timing budget per timed kernel per shape, milliseconds
    budget_s: float = 600.0  # wall clock for the whole run; queued jobs are cancelled at the deadline
    compile_workers: int = 0  # concurrent compiles; 0 = CPU cores
    host_cache_twins: bool = False  # measure each chosen sm90 kernel's host_cache twin in its place
    min_log2_mnk: int = 0  # only the shapes with M*N*K >= 2^min_log2_mnk (36: the large bucket of issue #6)
    # Measure again the pairs whose newest result in the mode is ok but has no paired speedup, so that
    # `cudal2 report --estimator paired` covers them.
    paired: bool = False
    rank: Rank = Rank.TIME  # how each shape's offline kernels are ordered (`ResultStore.chosen`)
    # only the shapes with M*N*K < 2^max_log2_mnk (30: where cold mode differs from offline, roofline.py)
    max_log2_mnk: int = 64
    # The GPU (its label, or a unique part: "h200") whose offline results choose the kernels, timed on this GPU: how
    # another GPU's leaderboard kernels fare here (confirm gives this GPU's offline-method figure of them). None: this
    # GPU's own choice.
    chosen_on: str | None = None

    def problems(self) -> list[str]:
        return [why for bad, why in (
            (self.mode == Mode.OFFLINE,
             "--mode offline: offline results are what is remeasured; use server, wallclock, confirm or cold"),
            (self.top < 1, f"--top {self.top}: must be >= 1"),
            (self.mode == Mode.CONFIRM and self.top != 1,
             f"--top {self.top} with --mode confirm: confirm times each shape's one chosen kernel (--top 1)"),
            (self.target_ms <= 0 or self.budget_s <= 0, "--target-ms and --budget-minutes must be positive"),
            (self.compile_workers < 0, f"--jobs {self.compile_workers}: must be >= 0"),
            (self.min_log2_mnk < 0, f"--min-log2-mnk {self.min_log2_mnk}: must be >= 0"),
            (self.max_log2_mnk <= self.min_log2_mnk,
             f"--max-log2-mnk {self.max_log2_mnk}: must be above --min-log2-mnk ({self.min_log2_mnk})"),
            (self.host_cache_twins and self.mode.replays,
             f"--host-cache-twins with --mode {self.mode.value}: a twin's graph-replay time is its kernel's; measure "
             "twins in server or wallclock mode, where a call's host code is timed")) if bad]


@dataclass(frozen=True)
class Job:
    """One kernel on some of its shapes: compiled once, evaluated in one harness process."""

    source_hash: str
    source: str
    tasks: tuple[Task, ...]


@dataclass(frozen=True)
class Plan:
    jobs: tuple[Job, ...]
    already_measured: int  # (kernel, shape) pairs with a result in the target mode (paired: if asked): not measured
    without_kernel: tuple[Task, ...]  # shapes with no verified offline kernel on this GPU
    without_source: int  # (kernel, shape) pairs whose source text is not in the store: cannot be compiled
    twins: tuple[Twin, ...] = ()  # the twins the jobs measure (twin_of given), to record in the store first
    without_twin: int = 0  # (kernel, shape) pairs skipped because the kernel has no twin (twin_of given)


def plan(store: ResultStore, tasks: Sequence[Task], gpu_label: str, mode: Mode, top: int = 1,
         twin_of: Callable[[str], Twin | None] | None = None, need_paired: bool = False,
         rank: Rank = Rank.TIME, chosen_on: str | None = None) -> Plan:
    """What to measure: the `top` best verified offline kernels per shape on `chosen_on` (None: `gpu_label`; with
    `twin_of`, given a kernel's source hash: their twins instead), less the (kernel, shape) pairs already measured in
    `mode` on `gpu_label` (with `need_paired`: whose newest result there is not an ok one without the paired
    speedup), grouped by kernel (first-seen order) in chunks of MAX_JOB_SHAPES."""
    by_kernel: dict[str, list[Task]] = {}
    without_kernel: list[Task] = []
    twins: dict[str, Twin | None] = {}  # chosen kernel's hash -> its twin (looked up once per kernel)
    measured = without_twin = 0
    for task in tasks:
        best = store.chosen(task, chosen_on or gpu_label, rank, limit=top)
        if not best:
            without_kernel.append(task)
        for h, _ in best:
            if twin_of is not None:
                if h not in twins:
                    twins[h] = twin_of(h)
                twin = twins[h]
                if twin is None:
                    without_twin += 1
                    continue
                h = twin.source_hash
            if _measured(store, h, task, gpu_label, mode, need_paired):
                measured += 1
            else:
                by_kernel.setdefault(h, []).append(task)
    twin_sources = {t.source_hash: t for t in twins.values() if t is not None}
    jobs: list[Job] = []
    without_source = 0
    for h, kernel_tasks in by_kernel.items():
        source = twin_sources[h].source if h in twin_sources else store.get_source(h)
        if source is None:
            without_source += len(kernel_tasks)
            continue
        jobs += [Job(h, source, tuple(kernel_tasks[i:i + MAX_JOB_SHAPES]))
                 for i in range(0, len(kernel_tasks), MAX_JOB_SHAPES)]
    measured_twins = tuple(twin_sources[h] for h in by_kernel if h in twin_sources)
    return Plan(tuple(jobs), measured, tuple(without_kernel), without_source, measured_twins, without_twin)


def _measured(store: ResultStore, source_hash: str, task: Task, gpu: str, mode: Mode, need_paired: bool) -> bool:
    """Has (kernel, shape) a result in `mode` that this run would not replace? A failed one counts (timing it
    again gives the same failure); with `need_paired`, an ok one only if it carries the paired speedup."""
    if not need_paired:
        return store.measured_at(source_hash, task, gpu, mode) is not None
    result = store.get_result(source_hash, task, gpu, mode)
    return result is not None and (result.status is not Status.OK or bool(result.paired))


@dataclass
class RemeasureSummary:
    mode: Mode
    gpu: str
    plan: Plan
    paired: bool = False  # --paired: ok results without the paired speedup were planned again
    finished: int = 0  # jobs whose results came back (evaluated or not)
    measured: int = 0  # (kernel, shape) pairs evaluated in this run
    not_evaluated: int = 0  # (kernel, shape) pairs cancelled at the deadline or never submitted
    statuses: Counter = field(default_factory=Counter)  # per-shape statuses of this run's evaluations
    stop_reason: str = ""
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Every planned evaluation ran and was ok."""
        return not self.not_evaluated and all(s == Status.OK.value for s in self.statuses)

    def render(self) -> str:
        p, mode = self.plan, self.mode.value
        lines = [f"{mode} mode on {self.gpu}: {self.finished}/{len(p.jobs)} jobs, {self.measured} (kernel, shape) "
                 f"evaluations, {self.not_evaluated} not evaluated, in {self.elapsed_s:.0f} s; "
                 f"stopped: {self.stop_reason}",
                 f"skipped: {p.already_measured} (kernel, shape) already measured in {mode} mode"
                 + (" with the paired speedup" if self.paired else "") + ", "
                 f"{p.without_source} without a stored source"
                 + (f", {p.without_twin} whose kernel has no host_cache twin" if p.without_twin else "")]
        if self.statuses:
            lines.append("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items())))
        if p.without_kernel:
            extra = len(p.without_kernel) - SHOWN_MISSING
            more = f", ... {extra} more" if extra > 0 else ""
            lines.append(f"no verified offline kernel: {len(p.without_kernel)} shapes "
                         f"({', '.join(t.mnk for t in p.without_kernel[:SHOWN_MISSING])}{more})")
        return "\n".join(lines)


class _Run:
    """A plan's jobs through one SandboxPool until all are back or the deadline; fills the summary."""

    def __init__(self, summary: RemeasureSummary, names: dict[str, str], out: Callable[[str], None], started: float):
        self.summary, self.names, self.out, self.started = summary, names, out, started

    def execute(self, jobs: Sequence[Job], config: PoolConfig, runner: RunnerSpec | None, deadline: float) -> None:
        pending: deque[Job] = deque(jobs)
        inflight: dict[Future, Job] = {}
        timed_out = False
        pool = SandboxPool(config, runner)
        try:
            # At most compile_workers + 2 jobs submitted at once: the rest wait here, none compiles after the deadline.
            while not timed_out and (pending or inflight):
                while pending and len(inflight) < config.compile_workers + 2 and time.monotonic() < deadline:
                    job = pending.popleft()
                    inflight[pool.submit(job.source, job.tasks, caller="remeasure")] = job
                timed_out = time.monotonic() >= deadline
                if inflight:
                    done, _ = wait(inflight, timeout=max(0.1, deadline - time.monotonic()), return_when=FIRST_COMPLETED)
                    for fut in done:
                        self._finish(inflight.pop(fut), fut.result())
                    timed_out = time.monotonic() >= deadline and bool(pending or inflight)
        finally:
            pool.shutdown(wait=False)  # queued jobs are cancelled (internal_error results), running ones finish
        for fut, job in inflight.items():
            self._finish(job, fut.result())
        self.summary.not_evaluated += sum(len(j.tasks) for j in pending)
        self.summary.stop_reason = "time budget spent" if timed_out else "all jobs done"

    def _finish(self, job: Job, res: EvalResult) -> None:
        self.summary.finished += 1
        if all(s.status == Status.INTERNAL_ERROR for s in res.shapes):  # cancelled at the deadline or a pool failure
            self.summary.not_evaluated += len(job.tasks)
            what = f"not evaluated: {res.shapes[0].reason[:120]}"
        else:
            self.summary.measured += len(res.shapes)
            self.summary.statuses.update(s.status.value for s in res.shapes)
            what = shapes_text(res.shapes)
        t, n = int(time.monotonic() - self.started), len(self.summary.plan.jobs)
        self.out(f"[{self.summary.finished:4d}/{n} {t // 60}m{t % 60:02d}s] {job.source_hash[:12]} "
                 f"{self.names[job.source_hash]} ({len(job.tasks)} shapes) {what}")


def run(request: RemeasureRequest, out: Callable[[str], None] = print,
        runner: RunnerSpec | None = None) -> RemeasureSummary:
    """Remeasure (see the module docstring); raises RemeasureError for bad input. `runner`: the pool's GPU stage
    (None: the evaluator; tests substitute a simulated GPU)."""
    started = time.monotonic()
    if request.problems():
        raise RemeasureError("; ".join(request.problems()))
    try:
        tasks = [t for t in load_tasks(request.shapes, request.mnks, request.acc.value)
                 if request.min_log2_mnk <= mnk_log2(t.m, t.n, t.k) < request.max_log2_mnk]
    except TuneInputError as e:
        raise RemeasureError(str(e)) from None
    if not tasks:
        raise RemeasureError(f"no shape of the set has 2^{request.min_log2_mnk} <= MNK < 2^{request.max_log2_mnk} "
                             "(--min-log2-mnk, --max-log2-mnk)")
    db = Path(request.db_path) if request.db_path else default_db_path()
    if not db.is_file():
        raise RemeasureError(f"{db}: no result store there (tune or evaluate kernels first, or pass --db)")
    gpu = detect_gpu(request.gpu_index)
    if gpu is None:
        raise RemeasureError(f"no CUDA GPU visible at index {request.gpu_index}: remeasuring times kernels on one")
    try:
        with ResultStore(db) as store, TuneLog(store) as log:
            twin_of = (lambda h: host_cache_twin(log.config_of(h))) if request.host_cache_twins else None
            chooser = (gpu.label if request.chosen_on is None
                       else resolve_gpu_label(store.ok_gpus(), request.chosen_on, None, flag="--chosen-on"))
            p = plan(store, tasks, gpu.label, request.mode, request.top, twin_of, request.paired, request.rank,
                     chooser)
            for twin in p.twins:  # as the tuner records what it generates: the source, and the config behind it
                store.put_source(twin.source_hash, twin.source)
                log.put_config(twin.source_hash, twin.record)
            # progress lines name a kernel by its tuner config, else by its first comment line
            names = {j.source_hash: getattr(log.config_of(j.source_hash), "name", None) or kernel_name(j.source)
                     or "(unnamed)" for j in p.jobs}
    except (StoreError, GpuLabelError) as e:
        raise RemeasureError(str(e)) from None
    summary = RemeasureSummary(request.mode, gpu.label, p, request.paired)
    kernels = len({j.source_hash for j in p.jobs})
    out(f"{len(tasks)} shapes: {len(p.jobs)} jobs ({kernels} kernels, {sum(len(j.tasks) for j in p.jobs)} "
        f"(kernel, shape) pairs) to measure in {request.mode.value} mode on {gpu.label}"
        + (f", the kernels chosen on {chooser}" if chooser != gpu.label else ""))
    if p.jobs:
        workers = request.compile_workers or os.cpu_count() or 1
        # gpu_queue = workers: compiles may run that far ahead of the GPU, on every core.
        config = PoolConfig(gpus=(gpu.index,), compile_workers=workers, gpu_queue=max(2, workers), db_path=str(db),
                            # fresh: the plan holds only pairs to measure anew, so the store must not answer them
                            # (with --paired it holds a result in this mode, the one without the paired speedup)
                            eval=EvalOptions(mode=request.mode, gpu_index=gpu.index, arch=gpu.arch,
                                             target_ms=request.target_ms, fresh=True))
        _Run(summary, names, out, started).execute(p.jobs, config, runner, started + request.budget_s)
    else:
        summary.stop_reason = "nothing to measure"
    summary.elapsed_s = time.monotonic() - started
    return summary
