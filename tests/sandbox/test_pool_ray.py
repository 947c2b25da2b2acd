"""The Ray pool on the CPU: a local Ray instance with two simulated GPU slots (the custom resource "gpu_slot"),
real compiles (nvcc) as Ray tasks, the GPU stage simulated in real actors (tests/sandbox/pool_fakes.py), faults
injected. The same behaviours as test_pool.py (the local backend): every job is answered exactly once."""

from __future__ import annotations

import hashlib
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from cudal2.sandbox import compiler  # noqa: E402
from cudal2.sandbox.evaluator import EvalOptions, Prepared  # noqa: E402
from cudal2.sandbox.gpu import DEFAULT_ARCH  # noqa: E402
from cudal2.sandbox.pool import Backend, JobOutcome, PoolConfig, RunnerSpec, SandboxPool  # noqa: E402
from cudal2.sandbox.pool.ray_backend import ARTIFACT_DIR, RayPrepared, materialize  # noqa: E402
from cudal2.sandbox.types import CompileResult, EvalResult, ShapeResult, Status, Task  # noqa: E402
from tests.sandbox.pool_fakes import FakeGpuRunner, kernel  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TASKS = (Task(64, 64, 64), Task(128, 256, 512))
FAKE = RunnerSpec("tests.sandbox.pool_fakes:fake_runner")
LIB_CHECK = RunnerSpec("tests.sandbox.test_pool_ray:lib_check_runner")


# ------------------------------------------------------------------------------------ fakes run by the actors


class LibCheckRunner(FakeGpuRunner):
    """The fake GPU stage, plus: the library must be on this node's disk; its path is the reason."""

    def run(self, prepared) -> EvalResult:
        res = super().run(prepared)  # the markers (sleep, ...) and the log
        lib = Path(prepared.compile.lib_path)
        status = Status.OK if lib.is_file() else Status.INTERNAL_ERROR
        return replace(res, shapes=tuple(ShapeResult(t, status, str(lib)) for t in prepared.tasks))


def lib_check_runner(options, gpu_index: int, db_path) -> LibCheckRunner:
    return LibCheckRunner(options, gpu_index, db_path)


# ------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def ray_log(tmp_path_factory):
    """One Ray instance for the module (starting one costs seconds): 2 CPUs, 2 simulated GPU slots. The fake
    runner's log path reaches the actors through the job's environment."""
    log = tmp_path_factory.mktemp("ray") / "fake.log"
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, object_store_memory=256 << 20, include_dashboard=False, resources={"gpu_slot": 2},
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "CUDAL2_FAKE_LOG": str(log)}})
    yield log
    ray.shutdown()


@pytest.fixture
def fake_log(ray_log):
    ray_log.unlink(missing_ok=True)
    return ray_log


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("build")


def config(build_dir, **kw) -> PoolConfig:
    base = PoolConfig(backend=Backend.RAY, ray_slot_resource="gpu_slot", compile_workers=2, db_path="",
                      job_timeout_s=20, eval=EvalOptions(cache_dir=build_dir, compile_timeout_s=60))
    return replace(base, **kw)


def runs(log) -> list[str]:
    return log.read_text().split()[::2] if log.exists() else []


def wait_until(cond, timeout=60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)


# -------------------------------------------------------------------------------------------------- tests


@pytest.mark.nvcc
def test_every_job_answered_once_in_order(build_dir, fake_log):
    sources = [kernel(f"ray{i}") for i in range(6)]
    with SandboxPool(config(build_dir), FAKE) as pool:
        assert pool.workers.size == 2  # every gpu_slot in the cluster
        results = pool.map(sources, TASKS)
        stats = pool.stats()
    assert [r.shapes[0].status for r in results] == [Status.OK] * 6
    assert [r.source_hash for r in results] == [hashlib.sha256(s.encode()).hexdigest() for s in sources]
    assert sorted(runs(fake_log)) == sorted(r.source_hash for r in results)  # each ran exactly once
    assert stats.backend == "ray" and stats.jobs == 6 and stats.evaluations == 12 and stats.outcomes == {"done": 6}
    assert len(stats.gpu_busy) == 2 and stats.compile_s["p50"] > 0
    assert ray.is_initialized()  # the pool leaves a Ray instance it did not start running


@pytest.mark.nvcc
def test_identical_jobs_in_flight_are_deduplicated(build_dir, fake_log):
    src = kernel("ray-dup", "// fake: sleep 1")
    with SandboxPool(config(build_dir), FAKE) as pool:
        a, b = pool.submit(src, TASKS, "trainer"), pool.submit(src, TASKS, "sampler")
        assert a.result(timeout=60) is b.result(timeout=60)
        outcomes = sorted(r.outcome.value for r in pool.records())
    assert outcomes == ["deduplicated", "done"]
    assert len(runs(fake_log)) == 1


@pytest.mark.nvcc
def test_rejections_never_reach_an_actor(build_dir, fake_log):
    bad_static = kernel("ray-static") + "\nstatic int x = (fork(), 0);\n"
    bad_compile = kernel("ray-compile").replace("return cudaGetLastError", "return no_such_symbol + cudaGetLastError")
    with SandboxPool(config(build_dir), FAKE) as pool:
        res = pool.map([bad_static, bad_compile], TASKS)
        assert pool.stats().run_s == {}
    assert [r.shapes[0].status for r in res] == [Status.STATIC_REJECT, Status.COMPILE_ERROR]
    assert runs(fake_log) == []


@pytest.mark.nvcc
def test_actor_killed_mid_job_is_replaced_and_job_retried(build_dir, fake_log):
    with SandboxPool(config(build_dir, ray_gpus=1), FAKE) as pool:
        fut = pool.submit(kernel("ray-slow", "// fake: sleep 3"), TASKS)
        first = pool.workers.pid(0)
        wait_until(lambda: pool.stats().running > 0)
        time.sleep(0.5)  # inside the fake GPU stage now
        ray.kill(pool.workers.actors[0])
        res = fut.result(timeout=60)
        rec = pool.records()[0]
        assert pool.stats().worker_restarts == 1
        assert pool.workers.pid(0) not in (None, first)
    assert res.shapes[0].status == Status.OK
    assert rec.attempts == 2 and rec.outcome == JobOutcome.DONE
    assert len(runs(fake_log)) == 2  # the killed run and the retry


@pytest.mark.nvcc
def test_hung_job_is_bounded_and_pool_keeps_working(build_dir, fake_log):
    with SandboxPool(config(build_dir, ray_gpus=1, job_timeout_s=1.5, retries=1), FAKE) as pool:
        hung = pool.submit(kernel("ray-hang", "// fake: hang"), TASKS)
        after = pool.submit(kernel("ray-after-hang"), TASKS)
        res = hung.result(timeout=90)
        assert all(s.status == Status.INTERNAL_ERROR for s in res.shapes)
        assert "exceeded" in res.shapes[0].reason
        assert after.result(timeout=60).shapes[0].status == Status.OK
        assert pool.stats().worker_restarts == 2  # first try and one retry


@pytest.mark.nvcc
def test_dying_actor_twice_gives_internal_error_not_a_lost_job(build_dir, fake_log):
    with SandboxPool(config(build_dir), FAKE) as pool:
        res = pool.submit(kernel("ray-die", "// fake: die"), TASKS).result(timeout=90)
        rec = pool.records()[0]
    assert rec.outcome == JobOutcome.WORKER_LOST and rec.attempts == 2
    assert all(s.status == Status.INTERNAL_ERROR and "died" in s.reason for s in res.shapes)


@pytest.mark.nvcc
def test_library_travels_by_content_hash(build_dir, fake_log):
    """A library missing from the actor's disk (as on another node) is fetched from the object store."""
    src = kernel("ray-travel")
    key = compiler.compile_source(src, DEFAULT_ARCH, build_dir).key  # the pool's compile is then a quick hit
    with SandboxPool(config(build_dir, ray_gpus=1), LIB_CHECK) as pool:
        busy = pool.submit(kernel("ray-busy", "// fake: sleep 4"), TASKS)
        wait_until(lambda: pool.stats().running > 0)
        fut = pool.submit(src, TASKS)
        wait_until(lambda: pool.stats().waiting_gpu > 0)
        assert pool.stats().waiting_gpu == 1
        shutil.rmtree(build_dir / key[:2] / key)  # compiled, waiting for the GPU: now gone from "this node"
        res = fut.result(timeout=60)
        assert busy.result(timeout=60).shapes[0].status == Status.OK
    lib = Path(res.shapes[0].reason)
    assert res.shapes[0].status == Status.OK, res.shapes[0].reason
    assert lib.parent.parent.name == ARTIFACT_DIR and lib.is_relative_to(build_dir)
    assert hashlib.sha256(lib.read_bytes()).hexdigest() == lib.stem
    assert res.compile is not None and res.compile.key == key


def test_materialize_verifies_the_content_hash(ray_log, tmp_path):
    data = b"\x7fELF pretend library"
    sha = hashlib.sha256(data).hexdigest()
    comp = CompileResult(Status.COMPILED, "compiled", "k" * 64, DEFAULT_ARCH, str(tmp_path / "elsewhere.so"), 1.0,
                         False, "")
    prepared = RayPrepared("src", "h", TASKS, comp, None, lib_sha256=sha, lib_ref=ray.put(data))
    local = materialize(prepared, tmp_path / "cache")
    assert type(local) is Prepared and Path(local.compile.lib_path).read_bytes() == data
    assert local.compile.lib_path == str((tmp_path / "cache").resolve() / ARTIFACT_DIR / sha[:2] / f"{sha}.so")
    assert materialize(prepared, tmp_path / "cache").compile.lib_path == local.compile.lib_path  # a hit
    forged = replace(prepared, lib_sha256=hashlib.sha256(b"other").hexdigest())
    with pytest.raises(RuntimeError, match="sha256"):
        materialize(forged, tmp_path / "cache2")


@pytest.mark.nvcc
def test_shutdown_without_wait_answers_every_pending_job(build_dir, fake_log):
    pool = SandboxPool(config(build_dir, ray_gpus=1, compile_workers=1, gpu_queue=1), FAKE)
    futures = [pool.submit(kernel(f"ray-sd{i}", "// fake: sleep 0.5"), TASKS) for i in range(5)]
    time.sleep(0.5)
    pool.shutdown(wait=False)
    statuses = [f.result(timeout=60).shapes[0].status for f in futures]
    assert all(s in (Status.OK, Status.INTERNAL_ERROR) for s in statuses)
    assert Status.INTERNAL_ERROR in statuses
    outcomes = {r.outcome for r in pool.records()}
    assert JobOutcome.SHUT_DOWN in outcomes and len(pool.records()) == 5


@pytest.mark.nvcc
def test_pool_without_slots_says_so(build_dir):
    with SandboxPool(config(build_dir, ray_slot_resource="no_such_slot"), FAKE) as pool:
        assert pool.workers.size == 0
        res = pool.submit(kernel("ray-nogpu"), TASKS).result(timeout=60)
    assert res.shapes[0].status == Status.NO_GPU


@pytest.mark.nvcc
def test_stats_render_mentions_every_figure(build_dir, fake_log):
    with SandboxPool(config(build_dir), FAKE) as pool:
        pool.map([kernel("ray-stats")], TASKS)
        text = pool.stats().render()
    for word in ("backend ray", "queue", "per minute", "GPU busy", "compile s", "statuses: ok 2"):
        assert word in text
