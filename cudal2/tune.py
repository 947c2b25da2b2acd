"""`cudal2 tune`: search the generated kernel families for the fastest verified kernel per shape, no LLM needed.

    strategy.propose() ──► config already tried this run? skip ──► family.prune(cfg, arch)? count the reason, skip
        ──► shapes it supports (and, for an evolutionary child, the size bucket of its parent's shape)
        ──► already measured for those shapes on this GPU (store) / compiled for this arch (tune_compiles)? resume:
            its stored times feed the strategy, nothing is compiled or run
        ──► SandboxPool.submit(source, shapes), in jobs of at most MAX_JOB_SHAPES shapes (a job is the unit that
            is resumed or cancelled at the deadline): one compile serves every shape; compiles run ahead of the GPU
            on every core; every result lands in the ResultStore (the evaluator writes it), the config in tune_log
    until the time budget or the config budget is spent, or proposals stop yielding new configs.

Resuming: no config is measured twice. A re-proposed config is answered by the store (on a GPU: its results for
those shapes; compile-only: its compile record), so a random re-run with the same seed walks its earlier configs in
a moment and goes on after them. On a GPU the run first feeds the strategy the fastest stored configs of these
families on these shapes, so an evolutionary re-run breeds from everything measured before (its proposals depend
on the order results arrive in, so it does not replay the earlier sequence).

`--worst N` narrows a set to its N shapes where the store's best verified kernel on this GPU is slowest against cuBLAS
(shapes without one first): after a transfer over the 1000-shape grid, an evolutionary search there finds the kernels
that the nearest tuned shapes could not lend (skinny long-K shapes need split-K that no large shape wins with); a
second transfer then lends those kernels to their neighbours. `--won-only` first keeps the shapes whose fastest stored
kernel the searched families (`--family`) generated: `--family small --won-only --strategy neighbours` steps from the
small family's winners where it wins, not where an sm90 kernel is far ahead.

At the end it prints the best verified kernel per shape from the store (this and earlier runs, any source), with
its speedup over cuBLAS and cuBLASLt autotuned. `--show` prints that table without tuning.

Units: times in microseconds unless named `_s` (seconds); speedups are baseline time over kernel time.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from cudal2.data import BadShapeFile, bucket, load_shapes
from cudal2.kernels.family import BadConfig, KernelFamily, config_from_name
from cudal2.kernels.sm80 import Sm80Family
from cudal2.kernels.sm90 import Sm90Family
from cudal2.kernels.small import SmallFamily
from cudal2.sandbox.compiler import nvcc_flags
from cudal2.sandbox.cublas_kernels import CublasKernelsError, cublas_algos
from cudal2.sandbox.evaluator import EvalOptions, source_hash
from cudal2.sandbox.gpu import DEFAULT_ARCH, GpuInfo, detect_gpu, sm_count
from cudal2.sandbox.lt_algo import CUBLASLT_AUTOTUNED, LtDecodeError
from cudal2.sandbox.lt_algo import decode as decode_lt_algo
from cudal2.sandbox.pool import PoolConfig, RunnerSpec, SandboxPool
from cudal2.sandbox.store import GpuLabelError, ResultStore, resolve_gpu_label
from cudal2.sandbox.types import BadTask, EvalResult, Mode, ShapeResult, Status, Task
from cudal2.tune_log import CompileRecord, ConfigRecord, TuneLog
from cudal2.tune_search import MODEL_MIN_RESULTS, Candidate, Proposal, Strategy, make_strategy

# sm90 first: on an H200 it is the family that can beat cuBLAS on large shapes; prune() drops it on other archs.
FAMILIES: tuple[KernelFamily, ...] = (Sm90Family(), Sm80Family(), SmallFamily())
MAX_STALE_PROPOSALS = 2000  # proposals in a row that give no new config: the space is exhausted
MAX_JOB_SHAPES = 32  # shapes per pool job: a 250-shape job of large GEMMs would hold the GPU for minutes
BASELINES = ("cublas", "cublaslt_autotuned")


class TuneInputError(ValueError):
    """Bad tuner input (shapes, family names, budgets); one line for the user."""


@dataclass(frozen=True)
class TuneOptions:
    families: tuple[str, ...] = tuple(f.name for f in FAMILIES)
    strategy: Strategy = Strategy.EVOLUTIONARY
    budget_s: float = 600.0  # wall clock for proposing; jobs still queued at the deadline are cancelled
    max_configs: int = 200  # configs evaluated (submitted or resumed) at most
    seed: int = 0
    compile_only: bool = False  # no GPU: compile and record compile outcomes only
    gpu_index: int = 0
    arch: str | None = None  # nvcc target; default: the GPU's (sm_90a on an H200), else sm_90a
    db_path: str | None = None  # result store; None = the default path
    target_ms: float = 50.0  # timing budget per timed kernel per shape (the evaluator's default is 150)
    compile_workers: int = 0  # concurrent compiles; 0 = CPU cores
    cache_dir: Path | None = None  # compile cache; None = the evaluator's default
    worst: int = 0  # > 0: tune only the set's `worst` shapes where the stored best is slowest vs cuBLAS (a GPU's)
    # Tune only the shapes whose fastest stored kernel (a GPU's) one of `families` generated, before `worst`: a step
    # from a family's winners (--strategy neighbours) is wasted where another family's kernel is far ahead.
    won_only: bool = False
    sms: int = 0  # SMs the fill strategy's wave model fills; 0 = the GPU's (cudal2.sandbox.gpu.SM_COUNTS)
    # With compile_only: plan as a run on this stored GPU would (its label, or a unique part of one): --worst, the
    # warm start and the cuBLASLt algorithms read its results, so the configs compiled are the ones that run would
    # propose first, and a compile cache built here serves it (precompiling on a CPU machine). Nothing is measured.
    plan_as: str | None = None
    vary: tuple[str, ...] = ()  # --strategy neighbours: step only along these parameters (() = every parameter)
    # Stored results with these statuses are not resumed from: their (config, shape) pairs run again (a rejection by a
    # check that has since been fixed, or by the device-idle check's rare false positive, no longer bars the config).
    retry: frozenset[Status] = frozenset()
    # --strategy cublaslt: benchmarks/cublas_graph.cu's report of the kernels cuBLAS runs per shape on this GPU, whose
    # nvjet tiles the strategy follows too (cudal2.sandbox.cublas_kernels); None: cuBLASLt's autotuned algorithms only
    cublas_kernels: Path | None = None
    # --strategy given: the config names it measures, in order (tune --configs FILE: read_config_names)
    given: tuple[str, ...] = ()


@dataclass(frozen=True)
class BestKernel:
    """The fastest verified kernel for one shape on one GPU (from the store)."""

    task: Task
    gpu: str
    source_hash: str
    config: str | None  # the generator config, None for a source the tuner did not generate
    median_us: float
    speedups: dict[str, float]


@dataclass
class TuneSummary:
    proposals: int = 0
    duplicates: int = 0
    pruned: Counter = field(default_factory=Counter)  # prune_category(reason) -> count
    pruned_example: dict[str, str] = field(default_factory=dict)  # prune_category(reason) -> first such reason
    unsupported: int = 0  # configs that support none of their shapes (e.g. fp16 accumulation on fp32 tasks)
    resumed: int = 0  # configs answered by the store: nothing compiled or run
    submitted: int = 0  # configs sent to the pool (in one or more jobs)
    jobs: int = 0  # pool jobs sent (a config's shapes in chunks of MAX_JOB_SHAPES)
    finished: int = 0  # jobs whose outcome is in, resumed ones included
    cancelled: int = 0  # jobs sent but not evaluated: still queued at the deadline (or an internal error)
    statuses: Counter = field(default_factory=Counter)  # per-shape statuses of this run's evaluations
    successes: int = 0  # configs that compiled (compile-only) or ran ok on some shape, resumed ones included
    improvements: int = 0  # times a config beat the best time so far on a shape (stored ones included)
    warm_start: int = 0  # (config, shape) times from earlier runs fed to the strategy before proposing
    stop_reason: str = ""
    elapsed_s: float = 0.0
    best: list[BestKernel] = field(default_factory=list)
    shapes: tuple[Task, ...] = ()  # the shapes tuned: the set, or its --worst part

    @property
    def configs(self) -> int:
        return self.resumed + self.submitted

    @property
    def succeeded(self) -> bool:
        return self.successes > 0

    def render(self) -> str:
        lines = [f"{self.configs} configs ({self.submitted} sent in {self.jobs} jobs, {self.cancelled} jobs not "
                 f"evaluated; {self.resumed} resumed from the store) from {self.proposals} proposals in "
                 f"{self.elapsed_s:.0f} s; stopped: {self.stop_reason}",
                 f"skipped before compiling: {self.duplicates} repeats, {self.unsupported} supporting no shape, "
                 f"{sum(self.pruned.values())} pruned; warm start from {self.warm_start} stored (config, shape) times"]
        lines += [f"  {n:5d}x e.g. {self.pruned_example[cat]}" for cat, n in self.pruned.most_common()]
        if self.statuses:
            lines.append("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items()))
                         + f"; {self.improvements} new per-shape bests")
        return "\n".join(lines)


def families_named(names: Sequence[str]) -> tuple[KernelFamily, ...]:
    """The families with these names ("all" = every one), in FAMILIES order."""
    known = {f.name: f for f in FAMILIES}
    wanted = set(known) if "all" in names else set(names)
    unknown = sorted(wanted - set(known))
    if unknown or not wanted:
        raise TuneInputError(f"unknown family {', '.join(unknown) or '(none)'}: expected {', '.join(known)} or all")
    return tuple(f for f in FAMILIES if f.name in wanted)


def load_tasks(shapes: str | None, mnks: Sequence[str], acc: str) -> list[Task]:
    """Tasks from `PATH[:split]` (a shape CSV, cudal2.data) and/or M_N_K strings, de-duplicated, in order."""
    tasks: list[Task] = []
    if shapes:
        path, split = shapes, None
        head, sep, tail = shapes.rpartition(":")
        if sep and tail in ("train", "heldout"):
            path, split = head, tail
        try:
            tasks += [row.task for row in load_shapes(path, split)]
        except BadShapeFile as e:
            raise TuneInputError(str(e)) from None
    try:
        tasks += [Task.parse(s, acc) for s in mnks]
    except BadTask as e:
        raise TuneInputError(str(e)) from None
    if not tasks:
        raise TuneInputError("no shapes: give --shapes FILE[:split] or --mnk M_N_K")
    return list(dict.fromkeys(tasks))


def candidate_named(families: Sequence[KernelFamily], name: str) -> Candidate:
    """The config `name` names (as `config_name` prints it), from one of `families`; TuneInputError otherwise."""
    family = next((f for f in families if name.partition("-")[0] == f.name), None)
    if family is None:
        raise TuneInputError(f"config {name!r}: its family is not one searched "
                             f"({', '.join(f.name for f in families)})")
    try:
        return Candidate(family, config_from_name(family, name))
    except BadConfig as e:
        raise TuneInputError(f"config {e}") from None


def read_config_names(path: str | Path) -> tuple[str, ...]:
    """Config names from a file, one per line; blank lines and `#` comments are skipped. TuneInputError when the file
    cannot be read or names none."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TuneInputError(f"--configs {path}: cannot read it ({e.__class__.__name__}: {e})") from None
    names = tuple(line.split("#", 1)[0].strip() for line in text.splitlines())
    names = tuple(n for n in names if n)
    if not names:
        raise TuneInputError(f"--configs {path}: no config names in it (one per line, as `cudal2 tune` prints them)")
    return names


def read_config_lists(paths: Sequence[str | Path]) -> tuple[str, ...]:
    """The config names of several files (read_config_names), in file order; a name in two files is kept once, where
    it first appears."""
    return tuple(dict.fromkeys(name for path in paths for name in read_config_names(path)))


def prune_category(reason: str) -> str:
    """A prune reason with its numbers masked, so that reasons of one kind count together."""
    return re.sub(r"\d+", "#", reason)


@dataclass(frozen=True)
class _Job:
    candidate: Candidate
    source: str
    source_hash: str
    tasks: tuple[Task, ...]


class Tuner:
    """One tuning run (see the module docstring). Use `run()`."""

    def __init__(self, options: TuneOptions, tasks: Sequence[Task], store: ResultStore, log: TuneLog,
                 out: Callable[[str], None], runner: RunnerSpec | None = None):
        if (options.max_configs < 1 or options.budget_s <= 0 or options.compile_workers < 0 or options.target_ms <= 0
                or options.worst < 0 or options.sms < 0):
            raise TuneInputError("--max-configs, --budget-minutes and --target-ms must be positive, --jobs, "
                                 "--worst and --sms >= 0")
        self.options = options
        self.runner = runner  # the pool's GPU stage (None: the evaluator); tests substitute a simulated one
        self.tasks = tuple(tasks)
        self.store, self.log, self.out = store, log, out
        self.families = families_named(options.families)
        if options.plan_as is not None and not options.compile_only:
            raise TuneInputError("--plan-as plans a --compile-only run as on a stored GPU; a GPU run plans as itself")
        self.gpu: GpuInfo | None = None if options.compile_only else detect_gpu(options.gpu_index)
        if self.gpu is None and not options.compile_only:
            raise TuneInputError("no CUDA GPU visible on this machine: use --compile-only")
        # The GPU whose stored results plan the run: this one, or under --compile-only the one --plan-as names.
        self.label: str | None = self.gpu.label if self.gpu else self._plan_label(options)
        if (options.worst or options.won_only) and self.label is None:
            flag = "--worst ranks" if options.worst else "--won-only reads"
            raise TuneInputError(f"{flag} a GPU's stored results: it needs a GPU, or --plan-as with --compile-only")
        if options.won_only:
            self.tasks = won_by(store, log, self.tasks, self.label, self.families)
        if options.worst:
            self.tasks = worst_shapes(store, log, self.tasks, self.label, options.worst)
        self.arch = options.arch or (self.gpu.arch if self.gpu else DEFAULT_ARCH)
        try:
            nvcc_flags(self.arch)
        except ValueError as e:
            raise TuneInputError(str(e)) from None
        self._check_vary(options)
        self.strategy = make_strategy(options.strategy, self.families, options.seed, self.tasks, self.arch,
                                      options.sms or sm_count(self.gpu, self.arch), options.vary,
                                      self._given(options))
        if options.strategy.reads_cublaslt_algos:
            self._feed_cublaslt_algos()
            if options.cublas_kernels is not None:
                self._feed_cublas_kernels(options.cublas_kernels)
        elif options.cublas_kernels is not None:
            raise TuneInputError(f"--cublas-kernels feeds --strategy cublaslt; --strategy {options.strategy.value} "
                                 "does not read it")
        self.pending: deque[_Job] = deque()  # further jobs (shape chunks) of the config proposed last
        self.ok_configs: set[str] = set()  # source hashes that compiled or ran ok on some shape
        self.summary = TuneSummary(shapes=self.tasks)
        self.seen: set[str] = set()
        self.best_us: dict[Task, float] = {}
        self.started = time.monotonic()

    def _check_vary(self, options: TuneOptions) -> None:
        """--vary names parameters of the families searched, and only neighbours steps along parameters."""
        if not options.vary:
            return
        if options.strategy is not Strategy.NEIGHBOURS:
            raise TuneInputError(f"--vary limits --strategy neighbours; --strategy {options.strategy.value} does "
                                 "not step along parameters")
        known = {name for family in self.families for name in family.space()}
        if unknown := [name for name in options.vary if name not in known]:
            raise TuneInputError(f"--vary {unknown[0]}: not a parameter of the families searched "
                                 f"(known: {', '.join(sorted(known))})")

    def _given(self, options: TuneOptions) -> tuple[Candidate, ...]:
        """The configs --strategy given measures, parsed from their names; only that strategy takes a list."""
        if (options.strategy is Strategy.GIVEN) != bool(options.given):
            raise TuneInputError("--strategy given measures the configs --configs FILE names; the list goes with it "
                                 "alone")
        return tuple(candidate_named(self.families, name) for name in options.given)

    def _plan_label(self, options: TuneOptions) -> str | None:
        """The stored GPU label --plan-as names, None without it."""
        if options.plan_as is None:
            return None
        try:
            return resolve_gpu_label(self.store.ok_gpus(), options.plan_as, None)
        except GpuLabelError as e:
            raise TuneInputError(f"--plan-as: {e}") from None

    # ------------------------------------------------------------------------------------------------- run
    def run(self) -> TuneSummary:
        workers = self.options.compile_workers or os.cpu_count() or 1
        # gpu_queue = workers: compiles may run that far ahead of the GPU, on every core.
        config = PoolConfig(gpus=() if self.gpu is None else (self.gpu.index,), compile_workers=workers,
                            gpu_queue=max(2, workers), db_path=str(self.store.path), eval=self._eval_options())
        if self.label is not None:
            self.summary.warm_start = self._warm_start()
        if self.options.strategy is Strategy.MODEL and self.summary.warm_start < MODEL_MIN_RESULTS:
            raise TuneInputError(f"--strategy model learns from the store's results on this GPU: it found "
                                 f"{self.summary.warm_start} of these families (needs {MODEL_MIN_RESULTS}; without a "
                                 "GPU, name a stored one with --plan-as); run another strategy first")
        pool = SandboxPool(config, self.runner)
        try:
            self._loop(pool, max_inflight=workers + 2)
        finally:
            pool.shutdown(wait=False)  # nothing is in flight unless interrupted; then queued jobs are cancelled
        self.summary.elapsed_s = time.monotonic() - self.started
        if self.gpu is not None:
            self.summary.best = best_kernels(self.store, self.log, self.tasks, [self.gpu.label])
        return self.summary

    def _loop(self, pool: SandboxPool, max_inflight: int) -> None:
        deadline = self.started + self.options.budget_s
        inflight: dict[Future, _Job] = {}
        while True:
            while not self.summary.stop_reason and len(inflight) < max_inflight:
                job = self._next_job(deadline)
                if job is not None:
                    inflight[pool.submit(job.source, job.tasks, caller="tune")] = job
            if not inflight:
                return
            done, _ = wait(inflight, timeout=max(0.1, deadline - time.monotonic()), return_when=FIRST_COMPLETED)
            for fut in done:
                self._finish(inflight.pop(fut), fut.result())
            if time.monotonic() >= deadline and inflight:
                self.summary.stop_reason = self.summary.stop_reason or "time budget spent"
                pool.shutdown(wait=False)  # queued jobs are cancelled, running ones finish
                for fut, job in inflight.items():
                    self._finish(job, fut.result())
                return

    def _eval_options(self) -> EvalOptions:
        base = EvalOptions(compile_only=self.options.compile_only, gpu_index=self.options.gpu_index,
                           arch=self.arch, target_ms=self.options.target_ms, retry=self.options.retry)
        return replace(base, cache_dir=self.options.cache_dir) if self.options.cache_dir else base

    def _feed_cublaslt_algos(self) -> None:
        """Give the strategy the cuBLASLt algorithm stored for each target on this GPU, decoded."""
        if self.label is None:
            raise TuneInputError(f"--strategy {self.options.strategy.value} starts from the cuBLASLt algorithms a "
                                 "GPU's evaluations stored: it needs a GPU, or --plan-as with --compile-only")
        for task in self.tasks:
            algo_hex = self.store.get_algo(task, self.label, CUBLASLT_AUTOTUNED)
            if algo_hex is not None:
                try:
                    self.strategy.observe_cublaslt(task, decode_lt_algo(algo_hex))
                except LtDecodeError as e:
                    raise TuneInputError(f"cuBLASLt algorithm of {task.m}x{task.n}x{task.k}: {e}") from None

    def _feed_cublas_kernels(self, path: Path) -> None:
        """Give the strategy the algorithm of the nvjet kernel cuBLAS runs on each target (cublas_graph.cu's report)."""
        try:
            algos = cublas_algos(path.read_text())
        except (OSError, UnicodeDecodeError, CublasKernelsError) as e:
            raise TuneInputError(f"--cublas-kernels {path}: {e}") from None
        for task in self.tasks:
            if (algo := algos.get((task.m, task.n, task.k))) is not None:
                self.strategy.observe_cublaslt(task, algo)

    def _warm_start(self) -> int:
        """Feed the strategy the fastest stored configs of these families on these shapes (earlier runs), so an
        evolutionary re-run breeds from them; a transfer or fill run is fed every shape measured on this GPU.
        Returns how many (config, shape) times it fed."""
        shapes = list(self.tasks)
        if self.options.strategy.plans_from_store:
            targets = set(self.tasks)
            for acc in dict.fromkeys(t.acc for t in self.tasks):
                shapes += [t for t in self.store.ok_shapes(acc, self.label) if t not in targets]
        fed = 0
        for task in shapes:
            for stored in stored_candidates(self.store, self.log, task, self.label, self.families,
                                            self.strategy.warm_configs):
                self.strategy.observe_stored(stored.candidate, task, stored.median_us, stored.current)
                self.best_us[task] = min(self.best_us.get(task, stored.median_us), stored.median_us)
                fed += 1
        return fed

    # -------------------------------------------------------------------------------------------- proposing
    def _next_job(self, deadline: float) -> _Job | None:
        """The next job to submit; None when a config was resumed instead, or the run must stop (stop_reason set)."""
        stale = 0
        while True:
            if time.monotonic() >= deadline:
                self.summary.stop_reason = "time budget spent"
                return None
            if self.pending:
                self.summary.jobs += 1
                return self.pending.popleft()
            if self.summary.configs >= self.options.max_configs:
                self.summary.stop_reason = f"--max-configs {self.options.max_configs} reached"
                return None
            if stale >= MAX_STALE_PROPOSALS:
                self.summary.stop_reason = f"{MAX_STALE_PROPOSALS} proposals in a row gave no new config"
                return None
            proposal = self.strategy.propose()
            if proposal is None:
                self.summary.stop_reason = "the strategy has proposed everything it had"
                return None
            self.summary.proposals += 1
            tasks = self._admit(proposal)
            if tasks is None:
                stale += 1
                continue
            jobs = self._register(proposal.candidate, tasks)
            if self._resume(jobs):
                return None
            self.summary.submitted += 1
            self.summary.jobs += 1
            self.pending.extend(jobs[1:])
            return jobs[0]

    def _admit(self, proposal: Proposal) -> tuple[Task, ...] | None:
        """The shapes to evaluate a new, valid config on; None (counted) for a repeat, a pruned or useless one."""
        cand = proposal.candidate
        if cand.name in self.seen:
            self.summary.duplicates += 1
            return None
        self.seen.add(cand.name)
        why = cand.family.prune(cand.cfg, self.arch)
        if why is not None:
            category = prune_category(why)
            self.summary.pruned[category] += 1
            self.summary.pruned_example.setdefault(category, why)
            return None
        shapes = self.tasks if proposal.shapes is None else proposal.shapes
        if proposal.focus is not None:
            shapes = tuple(t for t in shapes if bucket(t.m, t.n, t.k) == bucket(proposal.focus.m, proposal.focus.n,
                                                                                    proposal.focus.k))
        shapes = tuple(t for t in shapes if cand.family.supports(cand.cfg, t) is None)
        if not shapes:
            self.summary.unsupported += 1
            return None
        return shapes

    def _register(self, cand: Candidate, tasks: tuple[Task, ...]) -> list[_Job]:
        """The config's source in the store and the log; its shapes in jobs of at most MAX_JOB_SHAPES."""
        source = cand.family.render(cand.cfg)
        h = source_hash(source)
        self.store.put_source(h, source)
        self.log.put_config(h, ConfigRecord.of(cand.family, cand.cfg))
        return [_Job(cand, source, h, tasks[i:i + MAX_JOB_SHAPES]) for i in range(0, len(tasks), MAX_JOB_SHAPES)]

    def _resume(self, jobs: list[_Job]) -> bool:
        """Drop from `jobs` those the store already answers (their times feed the strategy); True when that was
        all of them (the config counts as resumed)."""
        if self.options.plan_as is not None:  # --compile-only
            return False  # precompiling: the library must be in the cache; a stored compile outcome is not one
        if self.gpu is None:  # compile-only: one compile answers every shape
            known = self.log.compile_of(jobs[0].source_hash, self.arch)
            if known is None:
                return False
            self.summary.resumed += 1
            self._succeeded(jobs[0], known.status == Status.COMPILED)
            self._progress(jobs[0], f"resumed: {_compile_text(known)}")
            return True
        options = self._eval_options()
        for job in list(jobs):
            results = [self.store.get_result(job.source_hash, t, self.gpu.label, Mode.OFFLINE) for t in job.tasks]
            if not all(options.answers(r) for r in results):  # the evaluator would measure some: submit the job
                continue
            jobs.remove(job)
            self._succeeded(job, any(r.status == Status.OK for r in results))
            improved = self._observe(job, results)
            self._progress(job, "resumed: " + shapes_text(results) + _best_text(improved))
        if jobs:
            return False
        self.summary.resumed += 1
        return True

    # --------------------------------------------------------------------------------------------- results
    def _finish(self, job: _Job, res: EvalResult) -> None:
        if all(s.status == Status.INTERNAL_ERROR for s in res.shapes):  # not evaluated (cancelled at the deadline,
            self.summary.cancelled += 1                                # or a pool failure): the next run redoes it
            self._progress(job, f"not evaluated: {res.shapes[0].reason[:120]}")
            return
        record = _compile_record(res)
        if record is not None:
            self.log.put_compile(job.source_hash, self.arch, record)
        self.summary.statuses.update(s.status.value for s in res.shapes)
        self._succeeded(job, any(s.status in (Status.OK, Status.COMPILED) for s in res.shapes))
        improved = self._observe(job, list(res.shapes))
        what = _compile_text(record) if record is not None else res.shapes[0].reason
        if self.gpu is not None:
            what += " | " + shapes_text(list(res.shapes)) + _best_text(improved)
        self._progress(job, what)

    def _observe(self, job: _Job, results: Sequence[ShapeResult]) -> int:
        """Feed ok times to the strategy; returns on how many shapes this config is the best so far."""
        improved = 0
        for r in results:
            cand = r.timings.get("candidate")
            if r.status != Status.OK or cand is None:
                continue
            self.strategy.observe(job.candidate, r.task, cand.median_us)
            if cand.median_us < self.best_us.get(r.task, float("inf")):
                self.best_us[r.task] = cand.median_us
                improved += 1
        self.summary.improvements += improved
        return improved

    def _succeeded(self, job: _Job, ok: bool) -> None:
        """Count the config once as a success when any of its jobs compiled or ran ok."""
        if ok and job.source_hash not in self.ok_configs:
            self.ok_configs.add(job.source_hash)
            self.summary.successes += 1

    def _progress(self, job: _Job, what: str) -> None:
        self.summary.finished += 1
        elapsed = time.monotonic() - self.started
        self.out(f"[job {self.summary.finished:4d}, {self.summary.configs} configs {int(elapsed) // 60}m"
                 f"{int(elapsed) % 60:02d}s] "
                 f"{job.candidate.name}"
                 f"  ({len(job.tasks)} shape{'s' if len(job.tasks) != 1 else ''}) {what}")


def _compile_record(res: EvalResult) -> CompileRecord | None:
    """What to remember about compiling this source; None when the outcome says nothing about it (timeouts,
    internal errors)."""
    comp = res.compile
    if comp is None:
        rejected = [s for s in res.shapes if s.status == Status.STATIC_REJECT]
        return CompileRecord(Status.STATIC_REJECT, rejected[0].reason, None, None, 0.0) if rejected else None
    if comp.status not in (Status.COMPILED, Status.COMPILE_ERROR):
        return None
    if any(s.status == Status.STATIC_REJECT for s in res.shapes):  # the link check rejected the library
        return CompileRecord(Status.STATIC_REJECT, res.shapes[0].reason, None, None, comp.seconds)
    regs = max((k.registers for k in comp.kernels), default=None)
    spills = max((k.spill_store_bytes + k.spill_load_bytes for k in comp.kernels), default=None)
    return CompileRecord(comp.status, comp.reason, regs, spills, comp.seconds)


def _compile_text(record: CompileRecord) -> str:
    if record.status != Status.COMPILED:
        return f"{record.status.value}: {record.reason[:120]}"
    took = f"in {record.seconds:.1f} s" if record.seconds > 0 else "(cached)"
    return f"compiled {took}, worst kernel {record.registers} regs / {record.spill_bytes} B spilled"


def _best_text(improved: int) -> str:
    return f"; best so far on {improved} shape{'s' if improved != 1 else ''}" if improved else ""


def shapes_text(results: Sequence[ShapeResult]) -> str:
    """One progress line's outcome of a job: statuses, the range of speedups over cuBLAS, the first failure."""
    counts = Counter(r.status.value for r in results)
    text = ", ".join(f"{k} {v}/{len(results)}" for k, v in sorted(counts.items()))
    speedups = [r.speedup("cublas") for r in results if r.status == Status.OK]
    speedups = [s for s in speedups if s]
    if speedups:
        text += f"; vs cublas {min(speedups):.2f}x..{max(speedups):.2f}x"
    bad = next((r for r in results if not r.status.success), None)
    return text + (f"; first failure: {bad.task.mnk}: {bad.reason[:100]}" if bad else "")


# ----------------------------------------------------------------------------------------------- queries


def best_kernels(store: ResultStore, log: TuneLog, tasks: Sequence[Task], gpus: Sequence[str] | None = None,
                 mode: Mode = Mode.OFFLINE) -> list[BestKernel]:
    """The fastest verified kernel per (task, GPU) in the store (any source); GPUs default to every GPU with an ok
    result for the task. Tasks without one are left out."""
    out = []
    for task in tasks:
        for gpu in gpus if gpus is not None else log.gpus_with_ok_results(task, mode):
            for h, res in store.best(task, gpu, mode=mode, baseline=None, limit=1):
                record = log.config_of(h)
                out.append(BestKernel(task, gpu, h, record.name if record else None,
                                      res.timings["candidate"].median_us, res.speedups()))
    return out


class StoredCandidate(NamedTuple):
    candidate: Candidate
    median_us: float
    current: bool  # the stored source is what the config renders today (False: the family's code changed since)


@functools.lru_cache(maxsize=65536)
def _render_hash(family: KernelFamily, cfg: Any) -> str:
    return source_hash(family.render(cfg))


def stored_candidates(store: ResultStore, log: TuneLog, task: Task, gpu: str, families: Sequence[KernelFamily],
                      limit: int) -> list[StoredCandidate]:
    """The `limit` fastest ok offline results of `task` on `gpu` that these families generated, fastest first, one per
    config: its current render's result where the store has one (an older render's time is not what the config runs
    at today, and strategies keep the last time they observe per config), else its fastest older render's. Skipped:
    sources no family here generated, and configs of an older version of a family's space (they can be neither bred
    from nor re-rendered)."""
    by_name = {f.name: f for f in families}
    out: dict[str, StoredCandidate] = {}
    for h, res in store.best(task, gpu, mode=Mode.OFFLINE, baseline=None, limit=limit):
        record = log.config_of(h)
        if record is None or record.family not in by_name:
            continue
        family = by_name[record.family]
        try:
            cfg = family.make(record.params)
        except BadConfig:
            continue
        stored = StoredCandidate(Candidate(family, cfg), res.timings["candidate"].median_us,
                                 _render_hash(family, cfg) == h)
        kept = out.get(stored.candidate.name)
        if kept is None or (stored.current and not kept.current):
            out[stored.candidate.name] = stored
    return sorted(out.values(), key=lambda c: (c.median_us, c.candidate.name))


def worst_shapes(store: ResultStore, log: TuneLog, tasks: Sequence[Task], gpu: str, n: int) -> tuple[Task, ...]:
    """The `n` shapes of `tasks` where the best verified kernel on `gpu` is slowest against cuBLAS; shapes without
    one (or without a cuBLAS time) come first. Ties keep the set's order."""
    speedup = {b.task: b.speedups.get("cublas", 0.0) for b in best_kernels(store, log, tasks, [gpu])}
    return tuple(sorted(tasks, key=lambda t: speedup.get(t, 0.0))[:n])


def won_by(store: ResultStore, log: TuneLog, tasks: Sequence[Task], gpu: str,
           families: Sequence[KernelFamily]) -> tuple[Task, ...]:
    """The shapes of `tasks` whose fastest verified kernel on `gpu` one of `families` generated, in the set's order
    (a shape won by a source no family generated, or with no verified kernel, is left out)."""
    names = {f.name for f in families}
    won = []
    for task in tasks:
        chosen = store.chosen(task, gpu)  # the kernel a report shows and a user deploys
        record = log.config_of(chosen[0][0]) if chosen else None
        if record is not None and record.family in names:
            won.append(task)
    return tuple(won)


def best_table(tasks: Sequence[Task], best: Sequence[BestKernel]) -> str:
    """Markdown: one row per (shape, GPU) with a verified kernel, a '-' row for shapes without one."""
    lines = ["| shape | acc | GPU | best config | kernel us | vs cublas | vs cublaslt_autotuned |",
             "|---|---|---|---|---:|---:|---:|"]
    by_task: dict[Task, list[BestKernel]] = {}
    for b in best:
        by_task.setdefault(b.task, []).append(b)
    for task in tasks:
        rows = by_task.get(task)
        if not rows:
            lines.append(f"| {task.mnk} | {task.acc.value} | - | - | - | - | - |")
        for b in rows or ():
            sp = [f"{b.speedups[k]:.3f}x" if k in b.speedups else "-" for k in BASELINES]
            config = b.config or f"(source {b.source_hash[:12]})"
            lines.append(f"| {task.mnk} | {task.acc.value} | {b.gpu} | {config} | {b.median_us:.2f} | {sp[0]} | {sp[1]} |")
    return "\n".join(lines)


def run(options: TuneOptions, tasks: Sequence[Task], out: Callable[[str], None] = print,
        runner: RunnerSpec | None = None) -> TuneSummary:
    """Tune (see the module docstring); raises TuneInputError for bad options, StoreError for a bad store."""
    with ResultStore(options.db_path) as store, TuneLog(store) as log:
        return Tuner(options, tasks, store, log, out, runner).run()


def show(tasks: Sequence[Task], db_path: str | None) -> str:
    """The best-kernel table for `tasks` from the store, every GPU that has results."""
    with ResultStore(db_path) as store, TuneLog(store) as log:
        return best_table(tasks, best_kernels(store, log, tasks))
