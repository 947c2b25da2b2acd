"""evaluate(source, tasks) -> EvalResult: the one entry point every reward and every published number uses.

    source --static_check.check_source--> violations? -> STATIC_REJECT
           --compiler.compile_source-----> CompileResult (cached by content) -> COMPILE_ERROR / TIMEOUT
           --static_check.check_library--> forbidden imports / instructions? -> STATIC_REJECT
           --store (unless fresh)--------> results already measured for (source, task, GPU, version, mode)
           --runner.run_harness----------> one confined child per candidate, many tasks per child;
                                            a crash or hang costs the task it happened in, the rest rerun
                                            (told whether the source spells PDL: then it must be capturable)
           --store.put_result------------> every result persisted
"""

from __future__ import annotations

import hashlib
import os
import signal
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cudal2.sandbox import compiler, static_check
from cudal2.sandbox.gpu import DEFAULT_ARCH, GpuInfo, detect_gpu
from cudal2.sandbox.harness_build import HarnessBuildError, harness_path
from cudal2.sandbox.lt_algo import CUBLASLT_AUTOTUNED
from cudal2.sandbox.runner import HarnessRun, RunLimits, run_harness
from cudal2.sandbox.store import ResultStore
from cudal2.sandbox.types import (
    EVALUATOR_VERSION,
    CompileResult,
    EvalResult,
    Mode,
    ShapeResult,
    Status,
    Task,
    Timing,
    paired_from_json,
)

# Plausibility gate: no HGEMM on any GPU we target runs faster than this (H200 dense fp16 is ~990 TFLOP/s by
# the datasheet; 1.5x headroom). A faster reported time means the measurement was fooled.
ROOFLINE_FLOPS_PER_S = 1.5e15
NO_CUTLASS_HEADERS = ("the source includes CUTLASS/CuTe headers and this machine has none (pip install --no-deps "
                      "nvidia-cutlass==4.2.0.0, or set CUDAL2_CUTLASS_INCLUDE); not compiled, not stored")


@dataclass(frozen=True)
class EvalOptions:
    """How to evaluate. Field comments give units."""

    mode: Mode = Mode.OFFLINE
    compile_only: bool = False  # static checks + compile + link check only; no GPU needed
    gpu_index: int = 0
    arch: str | None = None  # nvcc target; default: the GPU's (sm_90a on Hopper, sm_80 otherwise) or sm_90a
    fresh: bool = False  # ignore results already in the store
    # Stored results with one of these statuses are measured again instead of served (the store is append-only: the
    # new result answers from then on). For run-time verdicts that a harness fix, or a check's rare false positive
    # (the device-idle check's ~3e-5 per evaluation), may have made stale.
    retry: frozenset[Status] = frozenset()
    checks: bool = True  # runtime hardening checks (turn off only to measure their cost)
    baselines: bool = True  # time cuBLAS / cuBLASLt beside the candidate
    target_qps: float = 2000.0  # server mode: mean arrival rate, calls per second
    target_ms: float = 150.0  # timing budget per timed kernel per shape, milliseconds
    warmup_ms: float = 20.0
    min_reps: int = 10
    max_reps: int = 200
    tol_fp32: float = 2.5e-4  # max relative error vs the half-rounded fp32 reference at K=1024 (x sqrt(K/1024))
    tol_fp16: float = 5e-3  # fp16-accumulate floor at K=1024; also >= 2x cuBLAS fp16 error on the same inputs
    compile_timeout_s: float = 180.0
    limits: RunLimits = field(default_factory=RunLimits)
    cache_dir: Path | None = None  # compile cache; default under the user cache dir

    def answers(self, stored: ShapeResult | None) -> bool:
        """Whether a stored result answers an evaluation with these options instead of a new measurement (the one rule
        for the evaluator's store lookup and for what `cudal2 tune` resumes from)."""
        return stored is not None and not self.fresh and stored.status not in self.retry


@dataclass(frozen=True)
class Prepared:
    """A candidate after the CPU stages. `final` is set when the outcome is decided without a GPU (static reject,
    compile error, compile-only, no GPU); otherwise `compile.lib_path` is ready for the GPU stage."""

    source: str
    source_hash: str
    tasks: tuple[Task, ...]
    compile: CompileResult | None
    final: EvalResult | None


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cudal2" / "build"


class Evaluator:
    """Evaluates candidate sources on tasks. One instance serves many candidates (the harness is built once)."""

    def __init__(self, options: EvalOptions | None = None, store: ResultStore | None = None):
        self.options = options or EvalOptions()
        self.store = store
        self.gpu: GpuInfo | None = None if self.options.compile_only else detect_gpu(self.options.gpu_index)
        self.arch = self.options.arch or (self.gpu.arch if self.gpu else DEFAULT_ARCH)
        self.cache_dir = self.options.cache_dir or default_cache_dir()
        self._harness: Path | None = None

    @property
    def gpu_label(self) -> str:
        return self.gpu.label if self.gpu else f"cpu (compile-only, {self.arch})"

    def evaluate(self, source: str, tasks: Sequence[Task]) -> EvalResult:
        """Never raises for a bad candidate: every failure is a status on each task's ShapeResult."""
        return self.run(self.prepare(source, tasks))

    def prepare(self, source: str, tasks: Sequence[Task]) -> Prepared:
        """The CPU stages: static rules, compile (cached), link check. Touches neither the GPU nor the store, so
        a pool can run many at once ahead of the GPU stage, also on machines without a GPU (for `self.arch`)."""
        src_hash, tasks = source_hash(source), tuple(tasks)

        def final(comp, status, reason, violations=()):
            shapes = tuple(ShapeResult(t, status, reason) for t in tasks)
            res = EvalResult(src_hash, self.gpu_label, EVALUATOR_VERSION, comp, shapes, tuple(violations))
            return Prepared(source, src_hash, tasks, comp, res)

        violations = static_check.check_source(source)
        if violations:
            return final(None, Status.STATIC_REJECT, str(violations[0]), violations)
        if compiler.cutlass_include_dir() is None and static_check.includes_cutlass(source):  # scan only if missing
            # Not a compile_error: stored, it would bar a good kernel from every later run on a machine that has
            # the headers (seen on the H200 when the carried wheels were left out). internal_error is never stored.
            return final(None, Status.INTERNAL_ERROR, NO_CUTLASS_HEADERS)
        comp = compiler.compile_source(source, self.arch, self.cache_dir, timeout_s=self.options.compile_timeout_s)
        if comp.status != Status.COMPILED:
            return final(comp, comp.status, comp.reason)
        link = [v for v in static_check.check_library(comp.lib_path) if v.rule != "link_check_unavailable"]
        if link:
            return final(comp, Status.STATIC_REJECT, str(link[0]), link)
        if self.options.compile_only:
            why = f"compiled for {self.arch} in {comp.seconds:.1f} s{' (cached)' if comp.cached else ''}; not run"
            return final(comp, Status.COMPILED, why)
        return Prepared(source, src_hash, tasks, comp, None)

    def run(self, prepared: Prepared) -> EvalResult:
        """The GPU stage (store lookup, harness, store) for a runnable candidate; a final one is only recorded."""
        if prepared.final is not None:
            self._record(prepared.final)
            return prepared.final
        if self.gpu is None:
            shapes = tuple(ShapeResult(t, Status.NO_GPU, "no CUDA GPU visible: use --compile-only")
                           for t in prepared.tasks)
            return EvalResult(prepared.source_hash, self.gpu_label, EVALUATOR_VERSION, prepared.compile, shapes)
        shapes = self._run(prepared.source, prepared.source_hash, prepared.compile, prepared.tasks)
        return EvalResult(prepared.source_hash, self.gpu_label, EVALUATOR_VERSION, prepared.compile, tuple(shapes))

    def baselines(self, tasks: Sequence[Task]) -> list[ShapeResult]:
        """cuBLAS / cuBLASLt timings alone (no candidate)."""
        if self.gpu is None:
            return [ShapeResult(t, Status.NO_GPU, "no CUDA GPU visible") for t in tasks]
        return self._run_harness_tasks("-", list(tasks))

    # ---------------------------------------------------------------------------------------------- internals
    def _record(self, res: EvalResult) -> None:
        """Persist statuses decided before running (rejections, compile errors); not compile-only or no-GPU
        answers, which say nothing about the candidate on a GPU."""
        if self.store is None:
            return
        for s in res.shapes:
            if s.status not in (Status.COMPILED, Status.INTERNAL_ERROR, Status.NO_GPU):
                self.store.put_result(res.source_hash, self.gpu_label, self.options.mode, s)

    def _run(self, source: str, src_hash: str, comp: CompileResult, tasks: Sequence[Task]) -> list[ShapeResult]:
        known: dict[Task, ShapeResult] = {}
        if self.store is not None:
            self.store.put_source(src_hash, source)
            if not self.options.fresh:
                for t in tasks:
                    hit = self.store.get_result(src_hash, t, self.gpu_label, self.options.mode)
                    if self.options.answers(hit):
                        known[t] = hit
        todo = [t for t in dict.fromkeys(tasks) if t not in known]
        if todo:
            pdl = static_check.spells_programmatic_launch(source)
            for res in self._run_harness_tasks(comp.lib_path, todo, pdl):
                known[res.task] = res
                if self.store is not None and res.status != Status.INTERNAL_ERROR:
                    self.store.put_result(src_hash, self.gpu_label, self.options.mode, res)
        return [known[t] for t in tasks]

    def _harness_cmd(self) -> Path:
        if self._harness is None:
            self._harness = harness_path(self.gpu.compute_capability)
        return self._harness

    def _spec(self, tasks: Sequence[Task], pdl: bool = False) -> list[str]:
        """The harness's spec lines; `pdl`: the candidate's source spells programmatic dependent launch."""
        o = self.options
        lines = [
            f"seed {int.from_bytes(os.urandom(8), 'little')}",  # secret per run: inputs cannot be predicted
            f"mode {o.mode.method.value}", f"checks {int(o.checks)}", f"baselines {int(o.baselines)}",
            f"warmup_ms {o.warmup_ms}", f"target_ms {o.target_ms}", f"min_reps {o.min_reps}",
            f"max_reps {o.max_reps}", f"qps {o.target_qps}", f"tol_fp32 {o.tol_fp32}", f"tol_fp16 {o.tol_fp16}",
            f"pdl {int(pdl)}",
        ]
        for t in tasks:
            algo = self.store.get_algo(t, self.gpu_label, CUBLASLT_AUTOTUNED) if self.store else None
            lines.append(f"task {t.m} {t.n} {t.k} {t.acc.value} {algo or '-'}")
        return lines

    def _run_harness_tasks(self, lib: str, tasks: list[Task], pdl: bool = False) -> list[ShapeResult]:
        try:
            harness = self._harness_cmd()
        except HarnessBuildError as e:
            return [ShapeResult(t, Status.INTERNAL_ERROR, str(e).splitlines()[0]) for t in tasks]
        results, algos = measure([str(harness), lib], tasks, lambda todo: self._spec(todo, pdl), self.gpu.index,
                                 self.options.limits)
        if self.store is not None:
            for task, (algo, median_us) in algos.items():
                self.store.put_algo(task, self.gpu_label, CUBLASLT_AUTOTUNED, algo, median_us)
        return results


def measure(command: list[str], tasks: list[Task], spec: Callable[[list[Task]], list[str]], gpu_index: int | None,
            limits: RunLimits) -> tuple[list[ShapeResult], dict[Task, tuple[str, float]]]:
    """Run the harness `command` over `tasks` until each has a result: a crash or hang costs the task it happened
    in, and the harness is restarted on the rest. Also returns the cuBLASLt autotuned winners it reported."""
    results: dict[Task, ShapeResult] = {}
    algos: dict[Task, tuple[str, float]] = {}
    pending = list(tasks)
    while pending:
        run = run_harness(command, spec(pending), gpu_index=gpu_index, limits=limits)
        rest = _absorb(run, pending, results, algos)
        if len(rest) == len(pending):  # no progress: never loop on a harness that dies the same way
            status, why = _death(run)
            results[pending[0]] = ShapeResult(pending[0], status, why)
            rest = pending[1:]
        pending = rest
    return [results[t] for t in tasks], algos


def _absorb(run: HarnessRun, pending: list[Task], results: dict[Task, ShapeResult],
            algos: dict[Task, tuple[str, float]]) -> list[Task]:
    """Take what one harness run reported; return the tasks still to run (after a crash or hang)."""
    if run.forged_lines:
        why = f"{run.forged_lines} line(s) without the run's nonce appeared on the harness's result channel"
        for t in pending:
            results[t] = ShapeResult(t, Status.REJECTED_BEHAVIOUR, why)
        return []
    reports = Counter((e["m"], e["n"], e["k"]) for e in run.task_events())
    if any(n > 1 for n in reports.values()):  # the harness reports each task once; a second is forged
        for t in pending:
            results[t] = ShapeResult(t, Status.REJECTED_BEHAVIOUR, "two reports for one task on the result channel")
        return []
    notes = _sandbox_notes(run)
    fatal = [e for e in run.events if e.get("event") == "fatal"]
    if fatal:
        for t in pending:
            results[t] = ShapeResult(t, Status.INTERNAL_ERROR, str(fatal[0].get("reason")), notes=notes)
        return []
    by_shape = {(e["m"], e["n"], e["k"]): e for e in run.task_events()}
    begun = [(e["m"], e["n"], e["k"]) for e in run.events if e.get("event") == "begin"]
    for i, t in enumerate(pending):
        ev = by_shape.get((t.m, t.n, t.k))
        if ev is not None:
            results[t] = shape_from_event(t, ev, notes)
            algo, auto = ev.get("algo_hex"), results[t].timings.get("cublaslt_autotuned")
            if algo and algo != "-" and auto is not None:
                algos[t] = (algo, auto.median_us)
            continue
        if run.done:  # a finished harness that skipped a task is our bug, not the candidate's
            results[t] = ShapeResult(t, Status.INTERNAL_ERROR, "harness finished without reporting this task")
            continue
        # The harness died. The task it had begun is the culprit; if it died before any task began
        # (e.g. in the candidate's library constructor), every pending task shares the failure.
        if begun and (t.m, t.n, t.k) != begun[-1]:
            return pending[i:]
        status, why = _death(run)
        results[t] = ShapeResult(t, status, why, notes=notes)
        if begun:
            return [u for u in pending[i + 1:] if u not in results]
    return []


def shape_from_event(task: Task, ev: dict, notes: tuple[str, ...]) -> ShapeResult:
    """A harness "task" event as a ShapeResult, after the roofline plausibility gate."""
    timings = {k: Timing(**v) for k, v in (ev.get("timings") or {}).items()}
    status, reason = Status(ev["status"]), ev.get("reason", "")
    cand = timings.get("candidate")
    if status == Status.OK and cand is not None and cand.median_us < task.flops / ROOFLINE_FLOPS_PER_S * 1e6:
        status = Status.REJECTED_BEHAVIOUR
        reason = (f"measured {cand.median_us:.3g} us, faster than any GPU can do {task.flops:.3g} FLOP "
                  f"({ROOFLINE_FLOPS_PER_S / 1e12:.0f} TFLOP/s ceiling): the timing was fooled")
    if status == Status.OK and not reason:
        reason = "correct and timed" if cand is not None else "timed"
    return ShapeResult(task, status, reason, max_rel_err=ev.get("max_rel_err"), timings=timings,
                       graph=ev.get("graph"), checks=tuple(ev.get("checks") or ()), notes=notes,
                       paired=paired_from_json(ev.get("paired")))


def _sandbox_notes(run: HarnessRun) -> tuple[str, ...]:
    start = next((e for e in run.events if e.get("event") == "start"), None)
    if start is None:
        return ()
    return tuple(f"sandbox {k} {v}" for k, v in (start.get("sandbox") or {}).items() if str(v).startswith("off"))


def _death(run: HarnessRun) -> tuple[Status, str]:
    """Status and one-line reason for a harness process that ended without finishing its report."""
    tail = run.stderr.strip().splitlines()[-1][:200] if run.stderr.strip() else ""
    suffix = f" (stderr: {tail})" if tail else ""
    if run.timed_out:
        phase = "while loading" if run.timeout_phase == "start" else "on this shape"
        return Status.TIMEOUT, f"killed after exceeding the time limit {phase} (hang or infinite loop?){suffix}"
    code = run.exit_code
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return Status.RUNTIME_ERROR, f"the process was killed by {name}{suffix}"
    if code == 0:
        return Status.RUNTIME_ERROR, f"the process exited with status 0 before reporting (exit() called?){suffix}"
    return Status.RUNTIME_ERROR, f"the process exited with status {code} before reporting{suffix}"
