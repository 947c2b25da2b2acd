"""The local pool on the CPU: real compiles (nvcc), the GPU stage simulated in real worker processes
(tests/sandbox/pool_fakes.py), faults injected. Every job must be answered exactly once."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace

import pytest

from cudal2.sandbox.evaluator import EvalOptions
from cudal2.sandbox.pool import JobOutcome, PoolConfig, RunnerSpec, SandboxPool
from cudal2.sandbox.types import Status, Task
from tests.sandbox.pool_fakes import kernel

pytestmark = pytest.mark.nvcc

TASKS = (Task(64, 64, 64), Task(128, 256, 512))
FAKE = RunnerSpec("tests.sandbox.pool_fakes:fake_runner")


@pytest.fixture
def fake_log(tmp_path, monkeypatch):
    log = tmp_path / "fake.log"
    monkeypatch.setenv("CUDAL2_FAKE_LOG", str(log))  # inherited by the spawned worker processes
    return log


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("build")


def config(build_dir, **kw) -> PoolConfig:
    base = PoolConfig(gpus=(0, 1), compile_workers=2, db_path="", job_timeout_s=20,
                      eval=EvalOptions(cache_dir=build_dir, compile_timeout_s=60))
    return replace(base, **kw)


def runs(log) -> list[str]:
    return log.read_text().split()[::2] if log.exists() else []


def test_every_job_answered_once_in_order(build_dir, fake_log):
    sources = [kernel(i) for i in range(6)]
    with SandboxPool(config(build_dir), FAKE) as pool:
        results = pool.map(sources, TASKS)
        stats = pool.stats()
    assert [r.shapes[0].status for r in results] == [Status.OK] * 6
    assert [r.source_hash for r in results] == [r.source_hash for r in results]  # order kept
    assert sorted(runs(fake_log)) == sorted(r.source_hash for r in results)  # each ran exactly once
    assert stats.jobs == 6 and stats.evaluations == 12 and stats.outcomes == {"done": 6}
    assert len(stats.gpu_busy) == 2 and stats.compile_s["p50"] > 0


def test_identical_jobs_in_flight_are_deduplicated(build_dir, fake_log):
    src = kernel("dup", "// fake: sleep 1")
    with SandboxPool(config(build_dir), FAKE) as pool:
        a, b = pool.submit(src, TASKS, "trainer"), pool.submit(src, TASKS, "sampler")
        assert a.result(timeout=60) is b.result(timeout=60)
        outcomes = sorted(r.outcome.value for r in pool.records())
    assert outcomes == ["deduplicated", "done"]
    assert len(runs(fake_log)) == 1


def test_rejections_never_reach_a_gpu_worker(build_dir, fake_log):
    bad_static = kernel("static") + "\nstatic int x = (fork(), 0);\n"
    bad_compile = kernel("compile").replace("return cudaGetLastError", "return no_such_symbol + cudaGetLastError")
    with SandboxPool(config(build_dir), FAKE) as pool:
        res = pool.map([bad_static, bad_compile], TASKS)
    assert [r.shapes[0].status for r in res] == [Status.STATIC_REJECT, Status.COMPILE_ERROR]
    assert runs(fake_log) == []


def test_worker_killed_mid_job_is_replaced_and_job_retried(build_dir, fake_log):
    with SandboxPool(config(build_dir, gpus=(0,)), FAKE) as pool:
        fut = pool.submit(kernel("slow", "// fake: sleep 3"), TASKS)
        deadline = time.monotonic() + 60
        while pool.stats().running == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # inside the fake GPU stage now
        os.kill(pool.workers.pid(0), 9)
        res = fut.result(timeout=60)
        rec = pool.records()[0]
        assert pool.stats().worker_restarts == 1
    assert res.shapes[0].status == Status.OK
    assert rec.attempts == 2 and rec.outcome == JobOutcome.DONE


def test_hung_job_is_bounded_and_pool_keeps_working(build_dir, fake_log):
    with SandboxPool(config(build_dir, gpus=(0,), job_timeout_s=1.5, retries=1), FAKE) as pool:
        hung = pool.submit(kernel("hang", "// fake: hang"), TASKS)
        after = pool.submit(kernel("after-hang"), TASKS)
        res = hung.result(timeout=60)
        assert all(s.status == Status.INTERNAL_ERROR for s in res.shapes)
        assert "exceeded" in res.shapes[0].reason
        assert after.result(timeout=60).shapes[0].status == Status.OK
        assert pool.stats().worker_restarts == 2  # first try and one retry


def test_dying_worker_twice_gives_internal_error_not_a_lost_job(build_dir, fake_log):
    with SandboxPool(config(build_dir), FAKE) as pool:
        res = pool.submit(kernel("die", "// fake: die"), TASKS).result(timeout=60)
        rec = pool.records()[0]
    assert rec.outcome == JobOutcome.WORKER_LOST and rec.attempts == 2
    assert all(s.status == Status.INTERNAL_ERROR and "died" in s.reason for s in res.shapes)


def test_backpressure_blocks_submit(build_dir, fake_log):
    with SandboxPool(config(build_dir, gpus=(0,), max_pending=2), FAKE) as pool:
        pool.submit(kernel("bp1", "// fake: sleep 2"), TASKS)
        pool.submit(kernel("bp2", "// fake: sleep 2"), TASKS)
        with pytest.raises(TimeoutError):
            pool.submit(kernel("bp3"), TASKS, timeout=0.3)


def test_more_jobs_than_max_pending_all_answered(build_dir, fake_log):
    # submit() without a timeout blocks until a job finishes, then goes on: nothing is refused or lost
    with SandboxPool(config(build_dir, gpus=(0,), max_pending=2), FAKE) as pool:
        results = pool.map([kernel(f"many{i}") for i in range(5)], TASKS)
    assert [r.shapes[0].status for r in results] == [Status.OK] * 5


def test_callers_are_served_round_robin(build_dir, fake_log):
    with SandboxPool(config(build_dir, gpus=(0,), compile_workers=1, gpu_queue=1), FAKE) as pool:
        many = [pool.submit(kernel(f"a{i}", "// fake: sleep 0.2"), TASKS, "trainer") for i in range(6)]
        few = [pool.submit(kernel(f"b{i}", "// fake: sleep 0.2"), TASKS, "sampler") for i in range(2)]
        for f in many + few:
            f.result(timeout=120)
        order = [r.caller for r in pool.records()]
    assert order.index("sampler") < 4 and max(i for i, c in enumerate(order) if c == "sampler") < 6


def test_async_evaluate_for_reward_functions(build_dir, fake_log):
    async def main(pool):
        return await asyncio.gather(*(pool.evaluate(kernel(f"async{i}"), TASKS) for i in range(3)))

    with SandboxPool(config(build_dir), FAKE) as pool:
        results = asyncio.run(main(pool))
    assert all(r.shapes[0].status == Status.OK for r in results)


def test_shutdown_without_wait_answers_every_pending_job(build_dir, fake_log):
    pool = SandboxPool(config(build_dir, gpus=(0,), compile_workers=1, gpu_queue=1), FAKE)
    futures = [pool.submit(kernel(f"sd{i}", "// fake: sleep 0.5"), TASKS) for i in range(5)]
    time.sleep(0.5)
    pool.shutdown(wait=False)
    statuses = [f.result(timeout=60).shapes[0].status for f in futures]
    assert all(s in (Status.OK, Status.INTERNAL_ERROR) for s in statuses)
    assert Status.INTERNAL_ERROR in statuses
    outcomes = {r.outcome for r in pool.records()}
    assert JobOutcome.SHUT_DOWN in outcomes and len(pool.records()) == 5


def test_pool_without_gpus_says_so(build_dir):
    with SandboxPool(config(build_dir, gpus=()), FAKE) as pool:
        res = pool.submit(kernel("nogpu"), TASKS).result(timeout=60)
    assert res.shapes[0].status == Status.NO_GPU


def test_stats_render_mentions_every_figure(build_dir, fake_log):
    with SandboxPool(config(build_dir), FAKE) as pool:
        pool.map([kernel("stats")], TASKS)
        text = pool.stats().render()
    for word in ("queue", "per minute", "GPU busy", "compile s", "statuses: ok 2"):
        assert word in text
