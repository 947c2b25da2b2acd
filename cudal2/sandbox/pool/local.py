"""The local backend: compiles on a thread pool (nvcc runs as a subprocess, so threads are enough), one worker
process per GPU for the GPU stage. Needs no Ray.

A worker process owns one GPU (its Evaluator pins the harness to that index) and handles one job at a time over a
pipe. The supervisor kills and restarts a worker that dies or exceeds the job deadline; the scheduler retries the
job elsewhere. The candidate itself never runs in the worker: the Evaluator starts a confined harness child per
candidate, so a worker only dies through an evaluator bug or an outside kill.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

from cudal2.sandbox.evaluator import EvalOptions, Evaluator, Prepared
from cudal2.sandbox.pool.types import PoolConfig
from cudal2.sandbox.store import ResultStore
from cudal2.sandbox.types import EvalResult, Task


class WorkerLost(Exception):
    """A GPU worker died or hung while running a job (the job may be retried elsewhere)."""


@dataclass(frozen=True)
class RunnerSpec:
    """What a GPU worker process runs: `module:function(options, gpu_index, db_path)` returning an object with
    `run(prepared) -> EvalResult`. Importable by name so that spawned processes (and Ray actors) can build it."""

    factory: str = "cudal2.sandbox.pool.local:evaluator_runner"

    def build(self, options: EvalOptions, gpu_index: int, db_path: str | None):
        module, name = self.factory.split(":")
        return getattr(importlib.import_module(module), name)(options, gpu_index, db_path)


def open_store(db_path: str | None) -> ResultStore | None:
    return None if db_path == "" else ResultStore(db_path)


def evaluator_runner(options: EvalOptions, gpu_index: int, db_path: str | None) -> Evaluator:
    """The production GPU stage: an Evaluator pinned to one GPU, with its own store connection."""
    return Evaluator(replace(options, gpu_index=gpu_index), open_store(db_path))


def _worker_main(conn, spec: RunnerSpec, options: EvalOptions, gpu_index: int, db_path: str | None) -> None:
    runner = spec.build(options, gpu_index, db_path)
    while True:
        try:
            prepared = conn.recv()
        except EOFError:
            return
        if prepared is None:
            return
        conn.send(runner.run(prepared))


class LocalCompiler:
    """The CPU stage on this machine: prepare() on a thread pool; final outcomes are recorded in the store."""

    def __init__(self, config: PoolConfig, arch: str):
        self.options = replace(config.eval, arch=arch)
        self.db_path = config.db_path
        self.executor = ThreadPoolExecutor(max_workers=config.compile_workers or os.cpu_count() or 1,
                                           thread_name_prefix="cudal2-compile")
        self.local = threading.local()

    def submit(self, source: str, tasks: tuple[Task, ...]) -> Future:
        return self.executor.submit(self._prepare, source, tasks)

    def _prepare(self, source: str, tasks: tuple[Task, ...]) -> Prepared:
        ev = getattr(self.local, "evaluator", None)
        if ev is None:  # one Evaluator (and store connection) per thread: sqlite connections are per thread
            ev = self.local.evaluator = Evaluator(self.options, open_store(self.db_path))
        prepared = ev.prepare(source, tasks)
        if prepared.final is not None:
            ev.run(prepared)  # records rejections and compile errors in the store
        return prepared

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


class LocalGpuWorkers:
    """One worker process per GPU index."""

    def __init__(self, config: PoolConfig, gpus: tuple[int, ...], spec: RunnerSpec):
        self.config, self.gpus, self.spec = config, gpus, spec
        self.ctx = mp.get_context("spawn")  # no inherited threads or CUDA state
        self.procs: list = [None] * len(gpus)
        self.conns: list = [None] * len(gpus)
        for slot in range(len(gpus)):
            self._start(slot)

    @property
    def size(self) -> int:
        return len(self.gpus)

    def _start(self, slot: int) -> None:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker_main, daemon=True, name=f"cudal2-gpu{self.gpus[slot]}",
                                args=(child, self.spec, self.config.eval, self.gpus[slot], self.config.db_path))
        proc.start()
        child.close()
        self.procs[slot], self.conns[slot] = proc, parent

    def pid(self, slot: int) -> int | None:
        return self.procs[slot].pid if self.procs[slot] is not None else None

    def run(self, slot: int, prepared: Prepared) -> EvalResult:
        """Run one job on worker `slot`; WorkerLost if it dies or exceeds the job deadline."""
        conn, proc = self.conns[slot], self.procs[slot]
        try:
            conn.send(prepared)
            if conn.poll(self.config.job_timeout_s):
                return conn.recv()
        except (EOFError, OSError, BrokenPipeError) as e:
            raise WorkerLost(f"GPU worker {self.gpus[slot]} died (exit code {proc.exitcode}): {e!r}") from None
        raise WorkerLost(f"GPU worker {self.gpus[slot]} exceeded the {self.config.job_timeout_s:.0f} s job deadline")

    def replace(self, slot: int) -> None:
        self._stop(slot, force=True)
        self._start(slot)

    def _stop(self, slot: int, force: bool) -> None:
        proc, conn = self.procs[slot], self.conns[slot]
        if proc is None:
            return
        if not force:
            try:
                conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)
        conn.close()
        self.procs[slot] = self.conns[slot] = None

    def shutdown(self) -> None:
        for slot in range(self.size):
            self._stop(slot, force=False)
