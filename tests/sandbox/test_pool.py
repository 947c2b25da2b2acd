"""The pool on the CPU, one suite for both backends: real compiles (nvcc; as Ray tasks for the ray backend), the GPU
stage simulated in real worker processes or Ray actors (tests/sandbox/pool_fakes.py), faults injected. Every job must
be answered exactly once. Scheduler-only behaviour (backpressure, fairness, the async API) does not depend on the
backend and is tested on the local one; Ray-only mechanics (artifacts by content hash) are in test_pool_ray.py."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from cudal2.sandbox.evaluator import EvalOptions
from cudal2.sandbox.pool import Backend, JobOutcome, PoolConfig, RunnerSpec, SandboxPool
from cudal2.sandbox.types import Status, Task
from tests.sandbox.pool_fakes import kernel

pytestmark = pytest.mark.nvcc

ROOT = Path(__file__).resolve().parents[2]
TASKS = (Task(64, 64, 64), Task(128, 256, 512))
FAKE = RunnerSpec("tests.sandbox.pool_fakes:fake_runner")


@dataclass
class Kind:
    """How a test builds a pool of one backend and kills one of its workers."""

    backend: Backend
    log: Path  # where the fake GPU stage records each run

    def config(self, build_dir: Path, workers: int = 2, **kw) -> PoolConfig:
        base = PoolConfig(compile_workers=2, db_path="", job_timeout_s=20,
                          eval=EvalOptions(cache_dir=build_dir, compile_timeout_s=60))
        if self.backend == Backend.RAY:  # simulated GPUs: the custom resource "gpu_slot"
            base = replace(base, backend=Backend.RAY, ray_gpus=workers,
                           ray_slot_resource="gpu_slot" if workers else "no_such_slot")
        else:
            base = replace(base, gpus=tuple(range(workers)))
        return replace(base, **kw)

    def kill(self, pool: SandboxPool, slot: int) -> None:
        if self.backend == Backend.RAY:
            import ray

            ray.kill(pool.workers.actors[slot])
        else:
            os.kill(pool.workers.pid(slot), 9)


def start_ray(log: Path) -> None:
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    # 2 CPUs, 2 simulated GPU slots; the fake runner's log path reaches the actors through the job's environment.
    ray.init(num_cpus=2, object_store_memory=256 << 20, include_dashboard=False, resources={"gpu_slot": 2},
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "CUDAL2_FAKE_LOG": str(log)}})


@pytest.fixture(scope="module", params=[Backend.LOCAL, Backend.RAY], ids=["local", "ray"])
def kind(request, tmp_path_factory):
    log = tmp_path_factory.mktemp(request.param.value) / "fake.log"
    before = os.environ.get("CUDAL2_FAKE_LOG")
    os.environ["CUDAL2_FAKE_LOG"] = str(log)  # inherited by spawned local workers
    if request.param == Backend.RAY:
        start_ray(log)
    yield Kind(request.param, log)
    if request.param == Backend.RAY:
        import ray

        ray.shutdown()
    if before is None:
        os.environ.pop("CUDAL2_FAKE_LOG", None)
    else:
        os.environ["CUDAL2_FAKE_LOG"] = before


@pytest.fixture
def fake_log(kind):
    kind.log.unlink(missing_ok=True)
    return kind.log


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("build")


def runs(log) -> list[str]:
    return log.read_text().split()[::2] if log.exists() else []


def wait_until(cond, timeout=60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)


# ------------------------------------------------------------------------------------------- both backends


def test_every_job_answered_once_in_order(kind, build_dir, fake_log):
    sources = [kernel(f"{kind.backend.value}{i}") for i in range(6)]
    with SandboxPool(kind.config(build_dir), FAKE) as pool:
        assert pool.workers.size == 2
        results = pool.map(sources, TASKS)
        stats = pool.stats()
    assert [r.shapes[0].status for r in results] == [Status.OK] * 6
    assert [r.source_hash for r in results] == [hashlib.sha256(s.encode()).hexdigest() for s in sources]
    assert sorted(runs(fake_log)) == sorted(r.source_hash for r in results)  # each ran exactly once
    assert stats.backend == kind.backend.value and stats.jobs == 6 and stats.evaluations == 12
    assert stats.outcomes == {"done": 6} and len(stats.gpu_busy) == 2 and stats.compile_s["p50"] > 0


def test_identical_jobs_in_flight_are_deduplicated(kind, build_dir, fake_log):
    src = kernel(f"{kind.backend.value}-dup", "// fake: sleep 1")
    with SandboxPool(kind.config(build_dir), FAKE) as pool:
        a, b = pool.submit(src, TASKS, "trainer"), pool.submit(src, TASKS, "sampler")
        assert a.result(timeout=60) is b.result(timeout=60)
        outcomes = sorted(r.outcome.value for r in pool.records())
    assert outcomes == ["deduplicated", "done"]
    assert len(runs(fake_log)) == 1


def test_rejections_never_reach_a_gpu_worker(kind, build_dir, fake_log):
    bad_static = kernel(f"{kind.backend.value}-static") + "\nstatic int x = (fork(), 0);\n"
    bad_compile = kernel(f"{kind.backend.value}-compile").replace("return cudaGetLastError",
                                                                  "return no_such_symbol + cudaGetLastError")
    with SandboxPool(kind.config(build_dir), FAKE) as pool:
        res = pool.map([bad_static, bad_compile], TASKS)
        assert pool.stats().run_s == {}
    assert [r.shapes[0].status for r in res] == [Status.STATIC_REJECT, Status.COMPILE_ERROR]
    assert runs(fake_log) == []


def test_worker_killed_mid_job_is_replaced_and_job_retried(kind, build_dir, fake_log):
    with SandboxPool(kind.config(build_dir, workers=1), FAKE) as pool:
        fut = pool.submit(kernel(f"{kind.backend.value}-slow", "// fake: sleep 3"), TASKS)
        first = pool.workers.pid(0)
        wait_until(lambda: pool.stats().running > 0)
        time.sleep(0.5)  # inside the fake GPU stage now
        kind.kill(pool, 0)
        res = fut.result(timeout=60)
        rec = pool.records()[0]
        assert pool.stats().worker_restarts == 1
        assert pool.workers.pid(0) not in (None, first)
    assert res.shapes[0].status == Status.OK
    assert rec.attempts == 2 and rec.outcome == JobOutcome.DONE
    assert len(runs(fake_log)) == 2  # the killed run and the retry


def test_hung_job_is_bounded_and_pool_keeps_working(kind, build_dir, fake_log):
    with SandboxPool(kind.config(build_dir, workers=1, job_timeout_s=1.5, retries=1), FAKE) as pool:
        hung = pool.submit(kernel(f"{kind.backend.value}-hang", "// fake: hang"), TASKS)
        after = pool.submit(kernel(f"{kind.backend.value}-after-hang"), TASKS)
        res = hung.result(timeout=90)
        assert all(s.status == Status.INTERNAL_ERROR for s in res.shapes)
        assert "exceeded" in res.shapes[0].reason
        assert after.result(timeout=60).shapes[0].status == Status.OK
        assert pool.stats().worker_restarts == 2  # first try and one retry


def test_dying_worker_twice_gives_internal_error_not_a_lost_job(kind, build_dir, fake_log):
    with SandboxPool(kind.config(build_dir), FAKE) as pool:
        res = pool.submit(kernel(f"{kind.backend.value}-die", "// fake: die"), TASKS).result(timeout=90)
        rec = pool.records()[0]
    assert rec.outcome == JobOutcome.WORKER_LOST and rec.attempts == 2
    assert all(s.status == Status.INTERNAL_ERROR and "died" in s.reason for s in res.shapes)


def test_shutdown_without_wait_answers_every_pending_job(kind, build_dir, fake_log):
    pool = SandboxPool(kind.config(build_dir, workers=1, compile_workers=1, gpu_queue=1), FAKE)
    futures = [pool.submit(kernel(f"{kind.backend.value}-sd{i}", "// fake: sleep 0.5"), TASKS) for i in range(5)]
    time.sleep(0.5)
    pool.shutdown(wait=False)
    statuses = [f.result(timeout=60).shapes[0].status for f in futures]
    assert all(s in (Status.OK, Status.INTERNAL_ERROR) for s in statuses)
    assert Status.INTERNAL_ERROR in statuses
    outcomes = {r.outcome for r in pool.records()}
    assert JobOutcome.SHUT_DOWN in outcomes and len(pool.records()) == 5


def test_pool_without_gpus_says_so(kind, build_dir):
    with SandboxPool(kind.config(build_dir, workers=0), FAKE) as pool:
        assert pool.workers.size == 0
        res = pool.submit(kernel(f"{kind.backend.value}-nogpu"), TASKS).result(timeout=60)
    assert res.shapes[0].status == Status.NO_GPU


def test_stats_render_mentions_every_figure(kind, build_dir, fake_log):
    with SandboxPool(kind.config(build_dir), FAKE) as pool:
        pool.map([kernel(f"{kind.backend.value}-stats")], TASKS)
        text = pool.stats().render()
    for word in (f"backend {kind.backend.value}", "queue", "per minute", "GPU busy", "compile s", "statuses: ok 2"):
        assert word in text


# --------------------------------------------------------------------- the scheduler (backend-independent)


@pytest.fixture
def local(tmp_path, monkeypatch):
    log = tmp_path / "fake.log"
    monkeypatch.setenv("CUDAL2_FAKE_LOG", str(log))
    return Kind(Backend.LOCAL, log)


def test_backpressure_blocks_submit(local, build_dir):
    with SandboxPool(local.config(build_dir, workers=1, max_pending=2), FAKE) as pool:
        pool.submit(kernel("bp1", "// fake: sleep 2"), TASKS)
        pool.submit(kernel("bp2", "// fake: sleep 2"), TASKS)
        with pytest.raises(TimeoutError):
            pool.submit(kernel("bp3"), TASKS, timeout=0.3)


def test_more_jobs_than_max_pending_all_answered(local, build_dir):
    # submit() without a timeout blocks until a job finishes, then goes on: nothing is refused or lost
    with SandboxPool(local.config(build_dir, workers=1, max_pending=2), FAKE) as pool:
        results = pool.map([kernel(f"many{i}") for i in range(5)], TASKS)
    assert [r.shapes[0].status for r in results] == [Status.OK] * 5


def test_callers_are_served_round_robin(local, build_dir):
    with SandboxPool(local.config(build_dir, workers=1, compile_workers=1, gpu_queue=1), FAKE) as pool:
        many = [pool.submit(kernel(f"a{i}", "// fake: sleep 0.2"), TASKS, "trainer") for i in range(6)]
        few = [pool.submit(kernel(f"b{i}", "// fake: sleep 0.2"), TASKS, "sampler") for i in range(2)]
        for f in many + few:
            f.result(timeout=120)
        order = [r.caller for r in pool.records()]
    assert order.index("sampler") < 4 and max(i for i, c in enumerate(order) if c == "sampler") < 6


def test_async_evaluate_for_reward_functions(local, build_dir):
    async def main(pool):
        return await asyncio.gather(*(pool.evaluate(kernel(f"async{i}"), TASKS) for i in range(3)))

    with SandboxPool(local.config(build_dir), FAKE) as pool:
        results = asyncio.run(main(pool))
    assert all(r.shapes[0].status == Status.OK for r in results)
