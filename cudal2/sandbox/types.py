"""Typed records that cross the sandbox's boundaries.

Every stage (static check -> compile -> run in the harness -> store) hands the next one a dataclass from
this module, never a raw dict or an exception. Failures are values: a `Status` plus a one-line `reason`.

Units: times are microseconds (`_us`), sizes are bytes, errors are relative Frobenius norms
(||C - ref|| / ||ref||, dimensionless).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

# Bumped whenever a change could alter a status or a figure; part of every cache and store key, so results
# of an older evaluator are never served as current ones.
EVALUATOR_VERSION = "0.3.0"

# Older versions whose results stand under the current one for sources that cudal2's own kernel families generated,
# and why: the change since cannot alter what such a source gets. `cudal2 carry` copies those results forward
# (a source must also pass today's static rules); results of other sources are measured again.
FAMILY_RESULTS_CARRY: dict[str, str] = {
    "0.1.0": "0.2.0 only adds the rejection of programmatic dependent launch (a static rule, and programmatic edges "
             "in the captured graph of the timed calls); no family kernel launches with PDL",
    "0.2.0": "0.3.0 allows programmatic dependent launch between the kernels of one call (cuBLAS's split-K does it) and "
             "still rejects it between calls, checked in the captured graph in every mode; a source that does not spell "
             "PDL is checked and timed as before",
}


class Acc(str, Enum):
    """Accumulation precision a task demands. fp32 means fp32-accumulation accuracy (the default)."""

    FP32 = "fp32"
    FP16 = "fp16"


class Mode(str, Enum):
    """How the timed calls are issued.

    offline: back-to-back calls (CUDA-graph replay when the candidate is capture-safe) over rotating input sets,
        at most 32: a shape whose 32 sets fit in L2 (2(MK + KN + MN) under ~L2 / 31 bytes, ~2 MB with the H200's
        60 MB L2) finds its inputs in L2 when their turn comes again. The mode the targets and the reward are
        defined in.
    cold: the offline replay after an L2 flush (outside the timed window), so every call of it reads inputs that
        no call since the flush has touched: close to offline where the sets exceed L2 (the flush leaves dirty
        lines to write back), colder for small shapes. Reported beside offline; `cudal2 remeasure --mode cold`.
    server: the L2 is flushed before each call and calls arrive as a Poisson process; P50/P99 latency.
    wallclock: CUDA-L2's method, kept only to compare with its published tables: host wall clock around one plain
        call and a stream synchronisation, the same inputs every call (warm L2), launch overhead included. It
        flatters small shapes' rivals less than it flatters kernels that allocate or synchronise; never a reward.
    confirm: the offline method, stored apart. `cudal2 remeasure --mode confirm` times each shape's fastest offline
        kernel once more in a new evaluation: a search keeps the fastest of many noisy figures per shape (each
        median has ~1% noise against its baseline), so its best is biased up; one fresh figure of the chosen kernel
        is not.
    """

    OFFLINE = "offline"
    SERVER = "server"
    WALLCLOCK = "wallclock"
    CONFIRM = "confirm"
    COLD = "cold"

    @property
    def method(self) -> Mode:
        """How the harness times the calls: confirm re-runs the offline method."""
        return Mode.OFFLINE if self is Mode.CONFIRM else self

    @property
    def replays(self) -> bool:
        """Timed as CUDA-graph replays: device time only, the host code of a call is not in the figure."""
        return self.method in (Mode.OFFLINE, Mode.COLD)


class Status(str, Enum):
    """Outcome of one (candidate, shape) evaluation. Only OK (or COMPILED under --compile-only) is success."""

    OK = "ok"
    COMPILED = "compiled"  # compile-only evaluation succeeded; nothing was run
    STATIC_REJECT = "static_reject"  # a source or link rule forbids the candidate (rule and line in reason)
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"  # non-zero return, CUDA error, crash, missing report
    TIMEOUT = "timeout"  # compile or run exceeded its wall-clock limit and was killed
    WRONG_ANSWER = "wrong_answer"
    REJECTED_BEHAVIOUR = "rejected_behaviour"  # right numbers, forbidden behaviour (private stream, leftover work...)
    NO_GPU = "no_gpu"  # the machine cannot run the requested evaluation
    INTERNAL_ERROR = "internal_error"  # the evaluator itself failed; never the candidate's fault

    @property
    def success(self) -> bool:
        return self in (Status.OK, Status.COMPILED)


# The failures only a run on the GPU decides (the rest are decided before it, by the static rules and nvcc, and come
# out the same every time): what `--retry` may ask to measure again.
RUN_FAILURES: tuple[Status, ...] = (Status.RUNTIME_ERROR, Status.TIMEOUT, Status.WRONG_ANSWER,
                                    Status.REJECTED_BEHAVIOUR)


_MNK_RE = re.compile(r"^\s*(\d+)\s*[_x,]\s*(\d+)\s*[_x,]\s*(\d+)\s*$")

# Largest dimension the evaluator accepts: 2^17 keeps every M*K, N*K and M*N element count below 2^34 and the
# biggest buffer (16 GiB) inside one H200; the CUDA-L2 grid stops at 16384.
MAX_DIM = 1 << 17
# The most workspace the harness gives a candidate (cudal2_workspace_bytes; harness.cu's MAX_WORKSPACE, which a test
# keeps equal): a larger ask is a runtime_error, so generators refuse such shapes up front.
MAX_WORKSPACE_BYTES = 8 << 30


class BadTask(ValueError):
    """A malformed shape string or out-of-range dimension (bad user input, reported in one line)."""


@dataclass(frozen=True)
class Task:
    """One GEMM to evaluate: C[M,N] = A[M,K] @ B[N,K]^T, fp16 in memory, accumulation per `acc`."""

    m: int
    n: int
    k: int
    acc: Acc = Acc.FP32

    def __post_init__(self) -> None:
        for name in ("m", "n", "k"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_DIM:
                raise BadTask(f"{name.upper()}={v!r} is not an integer in [1, {MAX_DIM}]")
        if not isinstance(self.acc, Acc):
            object.__setattr__(self, "acc", Acc(self.acc))

    @classmethod
    def parse(cls, mnk: str, acc: Acc | str = Acc.FP32) -> Task:
        """Parse '64_4096_64' (also '64x4096x64' or '64,4096,64')."""
        match = _MNK_RE.match(mnk)
        if not match:
            raise BadTask(f"bad shape {mnk!r}: expected M_N_K, e.g. 64_4096_64")
        try:
            acc = Acc(acc)
        except ValueError:
            raise BadTask(f"bad accumulation {acc!r}: expected fp32 or fp16") from None
        m, n, k = (int(g) for g in match.groups())
        return cls(m, n, k, acc)

    @property
    def mnk(self) -> str:
        return f"{self.m}_{self.n}_{self.k}"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


@dataclass(frozen=True)
class Violation:
    """One broken source or link rule: which rule, where (1-based line, 0 when not tied to a line), why."""

    rule: str
    line: int
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}[{self.rule}] {self.message}"


@dataclass(frozen=True)
class KernelResources:
    """ptxas -v figures for one kernel (bytes unless stated)."""

    name: str
    arch: str
    registers: int
    smem_bytes: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    cmem_bytes: int = 0


@dataclass(frozen=True)
class CompileResult:
    """What compiling one source for one target produced."""

    status: Status  # COMPILED, COMPILE_ERROR, TIMEOUT or INTERNAL_ERROR
    reason: str
    key: str  # content address: sha256 over source, flags, nvcc version, arch, evaluator version
    arch: str  # e.g. sm_90a
    lib_path: str | None  # the cached shared library, None unless COMPILED
    seconds: float  # wall time of nvcc (0 on a cache hit)
    cached: bool
    log: str  # trimmed compiler output, for feedback to a policy
    kernels: tuple[KernelResources, ...] = ()


@dataclass(frozen=True)
class Timing:
    """Distribution of one kernel's per-call device time, microseconds."""

    median_us: float
    min_us: float
    p10_us: float
    p90_us: float
    p99_us: float
    spread: float  # (p90 - p10) / median, dimensionless
    reps: int


@dataclass(frozen=True)
class PairedSpeedup:
    """The candidate's speedup over one baseline, paired by repetition: quantiles over r of baseline_r / candidate_r
    (dimensionless, >1 means the candidate is faster). Both samples of a pair were timed in the same repetition, so
    a shift of the GPU's state between repetitions cancels in the ratio (see harness.cu `paired_json`)."""

    median: float
    p10: float
    p90: float
    reps: int


@dataclass(frozen=True)
class ShapeResult:
    """Outcome of one candidate on one task."""

    task: Task
    status: Status
    reason: str
    max_rel_err: float | None = None  # worst relative Frobenius error over the random checks
    timings: dict[str, Timing] = field(default_factory=dict)  # "candidate", "cublas", "cublaslt_heuristic", ...
    graph: bool | None = None  # offline timing used CUDA-graph replay
    checks: tuple[str, ...] = ()  # names of the runtime checks that ran and passed
    notes: tuple[str, ...] = ()  # e.g. sandbox measures the machine did not permit
    # baseline name -> paired speedup; empty for results measured before the harness reported it (store rows
    # older than 2026-12-03's thirtieth session) and for baseline-only runs
    paired: dict[str, PairedSpeedup] = field(default_factory=dict)

    def speedup(self, baseline: str) -> float | None:
        """Baseline median time over candidate median time (>1 means the candidate is faster)."""
        cand, base = self.timings.get("candidate"), self.timings.get(baseline)
        if cand is None or base is None or cand.median_us <= 0:
            return None
        return base.median_us / cand.median_us

    def speedups(self) -> dict[str, float]:
        out = {}
        for name in self.timings:
            if name != "candidate":
                s = self.speedup(name)
                if s is not None:
                    out[name] = s
        return out

    def paired_speedup(self, baseline: str) -> float | None:
        """Median over repetitions of baseline_r / candidate_r, or None where it was not measured."""
        p = self.paired.get(baseline)
        return p.median if p is not None else None

    def paired_speedups(self) -> dict[str, float]:
        """Baseline name -> paired speedup (its median over repetitions), for the baselines that have one."""
        return {name: p.median for name, p in self.paired.items()}


@dataclass(frozen=True)
class EvalResult:
    """Outcome of one candidate source over one or more tasks."""

    source_hash: str
    gpu: str  # e.g. "NVIDIA H200 (sm_90a)" or "cpu (compile-only)"
    evaluator_version: str
    compile: CompileResult | None  # None when static checks rejected the source before compiling
    shapes: tuple[ShapeResult, ...]
    violations: tuple[Violation, ...] = ()

    @property
    def ok(self) -> bool:
        return bool(self.shapes) and all(s.status.success for s in self.shapes)


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, enums and tuples to plain JSON types (for --json output and the store)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    return obj


def timing_from_json(d: dict) -> Timing:
    return Timing(**d)


def paired_from_json(d: dict | None) -> dict[str, PairedSpeedup]:
    """A result's "paired" object (absent in rows stored before the harness reported it) as typed records."""
    return {k: PairedSpeedup(**v) for k, v in (d or {}).items()}


def shape_result_from_json(d: dict) -> ShapeResult:
    t = d["task"]
    return ShapeResult(
        task=Task(t["m"], t["n"], t["k"], Acc(t["acc"])),
        status=Status(d["status"]),
        reason=d["reason"],
        max_rel_err=d.get("max_rel_err"),
        timings={k: timing_from_json(v) for k, v in (d.get("timings") or {}).items()},
        graph=d.get("graph"),
        checks=tuple(d.get("checks") or ()),
        notes=tuple(d.get("notes") or ()),
        paired=paired_from_json(d.get("paired")),
    )
