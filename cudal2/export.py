"""`cudal2 export`: the best verified kernel per shape, out of the result store, as a kernel library.

A library is a directory in the layout CUDA-L2 published, one self-contained source per shape, plus a manifest:

    DIR/<M>_<N>_<K>.cu     the fastest source on that shape (the candidate contract, README.md)
    DIR/manifest.json      Manifest: format version, GPU, accumulation, mode, evaluator version, and per shape its
                           file, source hash, measured median time and speedups vs every baseline, and the date

What qualifies: per shape, the fastest source by `ResultStore.best` (each source counted by its newest result on
that GPU, mode and the current EVALUATOR_VERSION; status ok with a candidate timing and a timing of `baseline`),
when that result also shows the runtime hardening checks ran (a full evaluation, not one with checks switched
off; compile-only results are never `ok`), its speedup over `baseline` is at least `min_speedup` and the store
holds its source text under a matching sha256. Everything else is reported as skipped, with the reason.

With `--host-cache-twins`, an sm90 kernel whose host_cache twin (cudal2.twins) has an ok result on the shape is
exported as that twin: the same device code, ~5 us less host time per call for an eager caller (a CUDA graph
replays neither's host code). Its entry keeps the kernel's figures and names the kernel in `timed_as`.

Kernels are written for, and only trusted on, the GPU they were measured on: the manifest names it, and
`cudal2.ops` refuses a library measured on another GPU.

Writing is atomic per file (temporary file + rename) and the manifest goes last, so a reader sees either the old
manifest or the new one with all its sources in place; a reader also checks each source's hash.

Units: times are microseconds (`_us`), speedups are baseline median time over candidate median time (>1: the
kernel is faster), dates are ISO 8601 UTC.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cudal2.sandbox.store import SPEEDUP_COLUMNS, GpuLabelError, ResultStore, resolve_gpu_label
from cudal2.sandbox.types import EVALUATOR_VERSION, MAX_DIM, Acc, Mode, ShapeResult, Status, Task

if TYPE_CHECKING:  # cudal2.twins pulls in the kernel families: imported only when twins are asked for
    from cudal2.twins import Twin

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
# The baseline torch.matmul's fp16 path takes (plain cuBLAS): the one `cudal2.ops` must beat.
TORCH_BASELINE = "cublas"
# Names the harness (cudal2/sandbox/harness/harness.cu) records only when its runtime hardening checks ran: the
# repeat check (uninitialised reads) and the re-verification of the timed calls (cached or skipped work).
HARDENING_CHECKS = ("repeat check", "timed-call re-verification")


class ManifestError(ValueError):
    """A manifest that cannot be read or does not follow the format (one line naming the file and the field)."""


class ExportError(ValueError):
    """An export that cannot be done as asked (unknown GPU label, unusable output directory); one line."""


def iso_utc(seconds: float) -> str:
    """Seconds since the epoch as '2025-01-31T12:00:00Z'."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def sha256_text(text: str) -> str:
    """The evaluator's source hash (cudal2.sandbox.evaluator.source_hash): sha256 of the UTF-8 text."""
    return hashlib.sha256(text.encode()).hexdigest()


def kernel_file_name(task: Task) -> str:
    """CUDA-L2's file name for a shape: '<M>_<N>_<K>.cu'."""
    return f"{task.mnk}.cu"


# ------------------------------------------------------------------------------------------- manifest records


@dataclass(frozen=True)
class KernelEntry:
    """One exported kernel: the shape it was measured on and what was measured there."""

    m: int
    n: int
    k: int
    acc: Acc
    file: str  # file name inside the library directory, e.g. "4096_4096_4096.cu"
    source_hash: str  # sha256 of the file's text
    evaluator_version: str
    gpu: str  # the evaluator's GPU label, e.g. "NVIDIA H200 (sm_90a)"
    mode: Mode
    median_us: float  # the kernel's median time per call
    baseline_us: dict[str, float]  # baseline name ("cublas", "cublaslt_heuristic", ...) -> its median time
    speedups: dict[str, float]  # baseline name -> baseline median / kernel median
    max_rel_err: float | None  # worst relative Frobenius error over the evaluator's random checks
    measured: str  # ISO 8601 UTC date of the measurement
    # sha256 of the source these figures were measured on, when it is not this file's: a host_cache twin
    # (ExportRequest.host_cache_twins) carries its kernel's offline figures, the same device code. Optional in JSON.
    timed_as: str | None = None

    @property
    def task(self) -> Task:
        return Task(self.m, self.n, self.k, self.acc)

    def to_json(self) -> dict[str, Any]:
        return {
            "m": self.m, "n": self.n, "k": self.k, "acc": self.acc.value, "file": self.file,
            "source_hash": self.source_hash, "evaluator_version": self.evaluator_version, "gpu": self.gpu,
            "mode": self.mode.value, "median_us": self.median_us, "baseline_us": dict(self.baseline_us),
            "speedups": dict(self.speedups), "max_rel_err": self.max_rel_err, "measured": self.measured,
        } | ({"timed_as": self.timed_as} if self.timed_as else {})  # fmt: skip

    @classmethod
    def from_json(cls, d: object, where: str) -> KernelEntry:
        r = _Fields(d, where)
        entry = cls(
            m=r.get("m", _is_dim, f"an integer in [1, {MAX_DIM}]"),
            n=r.get("n", _is_dim, f"an integer in [1, {MAX_DIM}]"),
            k=r.get("k", _is_dim, f"an integer in [1, {MAX_DIM}]"),
            acc=Acc(r.get("acc", _in_enum(Acc), "fp32 or fp16")),
            file=r.get("file", _is_kernel_file, "a file name ending in .cu, without directories"),
            source_hash=r.get("source_hash", _is_sha256, "a sha256 hex digest"),
            evaluator_version=r.get("evaluator_version", _is_text, "a string"),
            gpu=r.get("gpu", _is_text, "a string"),
            mode=Mode(r.get("mode", _in_enum(Mode), "offline or server")),
            median_us=float(r.get("median_us", _is_positive, "a positive number")),
            baseline_us=r.get("baseline_us", _is_positive_map, "an object of positive numbers"),
            speedups=r.get("speedups", _is_positive_map, "an object of positive numbers"),
            max_rel_err=r.get("max_rel_err", _is_optional_number, "a number or null"),
            measured=r.get("measured", _is_text, "a date string"),
            timed_as=r.get("timed_as", _is_sha256, "a sha256 hex digest") if "timed_as" in r.obj else None,
        )
        if TORCH_BASELINE not in entry.baseline_us:
            raise ManifestError(f"{where}.baseline_us: no {TORCH_BASELINE!r} time (torch.matmul's path)")
        return entry


@dataclass(frozen=True)
class Manifest:
    """A kernel library's index: what was exported, for which GPU, from which measurements."""

    gpu: str  # every kernel was measured on this GPU (the evaluator's label)
    acc: Acc
    mode: Mode
    evaluator_version: str
    baseline: str  # the baseline `min_speedup` was applied to
    min_speedup: float
    created: str  # ISO 8601 UTC date of the export
    kernels: tuple[KernelEntry, ...]
    format_version: int = FORMAT_VERSION

    def kernel(self, m: int, n: int, k: int) -> KernelEntry | None:
        """The kernel exported for exactly this shape, or None."""
        return next((e for e in self.kernels if (e.m, e.n, e.k) == (m, n, k)), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version, "gpu": self.gpu, "acc": self.acc.value, "mode": self.mode.value,
            "evaluator_version": self.evaluator_version, "baseline": self.baseline, "min_speedup": self.min_speedup,
            "created": self.created, "kernels": [e.to_json() for e in self.kernels],
        }  # fmt: skip

    @classmethod
    def from_json(cls, d: object) -> Manifest:
        r = _Fields(d, "manifest")
        version = r.get("format_version", _is_int, "an integer")
        if version != FORMAT_VERSION:
            raise ManifestError(f"format_version {version} is not supported (this cudal2 reads {FORMAT_VERSION})")
        raw_kernels = r.get("kernels", lambda v: isinstance(v, list), "a list")
        manifest = cls(
            gpu=r.get("gpu", _is_text, "a string"),
            acc=Acc(r.get("acc", _in_enum(Acc), "fp32 or fp16")),
            mode=Mode(r.get("mode", _in_enum(Mode), "offline or server")),
            evaluator_version=r.get("evaluator_version", _is_text, "a string"),
            baseline=r.get("baseline", lambda v: v in SPEEDUP_COLUMNS, f"one of {', '.join(SPEEDUP_COLUMNS)}"),
            min_speedup=float(r.get("min_speedup", _is_non_negative, "a number >= 0")),
            created=r.get("created", _is_text, "a date string"),
            kernels=tuple(KernelEntry.from_json(e, f"kernels[{i}]") for i, e in enumerate(raw_kernels)),
        )
        manifest._check_consistent()
        return manifest

    def _check_consistent(self) -> None:
        """One GPU, accumulation and mode per library, one kernel per shape, one shape per file."""
        shapes, files = set(), set()
        for i, e in enumerate(self.kernels):
            for name in ("gpu", "acc", "mode"):
                if getattr(e, name) != getattr(self, name):
                    raise ManifestError(f"kernels[{i}].{name}: {getattr(e, name)!r} differs from the library's "
                                        f"{getattr(self, name)!r}")
            if (e.m, e.n, e.k) in shapes or e.file in files:
                raise ManifestError(f"kernels[{i}]: shape {e.task.mnk} or file {e.file} listed twice")
            shapes.add((e.m, e.n, e.k))
            files.add(e.file)

    def save(self, directory: Path) -> Path:
        """Write DIR/manifest.json atomically; returns its path."""
        path = Path(directory) / MANIFEST_NAME
        _write_atomic(path, json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> Manifest:
        """Read a manifest from a library directory or a manifest file. Raises ManifestError (one line)."""
        path = Path(path)
        if path.is_dir():
            path = path / MANIFEST_NAME
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ManifestError(f"{path}: no such manifest (make one with `cudal2 export --out DIR`)") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ManifestError(f"{path}: cannot read ({e.__class__.__name__}: {e})") from None
        except json.JSONDecodeError as e:
            raise ManifestError(f"{path}: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
        try:
            return cls.from_json(data)
        except ManifestError as e:
            raise ManifestError(f"{path}: {e}") from None


class _Fields:
    """Typed access to one JSON object's fields; a missing or ill-typed field is a ManifestError naming it."""

    def __init__(self, obj: object, where: str) -> None:
        if not isinstance(obj, dict):
            raise ManifestError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        self.obj, self.where = obj, where

    def get(self, key: str, valid: Callable[[Any], bool], expected: str) -> Any:
        if key not in self.obj:
            raise ManifestError(f"{self.where}: missing field {key!r}")
        value = self.obj[key]
        if not valid(value):
            raise ManifestError(f"{self.where}.{key}: expected {expected}, got {_short(value)}")
        return value


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_dim(v: Any) -> bool:
    return _is_int(v) and 1 <= v <= MAX_DIM


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _is_positive(v: Any) -> bool:
    return _is_number(v) and v > 0


def _is_non_negative(v: Any) -> bool:
    return _is_number(v) and v >= 0


def _is_optional_number(v: Any) -> bool:
    return v is None or _is_number(v)


def _is_text(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _is_sha256(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


def _is_kernel_file(v: Any) -> bool:
    # A manifest names files inside its own directory only: never a path that leaves it.
    return isinstance(v, str) and v.endswith(".cu") and Path(v).name == v and not v.startswith(".")


def _is_positive_map(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and _is_positive(x) for k, x in v.items())


def _in_enum(enum: type) -> Callable[[Any], bool]:
    return lambda v: v in {e.value for e in enum}


def _write_atomic(path: Path, text: str) -> None:
    """Write text to path by renaming a complete temporary file over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------------------------------------- export


@dataclass(frozen=True)
class ExportRequest:
    """What to export. `gpu` is an exact label as the store records it (see resolve_gpu)."""

    gpu: str
    acc: Acc = Acc.FP32
    mode: Mode = Mode.OFFLINE
    min_speedup: float = 1.02  # over `baseline`; 0 exports every verified kernel
    baseline: str = TORCH_BASELINE
    # An sm90 kernel's host_cache twin (cudal2.twins: the same device code, its CUTLASS parameters kept between calls:
    # ~5 us less host time per call) goes in its place where the store holds an ok result of the twin on that shape
    # in any mode, i.e. the twin itself passed every check there. Its entry keeps the kernel's figures (`timed_as`).
    host_cache_twins: bool = False


@dataclass(frozen=True)
class Skipped:
    """A shape with ok results that is not exported, and why."""

    task: Task
    reason: str


@dataclass(frozen=True)
class ExportPlan:
    """The manifest to write, the source text of each of its files, and the shapes left out."""

    manifest: Manifest
    sources: dict[str, str]  # file name -> source text
    skipped: tuple[Skipped, ...]


def resolve_gpu(stored: list[str], wanted: str | None, machine: str | None) -> str:
    """The exact GPU label to export for (cudal2.sandbox.store.resolve_gpu_label); raises ExportError."""
    try:
        return resolve_gpu_label(stored, wanted, machine)
    except GpuLabelError as e:
        raise ExportError(str(e)) from None


def _full_evaluation(result: ShapeResult) -> bool:
    return all(any(c.startswith(name) for c in result.checks) for name in HARDENING_CHECKS)


def _entry(task: Task, source_hash: str, result: ShapeResult, request: ExportRequest, measured: float | None
           ) -> KernelEntry:
    return KernelEntry(
        m=task.m, n=task.n, k=task.k, acc=task.acc, file=kernel_file_name(task), source_hash=source_hash,
        evaluator_version=EVALUATOR_VERSION, gpu=request.gpu, mode=request.mode,
        median_us=result.timings["candidate"].median_us,
        baseline_us={name: t.median_us for name, t in result.timings.items() if name != "candidate"},
        speedups=result.speedups(), max_rel_err=result.max_rel_err,
        measured=iso_utc(measured) if measured is not None else "unknown",
    )  # fmt: skip


def _verified_twin(store: ResultStore, twin_of: Callable[[str], Twin | None], source_hash: str, task: Task,
                   gpu: str) -> Twin | None:
    """The host_cache twin of `source_hash` when the store holds an ok result of it on `task` in any mode."""
    twin = twin_of(source_hash)
    if twin is None:
        return None
    results = (store.get_result(twin.source_hash, task, gpu, mode) for mode in Mode)
    return twin if any(r is not None and r.status is Status.OK for r in results) else None


def _select(store: ResultStore, task: Task, request: ExportRequest, twin_of: Callable[[str], Twin | None] | None
            ) -> tuple[KernelEntry, str] | str:
    """(entry, source) for the shape's best kernel (its verified twin in its place with `twin_of`), or why there
    is none to export."""
    best = store.best(task, request.gpu, mode=request.mode, baseline=request.baseline, limit=1)
    if not best:
        return f"no source's newest result here is ok and timed against {request.baseline}"
    source_hash, result = best[0]
    if TORCH_BASELINE not in result.timings:
        return f"best result has no {TORCH_BASELINE} timing"
    if not _full_evaluation(result):
        return "best result was measured without the runtime hardening checks"
    speedup = result.speedup(request.baseline)
    if speedup < request.min_speedup:
        return f"best speedup {speedup:.3f}x over {request.baseline} < --min-speedup {request.min_speedup:g}"
    source = store.get_source(source_hash)
    if source is None:
        return f"source {source_hash[:12]} is not in the store"
    if sha256_text(source) != source_hash:
        return f"stored source {source_hash[:12]} does not match its hash"
    measured = store.measured_at(source_hash, task, request.gpu, request.mode)
    entry = _entry(task, source_hash, result, request, measured)
    twin = _verified_twin(store, twin_of, source_hash, task, request.gpu) if twin_of else None
    if twin is None:
        return entry, source
    return replace(entry, source_hash=twin.source_hash, timed_as=source_hash), twin.source


def plan_export(store: ResultStore, request: ExportRequest) -> ExportPlan:
    """Choose what to export (see the module docstring); touches no file."""
    if request.baseline not in SPEEDUP_COLUMNS:
        raise ExportError(f"unknown baseline {request.baseline!r}: expected one of {', '.join(SPEEDUP_COLUMNS)}")
    if not (math.isfinite(request.min_speedup) and request.min_speedup >= 0):
        raise ExportError(f"--min-speedup {request.min_speedup} must be a finite number >= 0")
    entries, sources, skipped = [], {}, []
    with contextlib.ExitStack() as stack:
        twin_of = None
        if request.host_cache_twins:
            from cudal2.tune_log import TuneLog
            from cudal2.twins import host_cache_twin

            log = stack.enter_context(TuneLog(store))
            twin_of = functools.cache(lambda h: host_cache_twin(log.config_of(h)))
        for task in store.ok_shapes(request.acc, request.gpu, request.mode):
            chosen = _select(store, task, request, twin_of)
            if isinstance(chosen, str):
                skipped.append(Skipped(task, chosen))
                continue
            entry, source = chosen
            entries.append(entry)
            sources[entry.file] = source
    manifest = Manifest(
        gpu=request.gpu, acc=request.acc, mode=request.mode, evaluator_version=EVALUATOR_VERSION,
        baseline=request.baseline, min_speedup=request.min_speedup, created=iso_utc(time.time()),
        kernels=tuple(entries),
    )  # fmt: skip
    return ExportPlan(manifest, sources, tuple(skipped))


def _previous_files(out_dir: Path) -> set[str]:
    """Kernel files of a previous export in out_dir; ExportError when out_dir holds anything but an export."""
    if not out_dir.exists():
        return set()
    if not out_dir.is_dir():
        raise ExportError(f"{out_dir}: exists and is not a directory")
    if not any(out_dir.iterdir()):
        return set()
    try:
        previous = Manifest.load(out_dir)
    except ManifestError as e:
        raise ExportError(f"{out_dir}: not empty and not a readable cudal2 kernel library ({e}); "
                          "choose a new or empty directory") from None
    return {e.file for e in previous.kernels}


def write_library(out_dir: Path, plan: ExportPlan) -> Path:
    """Write the plan's sources, then its manifest, into out_dir (created if needed); kernel files of a previous
    export there that the new manifest no longer lists are removed. Returns the manifest's path."""
    out_dir = Path(out_dir)
    stale = _previous_files(out_dir) - set(plan.sources)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, source in plan.sources.items():
            _write_atomic(out_dir / name, source)
        path = plan.manifest.save(out_dir)
    except OSError as e:
        raise ExportError(f"{out_dir}: cannot write the library ({e.__class__.__name__}: {e.strerror or e})") from None
    for name in stale:  # only after the new manifest no longer names them
        (out_dir / name).unlink(missing_ok=True)
    return path


def render(plan: ExportPlan) -> str:
    """A table of the exported kernels and a count of the skipped shapes, for the CLI."""
    m = plan.manifest
    baselines = list(SPEEDUP_COLUMNS)
    lines = [f"{len(m.kernels)} kernel(s) for {m.gpu}, acc {m.acc.value}, mode {m.mode.value}, "
             f"evaluator {m.evaluator_version}, speedup over {m.baseline} >= {m.min_speedup:g}",
             f"{'file':<24} {'median_us':>10}" + "".join(f" {('x ' + b)[:20]:>20}" for b in baselines)]
    for e in m.kernels:
        cells = "".join(f" {e.speedups[b]:20.3f}" if b in e.speedups else f" {'-':>20}" for b in baselines)
        lines.append(f"{e.file:<24} {e.median_us:10.2f}{cells}" + ("  (host_cache twin)" if e.timed_as else ""))
    if plan.skipped:
        lines.append(f"{len(plan.skipped)} shape(s) not exported:")
        lines += [f"  {s.task.mnk}: {s.reason}" for s in plan.skipped]
    return "\n".join(lines)
