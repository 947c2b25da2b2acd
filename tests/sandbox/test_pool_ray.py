"""Ray-only mechanics of the pool on the CPU (the behaviours both backends share are in test_pool.py): compiled
libraries travel to GPU actors by content hash, and a library whose bytes do not match its hash is refused."""

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
from cudal2.sandbox.pool import Backend, PoolConfig, RunnerSpec, SandboxPool  # noqa: E402
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
