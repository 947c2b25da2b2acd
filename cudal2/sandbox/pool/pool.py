"""SandboxPool: many candidates through the evaluator, compiles running ahead of the GPUs.

    submit(source, tasks, caller)
      │  identical (source, tasks) already in flight? -> share its future      (deduplication)
      │  more than max_pending unfinished jobs? -> submit blocks                (backpressure)
      ▼
    per-caller FIFO queues ──round robin──► compile stage (CPU, ≤ compile_workers at once, never more than
      (fairness between callers)            gpu_queue jobs per GPU waiting)   static rules, nvcc, link check
                                              │ final (rejected, compile error, compile-only) ──► future
                                              ▼
                                            GPU queue ──► one supervisor thread per GPU worker ──► run ──► future
                                                          (store lookup, harness; a worker that dies or hangs
                                                           is replaced and the job retried `retries` times)

Every future resolves to an EvalResult exactly once; a job never raises to its caller and never disappears:
pool failures become internal_error results with the reason (see JobOutcome).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, as_completed
from dataclasses import dataclass, field

from cudal2.sandbox.evaluator import Prepared, source_hash
from cudal2.sandbox.gpu import DEFAULT_ARCH, detect_gpu, visible_gpus
from cudal2.sandbox.pool.local import LocalCompiler, LocalGpuWorkers, RunnerSpec, WorkerLost
from cudal2.sandbox.pool.types import Backend, JobOutcome, JobRecord, PoolConfig, PoolStats, summarize
from cudal2.sandbox.types import EVALUATOR_VERSION, EvalResult, ShapeResult, Status, Task

__all__ = ["PoolClosed", "SandboxPool", "as_completed"]


class PoolClosed(RuntimeError):
    """submit() after shutdown()."""


@dataclass
class _Job:
    id: int
    caller: str
    source: str
    tasks: tuple[Task, ...]
    key: tuple
    future: Future
    submitted: float
    followers: list[Future] = field(default_factory=list)
    attempts: int = 0  # GPU runs started
    compile_start: float = 0.0
    compile_s: float = 0.0
    run_s: float = 0.0
    prepared: Prepared | None = None


def _uniform_result(src_hash: str, tasks: Sequence[Task], gpu: str, status: Status, reason: str,
                    prepared: Prepared | None = None) -> EvalResult:
    comp = prepared.compile if prepared else None
    return EvalResult(src_hash, gpu, EVALUATOR_VERSION, comp, tuple(ShapeResult(t, status, reason) for t in tasks))


class SandboxPool:
    """See the module docstring. Use as a context manager, or call shutdown()."""

    def __init__(self, config: PoolConfig | None = None, runner: RunnerSpec | None = None):
        self.config = config or PoolConfig()
        runner = runner or RunnerSpec()
        gpus = self.config.gpus if self.config.gpus is not None else tuple(g.index for g in visible_gpus())
        first = detect_gpu(gpus[0]) if gpus else None
        arch = self.config.eval.arch or (first.arch if first else DEFAULT_ARCH)
        if self.config.backend == Backend.RAY:
            from cudal2.sandbox.pool.ray_backend import RayCompiler, RayGpuWorkers  # optional dependency

            self.compiler = RayCompiler(self.config, arch)
            self.workers = RayGpuWorkers(self.config, runner)
        else:
            self.compiler = LocalCompiler(self.config, arch)
            self.workers = LocalGpuWorkers(self.config, gpus, runner)
        self._cv = threading.Condition()
        self._queues: OrderedDict[str, deque[_Job]] = OrderedDict()
        self._inflight: dict[tuple, _Job] = {}
        self._gpu_q: deque[_Job] = deque()
        self._ids = itertools.count(1)
        self._slots = threading.BoundedSemaphore(self.config.max_pending)
        self._compiling = self._running = 0
        self._records: list[JobRecord] = []
        self._busy = [0.0] * self.workers.size
        self._restarts = 0
        self._closing = False
        self._started = time.monotonic()
        self._threads = [threading.Thread(target=self._dispatch, name="cudal2-dispatch", daemon=True)]
        self._threads += [threading.Thread(target=self._supervise, args=(slot,), name=f"cudal2-slot{slot}", daemon=True)
                          for slot in range(self.workers.size)]
        for t in self._threads:
            t.start()

    # -------------------------------------------------------------------------------------------- public API
    def submit(self, source: str, tasks: Sequence[Task], caller: str = "default", timeout: float | None = None) -> Future:
        """Queue one candidate; the future resolves to its EvalResult. Blocks while max_pending jobs are
        unfinished (raises TimeoutError after `timeout` seconds); raises PoolClosed after shutdown()."""
        tasks = tuple(tasks)
        key = (source_hash(source), tasks)
        with self._cv:
            if self._closing:
                raise PoolClosed("the pool is shut down")
            if key in self._inflight:
                follower: Future = Future()
                self._inflight[key].followers.append(follower)
                return follower
        if not self._slots.acquire(timeout=timeout):  # None: block until a job finishes
            raise TimeoutError(f"pool full: {self.config.max_pending} jobs pending")
        job = _Job(next(self._ids), caller, source, tasks, key, Future(), time.monotonic())
        with self._cv:
            if self._closing:
                self._slots.release()
                raise PoolClosed("the pool is shut down")
            self._inflight[key] = job
            self._queues.setdefault(caller, deque()).append(job)
            self._cv.notify_all()
        return job.future

    def map(self, sources: Iterable[str], tasks: Sequence[Task], caller: str = "default") -> list[EvalResult]:
        """Evaluate many candidates on the same tasks; results in input order."""
        futures = [self.submit(s, tasks, caller) for s in sources]
        return [f.result() for f in futures]

    async def evaluate(self, source: str, tasks: Sequence[Task], caller: str = "default") -> EvalResult:
        """Awaitable form, for async reward functions (TRL gathers them)."""
        future = await asyncio.to_thread(self.submit, source, tasks, caller)
        return await asyncio.wrap_future(future)

    def stats(self) -> PoolStats:
        with self._cv:
            uptime = time.monotonic() - self._started
            queued = sum(len(q) for q in self._queues.values())
            return summarize(
                list(self._records),
                backend=self.config.backend.value,
                workers=self.workers.size,
                uptime_s=uptime,
                pending=queued + self._compiling + len(self._gpu_q) + self._running,
                compiling=self._compiling,
                waiting_gpu=len(self._gpu_q),
                running=self._running,
                gpu_busy=tuple(b / uptime if uptime > 0 else 0.0 for b in self._busy),
                worker_restarts=self._restarts,
            )

    def records(self) -> list[JobRecord]:
        with self._cv:
            return list(self._records)

    def shutdown(self, wait: bool = True) -> None:
        """Stop accepting jobs. wait=True: finish every accepted job first; False: jobs not yet started get
        internal_error results (outcome shut_down); jobs already running finish."""
        with self._cv:
            self._closing = True
            if not wait:
                for q in self._queues.values():
                    while q:
                        self._finish_locked(q.popleft(), None, JobOutcome.SHUT_DOWN, "the pool shut down first")
                while self._gpu_q:
                    self._finish_locked(self._gpu_q.popleft(), None, JobOutcome.SHUT_DOWN, "the pool shut down first")
            self._cv.notify_all()
            while self._inflight:
                self._cv.wait()
        for t in self._threads:
            t.join(timeout=30)
        self.compiler.shutdown()
        self.workers.shutdown()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown(wait=exc[0] is None)

    # -------------------------------------------------------------------------------------------- internals
    def _ahead_limit(self) -> int:
        """Jobs allowed in the compile stage or compiled and waiting: compile runs this far ahead of the GPUs."""
        return self.config.gpu_queue * max(1, self.workers.size)

    def _next_job_locked(self) -> _Job | None:
        for caller in list(self._queues):  # round robin: a served caller moves to the back
            q = self._queues[caller]
            if q:
                self._queues.move_to_end(caller)
                return q.popleft()
        return None

    def _dispatch(self) -> None:
        with self._cv:
            while True:
                while (self._compiling + len(self._gpu_q) < self._ahead_limit()
                       and (job := self._next_job_locked()) is not None):
                    self._compiling += 1
                    job.compile_start = time.monotonic()
                    self.compiler.submit(job.source, job.tasks).add_done_callback(
                        lambda f, job=job: self._compiled(job, f))
                if self._closing and not self._inflight:
                    return
                self._cv.wait()

    def _compiled(self, job: _Job, fut: Future) -> None:
        job.compile_s = time.monotonic() - job.compile_start
        try:
            prepared = fut.result()
        except Exception as e:  # an evaluator bug: the candidate is not to blame
            with self._cv:
                self._compiling -= 1
                self._finish_locked(job, None, JobOutcome.DONE, f"compile stage failed: {e!r}")
            return
        with self._cv:
            self._compiling -= 1
            job.prepared = prepared
            if prepared.final is not None:
                self._finish_locked(job, prepared.final, JobOutcome.DONE)
            elif self.workers.size == 0:
                self._finish_locked(job, _uniform_result(prepared.source_hash, job.tasks, "none", Status.NO_GPU,
                                                         "the pool has no GPU workers", prepared), JobOutcome.DONE)
            else:
                self._gpu_q.append(job)
            self._cv.notify_all()

    def _supervise(self, slot: int) -> None:
        while True:
            with self._cv:
                while not self._gpu_q and not (self._closing and not self._inflight):
                    self._cv.wait()
                if not self._gpu_q:
                    return
                job = self._gpu_q.popleft()
                job.attempts += 1
                self._running += 1
                self._cv.notify_all()  # room ahead: the dispatcher may compile another
            t0 = time.monotonic()
            try:
                result, lost = self.workers.run(slot, job.prepared), None
            except WorkerLost as e:
                result, lost = None, str(e)
            elapsed = time.monotonic() - t0
            if lost:
                self.workers.replace(slot)
            with self._cv:
                self._busy[slot] += elapsed
                self._running -= 1
                job.run_s += elapsed
                if lost is None:
                    self._finish_locked(job, result, JobOutcome.DONE)
                else:
                    self._restarts += 1
                    if job.attempts <= self.config.retries:
                        self._gpu_q.appendleft(job)  # next free worker (the replacement included) takes it
                    else:
                        self._finish_locked(job, None, JobOutcome.WORKER_LOST,
                                            f"GPU worker lost {job.attempts} times: {lost}")
                self._cv.notify_all()

    def _finish_locked(self, job: _Job, result: EvalResult | None, outcome: JobOutcome, why: str = "") -> None:
        if result is None:
            result = _uniform_result(job.key[0], job.tasks, "none", Status.INTERNAL_ERROR, why, job.prepared)
        statuses = tuple(s.status.value for s in result.shapes)
        now = time.monotonic()
        queued = (job.compile_start or now) - job.submitted
        self._records.append(JobRecord(job.id, job.caller, outcome, job.attempts, queued, job.compile_s,
                                       job.run_s, statuses))
        for f in job.followers:
            self._records.append(JobRecord(job.id, job.caller, JobOutcome.DEDUPLICATED, 0, 0.0, 0.0, 0.0, statuses))
            f.set_result(result)
        self._inflight.pop(job.key, None)
        self._slots.release()
        job.future.set_result(result)
