"""Records that cross the pool's boundaries: its configuration, the jobs and the statistics it reports."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from enum import Enum

from cudal2.sandbox.evaluator import EvalOptions


class Backend(str, Enum):
    """Where the GPU stage runs. local: worker processes on this machine (no Ray needed). ray: one actor per GPU
    across a Ray cluster, compiles as CPU tasks on any node."""

    LOCAL = "local"
    RAY = "ray"


@dataclass(frozen=True)
class PoolConfig:
    """One pool, either backend. Field comments give units."""

    backend: Backend = Backend.LOCAL
    gpus: tuple[int, ...] | None = None  # local: GPU indices, one worker each; None = every visible GPU
    ray_gpus: int = 0  # ray: GPU actors to start (0 = one per GPU in the cluster)
    ray_address: str | None = None  # ray: "auto", an address, or None for a local Ray instance
    ray_slot_resource: str = "GPU"  # ray: resource one actor holds; tests simulate GPUs with a custom resource
    compile_workers: int = 0  # concurrent compiles; 0 = CPU cores
    max_pending: int = 256  # jobs accepted and not finished; submit() blocks beyond this (backpressure)
    gpu_queue: int = 2  # compiled jobs waiting per GPU worker: how far compilation runs ahead
    job_timeout_s: float = 1800.0  # one job on one GPU worker longer than this: the worker is hung, replaced
    retries: int = 1  # a job whose worker died or hung is retried this often on another worker
    db_path: str | None = None  # result store; None = the default path, "" = no store
    eval: EvalOptions = field(default_factory=EvalOptions)


class JobOutcome(str, Enum):
    """How a job left the pool. The candidate's own statuses are inside its EvalResult."""

    DONE = "done"  # evaluated (whatever the candidate's statuses)
    DEDUPLICATED = "deduplicated"  # answered by an identical job in flight
    WORKER_LOST = "worker_lost"  # its worker died or hung more than `retries` times: internal_error results
    SHUT_DOWN = "shut_down"  # the pool was shut down before the job ran: internal_error results


@dataclass(frozen=True)
class JobRecord:
    """What the pool measured about one job (seconds)."""

    job_id: int
    caller: str
    outcome: JobOutcome
    attempts: int  # GPU runs started (0: decided in the compile stage)
    queued_s: float  # submit -> compile start
    compile_s: float  # compile stage (0 when deduplicated)
    run_s: float  # GPU stage
    statuses: tuple[str, ...]  # per-shape statuses


def _quantiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    xs = sorted(xs)
    pick = lambda f: xs[min(len(xs) - 1, int(f * (len(xs) - 1) + 0.5))]  # noqa: E731
    return {"p50": pick(0.5), "p90": pick(0.9), "max": xs[-1], "mean": statistics.fmean(xs)}


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of the pool. Times in seconds."""

    backend: str
    workers: int
    uptime_s: float
    pending: int  # accepted, not finished
    compiling: int
    waiting_gpu: int
    running: int
    jobs: int  # finished jobs
    evaluations: int  # finished (candidate, shape) pairs
    outcomes: dict[str, int]
    statuses: dict[str, int]  # per-shape statuses of finished jobs
    compile_s: dict[str, float]
    run_s: dict[str, float]
    gpu_busy: tuple[float, ...]  # per worker: busy time / uptime
    worker_restarts: int

    @property
    def evaluations_per_min(self) -> float:
        return 60.0 * self.evaluations / self.uptime_s if self.uptime_s > 0 else 0.0

    def render(self) -> str:
        lines = [
            f"backend {self.backend}, {self.workers} GPU worker(s), up {self.uptime_s:.0f} s, "
            f"{self.worker_restarts} worker restart(s)",
            f"queue: {self.pending} pending ({self.compiling} compiling, {self.waiting_gpu} waiting for a GPU, "
            f"{self.running} running)",
            f"finished: {self.jobs} jobs, {self.evaluations} evaluations, {self.evaluations_per_min:.1f} per minute",
            "outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items())),
            "statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items())),
            "compile s: " + ", ".join(f"{k} {v:.2f}" for k, v in self.compile_s.items()),
            "run s: " + ", ".join(f"{k} {v:.2f}" for k, v in self.run_s.items()),
            "GPU busy: " + ", ".join(f"{b:.0%}" for b in self.gpu_busy),
        ]
        return "\n".join(lines)


def summarize(records: list[JobRecord], **snapshot) -> PoolStats:
    outcomes: dict[str, int] = {}
    statuses: dict[str, int] = {}
    for r in records:
        outcomes[r.outcome.value] = outcomes.get(r.outcome.value, 0) + 1
        for s in r.statuses:
            statuses[s] = statuses.get(s, 0) + 1
    ran = [r for r in records if r.outcome == JobOutcome.DONE]
    return PoolStats(
        jobs=len(records),
        evaluations=sum(len(r.statuses) for r in records),
        outcomes=outcomes,
        statuses=statuses,
        compile_s=_quantiles([r.compile_s for r in ran]),
        run_s=_quantiles([r.run_s for r in ran if r.run_s > 0]),
        **snapshot,
    )
