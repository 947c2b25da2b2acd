"""The Ray backend: compiles as CPU tasks on any node of a Ray cluster, one actor per GPU for the GPU stage.

Same interface as the local backend (cudal2.sandbox.pool.local), so SandboxPool schedules both alike:
RayCompiler is LocalCompiler (`submit(source, tasks) -> Future[Prepared]`, `shutdown()`), RayGpuWorkers is
LocalGpuWorkers (`size`, `run(slot, prepared)`, `replace(slot)`, `pid(slot)`, `shutdown()`), and a lost GPU worker
is the same WorkerLost.

Data flow of one job:

    driver (SandboxPool)                        Ray cluster
    RayCompiler.submit ─ thread ─► _compile_task (num_cpus=1, any node)
                                     Evaluator.prepare: static rules, nvcc (that node's compile cache), link check
                       ◄─ ray.get ── returns (RayPrepared, library bytes) as two objects; the bytes stay in the
                                     object store: the driver only keeps their ObjectRef in RayPrepared.lib_ref,
                                     beside RayPrepared.lib_sha256 (the library's content hash)
      final (reject, compile error, compile-only)? recorded in the driver's store, future resolved; no actor
      runnable? future resolves to the RayPrepared, the pool queues it for a GPU
    RayGpuWorkers.run(slot) ─ actor.run ─► _GpuActor (num_cpus=0, one GPU or one `ray_slot_resource`)
                                     materialize(): the library by content hash on this node: the compile-cache
                                     path when it exists with that sha256 (same node or shared disk: nothing moves),
                                     else <cache_dir>/by-sha256/<sha[:2]>/<sha>.so, fetched from the object store
                                     once, verified and written atomically; prepared.compile.lib_path rewritten
                                     runner.run(prepared) (the Evaluator: store lookup, harness, store)
                       ◄─ ray.get(timeout=job_timeout_s) ── EvalResult, or WorkerLost: the actor died (ray.kill,
                                     os._exit, node loss), hung past the deadline or raised; the pool replaces it
                                     (ray.kill + a fresh actor) and retries the job

What differs from the local backend:
- Compiles run as Ray tasks (num_cpus=1) wherever CPUs are free, so CPU-only nodes compile for GPU nodes; their
  concurrency is bounded by the cluster's CPUs and by `compile_workers` driver threads (0 = the cluster's CPUs).
  Final outcomes are recorded by the driver, in the store at config.db_path (as LocalCompiler does), under the
  driver's GPU label; a final result's `gpu` field is relabelled to match (a CPU node would say "cpu ...").
- A GPU worker is an actor holding `num_gpus=1` (ray_slot_resource "GPU") or one unit of a custom resource
  (tests simulate GPUs on CPU machines with it), always with `num_cpus=0`: an actor that held a CPU would starve
  the compile tasks. Slots: `ray_gpus`, or every unit of the resource in the cluster.
- gpu_index: with real GPUs Ray sets CUDA_VISIBLE_DEVICES per actor, but the Evaluator does not use the actor's
  environment: detect_gpu asks nvidia-smi (which ignores CUDA_VISIBLE_DEVICES) and the harness child gets a
  scrubbed environment with CUDA_VISIBLE_DEVICES=<gpu_index>. The actor therefore passes the physical ID Ray
  assigned (ray.get_gpu_ids()[0]), not 0, which would put every actor's harness on physical GPU 0. With a custom
  resource the slot number is the index (as LocalGpuWorkers' gpus=(0, 1, ...)). MIG / UUID IDs are not supported.
- The job deadline starts once the actor is up: an actor's start (worker process, imports, waiting for a
  resource a killed actor frees) is bounded separately by ACTOR_START_TIMEOUT_S.
- Artifacts move by content hash, libraries only (sources and results travel inside the task arguments).
- Ray is started here only when not yet initialised: `ray.init(address=config.ray_address)`, or for None a local
  instance (this machine's CPUs, a 256 MiB object store, no dashboard, the custom slot resource when one is
  named with ray_gpus > 0, PYTHONPATH carrying this checkout so workers import cudal2 and a RunnerSpec module).
  The last of this module's users to shut down shuts such an instance down; one it found running is left alone.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import ray
import ray.exceptions

from cudal2.sandbox.evaluator import EvalOptions, Evaluator, Prepared, default_cache_dir
from cudal2.sandbox.pool.local import RunnerSpec, WorkerLost, open_store
from cudal2.sandbox.pool.types import PoolConfig
from cudal2.sandbox.types import EvalResult, Task

__all__ = ["RayCompiler", "RayGpuWorkers", "RayPrepared", "materialize"]

OBJECT_STORE_BYTES = 256 << 20  # local instance only: libraries in flight are MBs at most
COMPILE_GRACE_S = 600.0  # ray.get on one compile: nvcc's limit plus this (queueing on a busy cluster, worker start)
ACTOR_START_TIMEOUT_S = 300.0  # a fresh GPU actor must be up within this (a killed one's resource is freed first)
ARTIFACT_DIR = "by-sha256"  # under an actor's compile cache dir: libraries fetched from other nodes


@dataclass(frozen=True)
class RayPrepared(Prepared):
    """A Prepared whose library travels by content: its sha256 and an ObjectRef to its bytes (both None when the
    candidate is final). The pool treats it as any Prepared; only the GPU actor reads the two extra fields."""

    lib_sha256: str | None = None
    lib_ref: Any = None  # ray.ObjectRef to the library's bytes


def _plain(prepared: Prepared) -> Prepared:
    return Prepared(*(getattr(prepared, f.name) for f in fields(Prepared)))


# ------------------------------------------------------------------------------------------------ Ray start

_ray_lock = threading.Lock()
_ray_users = 0
_ray_started_here = False


def _pythonpath() -> str:
    root = str(Path(__file__).resolve().parents[3])  # the checkout holding the cudal2 package
    parts = [root, os.getcwd(), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return os.pathsep.join(dict.fromkeys(parts))


def _acquire_ray(config: PoolConfig) -> None:
    global _ray_users, _ray_started_here
    with _ray_lock:
        if not ray.is_initialized():
            if config.ray_address is None:
                custom = config.ray_slot_resource != "GPU" and config.ray_gpus > 0
                ray.init(num_cpus=os.cpu_count() or 1, object_store_memory=OBJECT_STORE_BYTES,
                         include_dashboard=False,
                         resources={config.ray_slot_resource: config.ray_gpus} if custom else None,
                         runtime_env={"env_vars": {"PYTHONPATH": _pythonpath()}})
            else:
                ray.init(address=config.ray_address)
            _ray_started_here = True
        _ray_users += 1


def _release_ray() -> None:
    global _ray_users, _ray_started_here
    with _ray_lock:
        _ray_users = max(0, _ray_users - 1)
        if _ray_users == 0 and _ray_started_here:
            ray.shutdown()
            _ray_started_here = False


def _one_line(e: BaseException, limit: int = 300) -> str:
    """A Ray error in one line: the actor's attribute lines (ids, namespace) and Ray's generic advice dropped."""
    lines = str(e).splitlines()
    pid = next((ln.split(":", 1)[1].strip() for ln in lines if ln.strip().startswith("pid:")), None)
    text = " ".join(ln.strip() for ln in lines if ln.strip() and not ln.startswith("\t"))
    text = text.split(" Some common causes include")[0]
    if pid:
        text += f" (pid {pid})"
    return " ".join(text.split())[:limit] or type(e).__name__


# ------------------------------------------------------------------------------------------------ compile


@lru_cache(maxsize=8)
def _compile_evaluator(options: EvalOptions) -> Evaluator:
    return Evaluator(options, None)  # prepare() touches no store


@ray.remote(num_cpus=1)
def _compile_task(options: EvalOptions, source: str, tasks: tuple[Task, ...]) -> tuple[RayPrepared, bytes | None]:
    """Runs on any node with a free CPU. Returns (RayPrepared, library bytes or None) as two objects."""
    prepared = _compile_evaluator(options).prepare(source, tasks)
    if prepared.final is not None:
        return RayPrepared(*(getattr(prepared, f.name) for f in fields(Prepared))), None
    data = Path(prepared.compile.lib_path).read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    return RayPrepared(*(getattr(prepared, f.name) for f in fields(Prepared)), lib_sha256=sha), data


class RayCompiler:
    """The CPU stage as Ray tasks; final outcomes are recorded in the driver's store (see the module docstring)."""

    def __init__(self, config: PoolConfig, arch: str):
        _acquire_ray(config)
        self.options = replace(config.eval, arch=arch)
        self.db_path = config.db_path
        self.timeout_s = self.options.compile_timeout_s + COMPILE_GRACE_S
        threads = config.compile_workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="cudal2-raycompile")
        self.local = threading.local()
        self._released = False

    def submit(self, source: str, tasks: tuple[Task, ...]) -> Future:
        return self.executor.submit(self._prepare, source, tuple(tasks))

    def _evaluator(self) -> Evaluator:
        ev = getattr(self.local, "evaluator", None)
        if ev is None:  # one per thread: sqlite connections are per thread
            ev = self.local.evaluator = Evaluator(self.options, open_store(self.db_path))
        return ev

    def _prepare(self, source: str, tasks: tuple[Task, ...]) -> Prepared:
        prepared_ref, lib_ref = _compile_task.options(num_returns=2).remote(self.options, source, tasks)
        try:
            prepared: RayPrepared = ray.get(prepared_ref, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(prepared_ref, force=True)
            raise TimeoutError(f"the compile task took longer than {self.timeout_s:.0f} s") from None
        if prepared.final is None:
            return replace(prepared, lib_ref=lib_ref)
        ev = self._evaluator()
        prepared = replace(prepared, final=replace(prepared.final, gpu=ev.gpu_label))
        ev.run(prepared)  # records rejections and compile errors in the store
        return prepared

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)
        if not self._released:
            self._released = True
            _release_ray()


# ------------------------------------------------------------------------------------------------ GPU stage


def _sha256_file(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def materialize(prepared: Prepared, cache_dir: Path, fetch_timeout_s: float = 600.0) -> Prepared:
    """The plain Prepared a runner expects, with its library on this node's disk, found by content hash.

    Uses `prepared.compile.lib_path` as is when that file exists here with the expected sha256 (the compile ran on
    this node or on a shared disk); otherwise `cache_dir/by-sha256/<sha[:2]>/<sha>.so`, fetched from the object
    store when missing, verified, written atomically (read-only). Raises RuntimeError when the bytes do not hash
    to `lib_sha256` (never run a library other than the one compiled)."""
    plain = _plain(prepared)
    sha = getattr(prepared, "lib_sha256", None)
    if prepared.final is not None or prepared.compile is None or sha is None:
        return plain
    if prepared.compile.lib_path and _sha256_file(Path(prepared.compile.lib_path)) == sha:
        return plain
    local = Path(cache_dir).resolve() / ARTIFACT_DIR / sha[:2] / f"{sha}.so"
    if _sha256_file(local) != sha:
        if prepared.lib_ref is None:
            raise RuntimeError(f"library {sha[:12]} is not on this node and no copy travelled with the job")
        data = ray.get(prepared.lib_ref, timeout=fetch_timeout_s)
        if hashlib.sha256(data).hexdigest() != sha:
            raise RuntimeError(f"library bytes fetched for {sha[:12]} fail sha256 verification")
        local.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=local.parent, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o444)
            os.replace(tmp, local)  # a concurrent writer of the same sha writes the same bytes
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return replace(plain, compile=replace(prepared.compile, lib_path=str(local)))


class _GpuActor:
    """One GPU slot: builds the runner once, runs one job at a time (a sync actor: every call on one thread, so
    the runner's sqlite connection stays on its thread)."""

    def __init__(self, spec: RunnerSpec, options: EvalOptions, slot: int, db_path: str | None, real_gpu: bool,
                 fetch_timeout_s: float):
        gpu_index = slot
        if real_gpu:  # the physical ID Ray assigned: see the module docstring
            ids = ray.get_gpu_ids()
            gpu_index = int(ids[0]) if ids else 0
        self.gpu_index = gpu_index
        self.cache_dir = Path(options.cache_dir or default_cache_dir())
        self.fetch_timeout_s = fetch_timeout_s
        self.runner = spec.build(options, gpu_index, db_path)

    def pid(self) -> int:
        return os.getpid()

    def run(self, prepared: Prepared) -> EvalResult:
        return self.runner.run(materialize(prepared, self.cache_dir, self.fetch_timeout_s))


_GpuActorRemote = ray.remote(max_restarts=0, max_task_retries=0)(_GpuActor)


class RayGpuWorkers:
    """One actor per GPU slot (see the module docstring)."""

    def __init__(self, config: PoolConfig, spec: RunnerSpec):
        _acquire_ray(config)
        self.config, self.spec = config, spec
        self.real_gpus = config.ray_slot_resource == "GPU"
        n = config.ray_gpus or int(ray.cluster_resources().get(config.ray_slot_resource, 0))
        self.actors: list = [None] * n
        self._ready: list = [None] * n  # ObjectRef of each actor's pid(): resolves once the actor is up
        self._released = False
        for slot in range(n):
            self._start(slot)

    @property
    def size(self) -> int:
        return len(self.actors)

    def _start(self, slot: int) -> None:
        if self.real_gpus:
            resources: dict = {"num_gpus": 1}
        else:
            resources = {"resources": {self.config.ray_slot_resource: 1}}
        actor = _GpuActorRemote.options(num_cpus=0, **resources).remote(
            self.spec, self.config.eval, slot, self.config.db_path, self.real_gpus, self.config.job_timeout_s)
        self.actors[slot] = actor
        self._ready[slot] = actor.pid.remote()  # queued first: answered before any job

    def pid(self, slot: int) -> int | None:
        """The actor's process id, once it is up; None if it did not start."""
        try:
            return ray.get(self._ready[slot], timeout=ACTOR_START_TIMEOUT_S)
        except ray.exceptions.RayError:
            return None

    def run(self, slot: int, prepared: Prepared) -> EvalResult:
        """Run one job on actor `slot`; WorkerLost if it dies, raises or exceeds the job deadline."""
        actor, timeout = self.actors[slot], self.config.job_timeout_s
        try:
            ray.get(self._ready[slot], timeout=ACTOR_START_TIMEOUT_S)
        except ray.exceptions.RayError as e:
            raise WorkerLost(f"GPU actor {slot} did not start: {_one_line(e)}") from None
        ref = actor.run.remote(prepared)
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise WorkerLost(f"GPU actor {slot} exceeded the {timeout:g} s job deadline") from None
        except ray.exceptions.RayActorError as e:
            raise WorkerLost(f"GPU actor {slot} died: {_one_line(e)}") from None
        except ray.exceptions.RayTaskError as e:  # the runner raised: an evaluator bug (local: the worker dies)
            raise WorkerLost(f"GPU actor {slot} failed: {_one_line(e)}") from None
        except ray.exceptions.RayError as e:
            raise WorkerLost(f"GPU actor {slot} lost the job: {_one_line(e)}") from None

    def replace(self, slot: int) -> None:
        self._kill(slot)
        self._start(slot)

    def _kill(self, slot: int) -> None:
        actor = self.actors[slot]
        if actor is None:
            return
        try:
            ray.kill(actor, no_restart=True)
        except Exception as e:  # already gone, or Ray shutting down: nothing left to stop
            print(f"cudal2: ray.kill of GPU actor {slot}: {e!r}", file=sys.stderr)
        self.actors[slot] = self._ready[slot] = None

    def shutdown(self) -> None:
        for slot in range(self.size):
            self._kill(slot)
        if not self._released:
            self._released = True
            _release_ray()
