"""A pool of sandbox workers: the one way the trainer, the tuner and `cudal2 sample` evaluate many candidates.

    from cudal2.sandbox.pool import SandboxPool, PoolConfig
    with SandboxPool(PoolConfig()) as pool:
        results = pool.map(sources, tasks)
"""

from cudal2.sandbox.pool.local import RunnerSpec, WorkerLost
from cudal2.sandbox.pool.pool import PoolClosed, SandboxPool, as_completed
from cudal2.sandbox.pool.types import Backend, JobOutcome, JobRecord, PoolConfig, PoolStats

__all__ = ["Backend", "JobOutcome", "JobRecord", "PoolClosed", "PoolConfig", "PoolStats", "RunnerSpec",
           "SandboxPool", "WorkerLost", "as_completed"]
