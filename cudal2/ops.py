"""cudal2.ops: the kernels of an exported library (`cudal2 export`) as a PyTorch op.

    import cudal2.ops
    cudal2.ops.load_library("lib/")          # or $CUDAL2_OPS_LIBRARY, or the default ~/.cache/cudal2/ops
    c = cudal2.ops.hgemm(a, b)               # a [M, K], b [N, K], fp16 CUDA -> c [M, N] = a @ b.T
    y = cudal2.ops.linear(x, w, bias)        # x [..., K], w [N, K] -> y [..., N], like F.linear
    patch = cudal2.ops.patch_linear(model)   # every float16 nn.Linear of a model through cudal2.ops.linear
    patch.remove()                           # and back to torch (or: with cudal2.ops.patch_linear(model): ...)
    print(cudal2.ops.explain(M, N, K))       # which path a shape takes, and why (bias=True: linear's with a bias)

`torch.ops.cudal2.hgemm` is a torch custom op (torch.library) with a fake implementation, so it traces under
torch.compile (dynamic shapes too) and is captured by CUDA graphs; autograd is defined through torch.matmul.
In eager mode without autograd, `hgemm` calls the implementation directly (no dispatcher round trip).

Dispatch, per (M, N, K), decided once and cached (`decide` is the rule, `explain` shows it):

1. exact: the library has a kernel for exactly (M, N, K) whose measured speedup over torch.matmul's path
   (cuBLAS, measured beside it by the evaluator) is at least `min_speedup` (default 1.0) -> that kernel.
   For linear with a bias, the kernel must also save more than the separate bias add costs (`bias_add_us`: F.linear
   fuses the bias into cuBLAS's epilogue; the kernels take none), else F.linear; padded routes likewise.
2. padded: else the nearest larger exported shape S (S >= request in M, N and K; fewest FLOPs) when the
   measurements justify it. We have no measurement at the requested shape, so torch's time there is bounded
   from below by t_torch(S) * flops(request) / flops(S): cuBLAS is assumed to be no more efficient (FLOP/s) on
   the smaller request than on S, which tile quantisation makes true for requests just below S. Padding is
   used only if
       flops(S) <= (1 + PAD_MAX_WASTE) * flops(request)                                 (little wasted work)
       PAD_MARGIN * (t_kernel(S) + padding_us) <= t_torch(S) * flops(request) / flops(S)
   where padding_us is a conservative estimate of the copies: PAD_LAUNCH_US per padded operand (and per sliced
   output) plus the bytes they move at PAD_BYTES_PER_US. The second condition implies t_kernel(S) < t_torch(S).
   Operands are zero-padded (zeros in K leave the product exact); the result is C[:M, :N] of the padded GEMM.
3. torch: else torch.matmul, and also whenever the library is missing or unreadable, was measured on another
   GPU (kernels are only trusted where they were measured), a kernel cannot be built or loaded, its source no
   longer matches the manifest's hash, or a kernel returned non-zero (recorded, warned once, never retried).

Tensors: hgemm and linear take float16 only (TypeError otherwise) on one device; tensors on a non-CUDA device
(CPU) are computed by torch.matmul (explain(..., device="cpu") says so). Non-contiguous or misaligned operands
are copied to contiguous 256-byte-aligned ones (what the evaluator verified the kernels on); linear reshapes
batch dimensions to 2-D. Kernels are built once per source with the evaluator's compiler and its
content-addressed on-disk cache (a hit when this machine evaluated them), then loaded with ctypes and called
with raw pointers on torch.cuda.current_stream(); workspace comes from torch's caching allocator, so calls are
safe to capture. Building happens on the first call of a shape (or all at once: load_library(build=True)):
call each shape once before capturing a CUDA graph, as torch requires for any op. A small-family kernel with
grid_k > 1 or an sm80 one with reduce=last keeps its tiles' tickets in the library's own device memory
(cudal2/kernels/small.py, sm80.py): two of its launches must never overlap (overlapping, the last-arrival sums go
wrong, and a small kernel with spread, whose groups wait for one another, may wait for ever). Eager calls of such a kernel are put in
one order: a call on another stream than the kernel's last first waits for that stream's work (`_in_stream_order`).
Calls under graph capture are not ordered (the capture stream already follows the eager work before it), so a graph
that runs one such kernel on two of its branches, or replays while another stream calls the kernel, is the caller's
to order.

Units: times are microseconds (`_us`), speedups are torch's time over ours (>1: faster than torch.matmul).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib.util
import math
import os
import re
import shutil
import threading
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import torch

from cudal2.export import TORCH_BASELINE, KernelEntry, Manifest, ManifestError, sha256_text
from cudal2.kernels import cuda_parts
from cudal2.sandbox import compiler
from cudal2.sandbox.evaluator import default_cache_dir
from cudal2.sandbox.gpu import GpuInfo
from cudal2.sandbox.types import MAX_DIM, Acc, Status

ENV_LIBRARY = "CUDAL2_OPS_LIBRARY"
MIN_SPEEDUP = 1.0  # an exact kernel measured slower than torch.matmul is never used by default
PAD_MAX_WASTE = 0.25  # padded GEMM may do at most 25% more FLOPs than the request
PAD_MARGIN = 1.05  # padded path must be estimated >= 5% faster than torch's lower bound
PAD_LAUNCH_US = 5.0  # per padded operand or sliced output: allocation + fill + copy launches in eager mode
PAD_BYTES_PER_US = 2.0e6  # 2 TB/s: a conservative copy bandwidth (H200 HBM3e peaks at 4.8 TB/s)
ALIGN_BYTES = 256  # the evaluator's buffers are cudaMalloc'd: 256-byte aligned
_HALF = torch.float16  # a module global: `x.dtype is _HALF` is the cheapest test an eager call can make
# patch_linear, eager calls: a kernel must save this much GPU time per call (us) to pay for the op's extra host time
# over nn.Linear's (5-14 us per call on the H200's host: benchmarks/ops_bench.py, benchmarks/model_bench.py).
EAGER_MIN_SAVING_US = 10.0
# linear with a bias: the kernels take none, so the bias is added by a separate elementwise kernel, where F.linear hands
# it to cuBLAS's epilogue. What that costs over F.linear per call, modelled as launch + bytes / bandwidth with bytes =
# 4 M N (the [M, N] half output read and written): benchmarks/linear_bench.py on the H200 measured 1.0-2.3 us up to
# 512 x 896 and 2.9-91 us at M = 2048-8192 (Qwen2.5's q/k/v); these two constants are within -35%..+55% of all 24
# points.
BIAS_ADD_LAUNCH_US = 1.6
BIAS_ADD_BYTES_PER_US = 1.5e6  # 1.5 TB/s: the broadcast add's measured rate, well under HBM's peak


class LibraryError(ValueError):
    """A kernel library that cannot be used as asked (one line)."""


class Route(str, Enum):
    EXACT = "exact"  # the kernel exported for this very shape
    PADDED = "padded"  # the kernel of a larger exported shape, on zero-padded operands
    TORCH = "torch"  # torch.matmul


@dataclass(frozen=True)
class Decision:
    """Which path one (M, N, K) takes and why. `kernel` is the exported kernel that runs (exact or padded)."""

    m: int
    n: int
    k: int
    route: Route
    reason: str
    kernel: KernelEntry | None = None
    est_speedup: float | None = None  # of the GEMM vs torch.matmul at the requested shape, from the manifest's times
    # GPU time per call saved against torch (us): torch.matmul's time less ours, padding and (for a biased linear) the
    # separate bias add included; negative for a slower kernel forced on (min_speedup < 1); 0 on torch's route
    saving_us: float = 0.0

    def __str__(self) -> str:
        return f"{self.m}_{self.n}_{self.k} -> {_ROUTE_TEXT[self.route]}: {self.reason}"


_ROUTE_TEXT = {Route.EXACT: "cudal2 kernel", Route.PADDED: "cudal2 kernel on padded operands",
               Route.TORCH: "torch.matmul"}


def _torch(m: int, n: int, k: int, reason: str) -> Decision:
    return Decision(m, n, k, Route.TORCH, reason)


def _flops(m: int, n: int, k: int) -> float:
    return 2.0 * m * n * k


def _torch_us(e: KernelEntry) -> float:
    return e.baseline_us[TORCH_BASELINE]


def padding_us(m: int, n: int, k: int, to: KernelEntry) -> float:
    """Estimated cost of running (m, n, k) as the larger shape `to`: zero-padded copies of A [m, k] -> [M', K']
    and B [n, k] -> [N', K'] where they differ, and a contiguous copy of C[:m, :n] when N' != n."""
    copies, moved = 0, 0
    if (m, k) != (to.m, to.k):
        copies, moved = copies + 1, moved + 2 * (m * k + to.m * to.k)  # read + write, 2 bytes per half
    if (n, k) != (to.n, to.k):
        copies, moved = copies + 1, moved + 2 * (n * k + to.n * to.k)
    if n != to.n:
        copies, moved = copies + 1, moved + 2 * 2 * m * n
    return copies * PAD_LAUNCH_US + moved / PAD_BYTES_PER_US


def bias_add_us(m: int, n: int) -> float:
    """Estimated GPU time per call a separate bias add over C [m, n] costs beyond F.linear's fused bias (us)."""
    return BIAS_ADD_LAUNCH_US + 4.0 * m * n / BIAS_ADD_BYTES_PER_US


def _exact(e: KernelEntry, min_speedup: float) -> Decision:
    speedup = _torch_us(e) / e.median_us
    measured = f"{e.median_us:.1f} us vs torch.matmul (cuBLAS) {_torch_us(e):.1f} us = {speedup:.2f}x"
    if speedup < min_speedup:
        return _torch(e.m, e.n, e.k, f"exported kernel {e.file} measured {measured}, below min_speedup "
                                     f"{min_speedup:g}")
    return Decision(e.m, e.n, e.k, Route.EXACT, f"kernel {e.file}: {measured} on {e.gpu} ({e.measured})", e,
                    speedup, _torch_us(e) - e.median_us)


def _padded(m: int, n: int, k: int, e: KernelEntry) -> Decision:
    """Route (m, n, k) to the larger shape of `e` if the rule in the module docstring allows it."""
    waste = _flops(e.m, e.n, e.k) / _flops(m, n, k) - 1
    if waste > PAD_MAX_WASTE:
        return _torch(m, n, k, f"nearest larger exported shape {e.task.mnk} does {waste:.0%} more FLOPs "
                               f"(padding allows {PAD_MAX_WASTE:.0%})")
    torch_floor = _torch_us(e) / (1 + waste)  # t_torch(S) * flops(request) / flops(S)
    ours = e.median_us + padding_us(m, n, k, e)
    estimate = (f"kernel {e.median_us:.1f} us + padding ~{ours - e.median_us:.1f} us vs torch.matmul >= "
                f"{torch_floor:.1f} us (measured {_torch_us(e):.1f} us at {e.task.mnk}, scaled by FLOPs)")
    if PAD_MARGIN * ours > torch_floor:
        return _torch(m, n, k, f"padding to {e.task.mnk} not justified: {estimate}")
    return Decision(m, n, k, Route.PADDED, f"padded to {e.task.mnk}, kernel {e.file}: {estimate}", e,
                    torch_floor / ours, torch_floor - ours)


def _with_bias(d: Decision) -> Decision:
    """`d` for a linear with a bias: the separate bias add's cost comes off the saving; torch's F.linear (bias fused)
    when nothing is left."""
    if d.kernel is None:
        return d
    add = bias_add_us(d.m, d.n)
    if d.saving_us <= add:
        return _torch(d.m, d.n, d.k, f"with a bias: the kernel saves {d.saving_us:.1f} us, the separate bias add "
                                     f"costs ~{add:.1f} us (F.linear fuses it); was: {d.reason}")
    return Decision(d.m, d.n, d.k, d.route, f"{d.reason}; with the bias added after it (~{add:.1f} us)", d.kernel,
                    d.est_speedup, d.saving_us - add)


def decide(manifest: Manifest, m: int, n: int, k: int, device_label: str, *,
           broken: dict[tuple[int, int, int], str] | None = None, min_speedup: float = MIN_SPEEDUP,
           bias: bool = False) -> Decision:
    """The dispatch rule (module docstring) for C[m, n] = A[m, k] @ B[n, k]^T on a GPU labelled `device_label`
    (bias: for linear with a bias, C + bias[n]).

    `broken` maps exported shapes to why their kernel is not usable (failed build or call); those are skipped.
    """
    gemm = _decide_gemm(manifest, m, n, k, device_label, broken or {}, min_speedup)
    return _with_bias(gemm) if bias else gemm


def _decide_gemm(manifest: Manifest, m: int, n: int, k: int, device_label: str,
                 broken: dict[tuple[int, int, int], str], min_speedup: float) -> Decision:
    if not all(1 <= d <= MAX_DIM for d in (m, n, k)):
        return _torch(m, n, k, f"dimensions outside [1, {MAX_DIM}]")
    if device_label != manifest.gpu:
        return _torch(m, n, k, f"the library was measured on {manifest.gpu}, this device is {device_label}; "
                               "kernels are only trusted on the GPU they were measured on")
    exact = manifest.kernel(m, n, k)
    if exact is not None:
        why = broken.get((m, n, k))
        return _torch(m, n, k, f"kernel {exact.file} unusable: {why}") if why else _exact(exact, min_speedup)
    larger = [e for e in manifest.kernels
              if e.m >= m and e.n >= n and e.k >= k and (e.m, e.n, e.k) not in broken]
    if not larger:
        return _torch(m, n, k, f"no exported kernel for {m}_{n}_{k} or any larger shape")
    nearest = min(larger, key=lambda e: (_flops(e.m, e.n, e.k), e.m, e.n, e.k))
    if _torch_us(nearest) / nearest.median_us < min_speedup:
        return _torch(m, n, k, f"nearest larger exported shape {nearest.task.mnk} is itself below min_speedup "
                               f"{min_speedup:g}")
    return _padded(m, n, k, nearest)


# ------------------------------------------------------------------------------------------ building kernels


@dataclass(frozen=True)
class Failure:
    """Why a kernel cannot be built, loaded or used (one line)."""

    reason: str


# In a source, what shows that its tiles meet at tickets in the library's device memory (cuda_parts.LAST_ARRIVAL_SYNC).
TICKETS_MARK = cuda_parts.TICKETS_DECL


@dataclass
class StreamOrder:
    """The stream each device last ran a ticket kernel on (raw handle), and the lock that orders its launches."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    last: dict[int, int] = field(default_factory=dict)  # device index -> stream


@dataclass(frozen=True)
class LoadedKernel:
    """One built kernel library, loaded in this process: the contract's two entry points."""

    lib_path: str
    hgemm: Any  # ctypes function: int cudal2_hgemm(A, B, C, M, N, K, workspace, workspace_bytes, stream)
    workspace_bytes: Any | None  # ctypes function: size_t cudal2_workspace_bytes(M, N, K), if exported
    order: StreamOrder | None = None  # set when the source keeps tickets (TICKETS_MARK): its launches are ordered


def _cuda_major(nvcc_version_line: str) -> int | None:
    match = re.search(r"cuda_(\d+)\.", nvcc_version_line)
    return int(match.group(1)) if match else None


def _runtime_dirs(major: int) -> list[Path]:
    """Where libcudart.so.<major> may be: the toolkit of the nvcc on PATH, CUDA_HOME, pip's nvidia packages."""
    roots = [Path(p) for p in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")) if p]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(Path(nvcc).resolve().parent.parent)
    roots.append(Path("/usr/local/cuda"))
    dirs = [d for r in roots for d in (r / "lib64", r / "lib", r / "targets" / "x86_64-linux" / "lib")]
    spec = importlib.util.find_spec("nvidia")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        dirs += [Path(loc) / f"cu{major}" / "lib", Path(loc) / "cuda_runtime" / "lib"]
    return dirs


def load_cudart() -> str:
    """Load the CUDA runtime the kernels link against (libcudart.so.<nvcc's major>) globally; "" or why not.

    The kernels are built with --cudart shared against nvcc's runtime, which torch may not have loaded (a torch
    built for another CUDA major brings its own; both drive the same primary context)."""
    try:
        major = _cuda_major(compiler.nvcc_version())
    except (OSError, RuntimeError) as e:
        return f"nvcc unusable: {e}"
    if major is None:
        return "cannot tell the CUDA version from nvcc --version"
    name = f"libcudart.so.{major}"
    errors = []
    for candidate in [name, *(str(d / name) for d in _runtime_dirs(major) if (d / name).is_file())]:
        try:
            ctypes.CDLL(candidate, mode=ctypes.RTLD_GLOBAL)
            return ""
        except OSError as e:
            errors.append(str(e))
    return f"cannot load {name}, which the kernels link against: {errors[-1] if errors else 'not found'}"


@functools.cache
def _load_cuda() -> str:
    """The driver (global: CUTLASS's direct driver calls such as cuTensorMapEncodeTiled resolve against it when
    a kernel is loaded, as in the harness) and the runtime, once per process; "" or why not."""
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        return f"CUDA driver unusable: {e}"
    return load_cudart()


def bind(lib_path: str) -> LoadedKernel | Failure:
    """Load a built kernel library into this process (the CUDA runtime must be loaded) and type its entry points."""
    try:
        lib = ctypes.CDLL(lib_path)
    except OSError as e:
        return Failure(f"cannot load {lib_path}: {e}")
    try:
        fn = lib.cudal2_hgemm
    except AttributeError:
        return Failure(f"{lib_path} does not export cudal2_hgemm")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                   ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    ws = getattr(lib, "cudal2_workspace_bytes", None)
    if ws is not None:
        ws.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        ws.restype = ctypes.c_size_t
    return LoadedKernel(lib_path, fn, ws)


def compile_kernel(source_path: Path, source_hash: str, arch: str, cache_dir: Path) -> str | Failure:
    """The built shared library of one exported source (through the evaluator's content-addressed cache), or
    a Failure when the source is unreadable, no longer matches `source_hash`, or does not compile."""
    try:
        source = source_path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        return Failure(f"{source_path}: cannot read ({e.__class__.__name__})")
    if sha256_text(source) != source_hash:
        return Failure(f"{source_path} changed since the export (its sha256 differs from the manifest's)")
    try:
        comp = compiler.compile_source(source, arch, cache_dir)
    except ValueError as e:
        return Failure(f"cannot compile {source_path.name}: {e}")
    if comp.status is not Status.COMPILED:
        return Failure(f"{source_path.name}: {comp.status.value}: {comp.reason}")
    return comp.lib_path


def build_kernel(source_path: Path, source_hash: str, arch: str, cache_dir: Path) -> LoadedKernel | Failure:
    """compile_kernel, then load the library into this process (with the CUDA driver and runtime)."""
    lib_path = compile_kernel(source_path, source_hash, arch, cache_dir)
    if isinstance(lib_path, Failure):
        return lib_path
    problem = _load_cuda()
    if problem:
        return Failure(problem)
    kernel = bind(lib_path)
    if isinstance(kernel, LoadedKernel) and TICKETS_MARK in source_path.read_text():
        return dataclasses.replace(kernel, order=StreamOrder())
    return kernel


class Library:
    """A loaded kernel library: its manifest, the kernels built so far, and the ones that failed."""

    def __init__(self, directory: Path, manifest: Manifest, min_speedup: float = MIN_SPEEDUP,
                 cache_dir: Path | None = None) -> None:
        self.directory = Path(directory)
        self.manifest = manifest
        self.min_speedup = min_speedup
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.broken: dict[tuple[int, int, int], str] = {}  # exported shape -> why its kernel is not used
        self._built: dict[tuple[str, str], LoadedKernel | Failure] = {}  # (source hash, arch) -> kernel / why not
        self._lock = threading.Lock()

    def kernel(self, entry: KernelEntry, arch: str) -> LoadedKernel | None:
        """The built kernel of `entry` for `arch` (built once per source); None, recorded in `broken`, if not."""
        with self._lock:
            key = (entry.source_hash, arch)
            if key not in self._built:
                self._built[key] = build_kernel(self.directory / entry.file, entry.source_hash, arch, self.cache_dir)
            built = self._built[key]
        if isinstance(built, Failure):
            self.mark_broken(entry, f"build failed: {built.reason}")
            return None
        return built

    def mark_broken(self, entry: KernelEntry, reason: str) -> None:
        self.broken[(entry.m, entry.n, entry.k)] = reason

    def decide(self, m: int, n: int, k: int, device_label: str, bias: bool = False) -> Decision:
        return decide(self.manifest, m, n, k, device_label, broken=self.broken, min_speedup=self.min_speedup,
                      bias=bias)


# -------------------------------------------------------------------------------------------- library state


def default_library_dir() -> Path:
    """~/.cache/cudal2/ops (beside the evaluator's build cache): where `load_library()` looks by default."""
    return default_cache_dir().parent / "ops"


def library_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """`path`, else $CUDAL2_OPS_LIBRARY, else default_library_dir()."""
    if path is not None:
        return Path(path).expanduser()
    env = os.environ.get(ENV_LIBRARY)
    return Path(env).expanduser() if env else default_library_dir()


class _State:
    """The process's active library (or why there is none) and the cached per-shape plans."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.library: Library | None = None
        self.problem = ""  # why no library is active, once loading was tried
        self.tried = False
        # (device index, M, N, K, bias) -> the decision and its built kernel (None: torch's route)
        self.plans: dict[tuple[int, int, int, int, bool], tuple[Decision, LoadedKernel | None]] = {}
        # patch_linear's eager route per (device index, x.shape, w.shape, bias dtype or None, eager_min_saving_us),
        # derived from plans
        self.eager: dict[tuple[Any, ...], _Eager] = {}

    def set(self, library: Library | None, problem: str) -> None:
        with self.lock:
            self.library, self.problem, self.tried = library, problem, library is not None or bool(problem)
            self.clear_plans()

    def clear_plans(self) -> None:
        with self.lock:
            self.plans.clear()
            self.eager.clear()

    def active(self) -> Library | str:
        """The active library, loading the default one on first use; else why there is none."""
        with self.lock:
            if not self.tried:
                try:
                    self.set(_open(None, MIN_SPEEDUP, allow_fp16_acc=False), "")
                except (ManifestError, LibraryError) as e:
                    self.set(None, f"no kernel library: {e}")
            return self.library if self.library is not None else self.problem


_STATE = _State()


def _open(path: str | os.PathLike[str] | None, min_speedup: float, allow_fp16_acc: bool,
          cache_dir: Path | None = None) -> Library:
    if not (isinstance(min_speedup, (int, float)) and math.isfinite(min_speedup) and min_speedup >= 0):
        raise LibraryError(f"min_speedup={min_speedup!r} must be a finite number >= 0")
    directory = library_dir(path)
    manifest = Manifest.load(directory)
    if manifest.acc is Acc.FP16 and not allow_fp16_acc:
        raise LibraryError(f"{directory}: kernels accumulate in fp16 (less accurate than torch.matmul); pass "
                           "allow_fp16_acc=True to use them")
    return Library(directory, manifest, min_speedup, cache_dir)


def load_library(path: str | os.PathLike[str] | None = None, *, min_speedup: float = MIN_SPEEDUP,
                 allow_fp16_acc: bool = False, build: bool = False, cache_dir: str | os.PathLike[str] | None = None
                 ) -> Library:
    """Make the library at `path` (else $CUDAL2_OPS_LIBRARY, else default_library_dir()) the active one.

    min_speedup: an exact kernel is used only if measured at least this much faster than torch.matmul.
    allow_fp16_acc: accept a library of fp16-accumulating kernels (less accurate than torch.matmul).
    build: build and load every kernel of the library for the current CUDA device now (instead of on first use);
    failures show in explain(). cache_dir: the build cache (default: the evaluator's, ~/.cache/cudal2/build).
    Raises ManifestError / LibraryError (one line) when the library cannot be used.
    """
    library = _open(path, min_speedup, allow_fp16_acc, Path(cache_dir) if cache_dir is not None else None)
    _STATE.set(library, "")
    if build and torch.cuda.is_available():
        device = torch.cuda.current_device()
        info = _device_info(device)
        if info.label == library.manifest.gpu:
            for entry in library.manifest.kernels:
                library.kernel(entry, info.arch)
    return library


def active_library() -> Library | str:
    """The active library (loading the default one on first use), or why there is none."""
    return _STATE.active()


def unload_library() -> None:
    """Forget the active library; the next call loads the default one again (or falls back to torch)."""
    _STATE.set(None, "")


@functools.cache
def _device_info(index: int) -> GpuInfo:
    """The evaluator's view of CUDA device `index` (its label names the GPU the way the store does)."""
    p = torch.cuda.get_device_properties(index)
    return GpuInfo(index=index, name=p.name, compute_capability=f"{p.major}.{p.minor}", memory_mib=p.total_memory >> 20)


def explain(M: int, N: int, K: int, device: torch.device | str | None = None, *, bias: bool = False) -> Decision:
    """Which path hgemm takes for A [M, K] @ B [N, K]^T on `device` (default: the current CUDA device, or the
    CPU without one), and why; bias=True: the path of linear with a bias. Builds nothing; a kernel that later fails
    to build or run shows up here then."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type != "cuda":
        return _torch(M, N, K, f"tensors on {device.type}: cudal2 kernels run on CUDA devices only")
    if not torch.cuda.is_available():
        return _torch(M, N, K, "no CUDA device available")
    library = _STATE.active()
    if isinstance(library, str):
        return _torch(M, N, K, library)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return library.decide(M, N, K, _device_info(index).label, bias)


# ---------------------------------------------------------------------------------------------- running


def _plan(index: int, m: int, n: int, k: int, bias: bool = False) -> tuple[Decision, LoadedKernel | None]:
    """The cached decision for one shape on one device (bias: linear's, with a bias), with its kernel built;
    failures fall through."""
    key = (index, m, n, k, bias)
    plan = _STATE.plans.get(key)  # the hot path: a dict lookup, no lock (plans are only ever added or cleared)
    if plan is not None:
        return plan
    with _STATE.lock:
        if key in _STATE.plans:
            return _STATE.plans[key]
        library = _STATE.active()
        if isinstance(library, str):
            plan: tuple[Decision, LoadedKernel | None] = (_torch(m, n, k, library), None)
        else:
            info = _device_info(index)
            while True:  # each failed build marks its shape broken, so this ends within len(kernels) rounds
                decision = library.decide(m, n, k, info.label, bias)
                kernel = library.kernel(decision.kernel, info.arch) if decision.kernel is not None else None
                if decision.kernel is None or kernel is not None:
                    break
            plan = (decision, kernel)
        _STATE.plans[key] = plan
        return plan


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """t itself when contiguous and 256-byte aligned (as the evaluator verified kernels), else a fresh copy."""
    if t.is_contiguous() and t.data_ptr() % ALIGN_BYTES == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _zero_pad(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """t [r, c] zero-padded to [rows, cols] (a new contiguous tensor), or t itself when already that shape."""
    if tuple(t.shape) == (rows, cols):
        return t
    return torch.nn.functional.pad(t, (0, cols - t.shape[1], 0, rows - t.shape[0]))


# The current stream's raw handle without building a torch.cuda.Stream object (a few microseconds per call);
# inductor's generated code uses the same accessor.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(index: int) -> int:
    return _RAW_STREAM(index) if _RAW_STREAM is not None else torch.cuda.current_stream(index).cuda_stream


def _launch(kernel: LoadedKernel, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | str:
    """C = A @ B^T by the kernel on the current stream of A's device; the kernel's failure as a string."""
    a, b = _aligned(a), _aligned(b)
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.float16, device=a.device)
    ws_bytes = int(kernel.workspace_bytes(m, n, k)) if kernel.workspace_bytes is not None else 0
    # From the caching allocator: stream-ordered reuse, and from the graph's private pool during capture.
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device=a.device) if ws_bytes else None
    index = a.device.index
    stream = _current_stream(index)

    def call() -> int:
        return kernel.hgemm(a.data_ptr(), b.data_ptr(), c.data_ptr(), m, n, k,
                            ws.data_ptr() if ws is not None else None, ws_bytes, stream)

    rc = call() if kernel.order is None else _in_stream_order(kernel.order, index, stream, call)
    return c if rc == 0 else f"returned {rc} on {m}_{n}_{k}"


def _in_stream_order(order: StreamOrder, index: int, stream: int, launch: Callable[[], int]) -> int:
    """`launch` a ticket kernel after every earlier launch of it on device `index`: where the last one went to
    another stream, the current stream first waits for that stream's work so far (an event recorded there), so no two
    launches overlap and their tickets stay apart. The lock covers the launch, so a thread that waits records its
    event after the launch before it. Not under graph capture, where a wait on a stream outside the capture is
    refused (see the module docstring). The last call's stream must still exist: torch's streams come from a pool
    and are never destroyed; an external stream destroyed between two calls is not supported."""
    with order.lock:
        if not torch.cuda.is_current_stream_capturing():
            last = order.last.get(index)
            if last is not None and last != stream:
                torch.cuda.current_stream(index).wait_stream(torch.cuda.ExternalStream(last, device=index))
            order.last[index] = stream
        return launch()


def _run(decision: Decision, kernel: LoadedKernel, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | str:
    e = decision.kernel
    if decision.route is Route.EXACT:
        return _launch(kernel, a, b)
    c = _launch(kernel, _zero_pad(a, e.m, e.k), _zero_pad(b, e.n, e.k))
    if isinstance(c, str):
        return c
    c = c[: decision.m, : decision.n]  # rows only: still contiguous
    return c if c.is_contiguous() else c.contiguous()


def _torch_hgemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b.t())


def _dispatch(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The op's implementation: validated a [M, K], b [N, K] on one device."""
    m, k = a.shape
    n = b.shape[0]
    if a.device.type != "cuda" or min(m, n, k) == 0:
        return _torch_hgemm(a, b)
    current = torch.cuda.current_device()
    index = a.device.index if a.device.index is not None else current
    decision, kernel = _plan(index, m, n, k)
    if kernel is None:
        return _torch_hgemm(a, b)
    if index == current:
        c = _run(decision, kernel, a, b)
    else:
        with torch.cuda.device(index):
            c = _run(decision, kernel, a, b)
    if isinstance(c, str):
        _kernel_failed(decision, c)
        return _torch_hgemm(a, b)
    return c


def _kernel_failed(decision: Decision, why: str) -> None:
    """A kernel refused a call: never use it again in this process, say so once, explain() shows it."""
    e = decision.kernel
    reason = f"kernel {e.file} {why}"
    with _STATE.lock:
        library = _STATE.library
        if library is not None:
            library.mark_broken(e, reason)
        _STATE.clear_plans()
    warnings.warn(f"cudal2.ops: {reason}; using torch.matmul for it from now on", RuntimeWarning, stacklevel=3)


# ----------------------------------------------------------------------------------------- the torch op


@torch.library.custom_op("cudal2::hgemm", mutates_args=())
def _hgemm_op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _dispatch(a, b)


@_hgemm_op.register_fake
def _hgemm_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[0]))


def _setup_context(ctx: Any, inputs: tuple[torch.Tensor, torch.Tensor], output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    a, b = ctx.saved_tensors
    grad_a = torch.matmul(grad, b) if ctx.needs_input_grad[0] else None  # [M, N] @ [N, K]
    grad_b = torch.matmul(grad.t(), a) if ctx.needs_input_grad[1] else None  # [N, M] @ [M, K]
    return grad_a, grad_b


_hgemm_op.register_autograd(_backward, setup_context=_setup_context)


def _check_half(name: str, **tensors: torch.Tensor) -> None:
    for arg, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"cudal2.ops.{name}: {arg} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float16:
            raise TypeError(f"cudal2.ops.{name}: {arg} is {t.dtype}; cudal2 kernels are float16 HGEMM "
                            "(use torch.matmul for other dtypes)")
    devices = {t.device for t in tensors.values()}  # torch.device compares and hashes without building strings
    if len(devices) > 1:
        raise ValueError(f"cudal2.ops.{name}: tensors on different devices: "
                         f"{', '.join(sorted(str(d) for d in devices))}")


def hgemm(a: torch.Tensor, b_nk: torch.Tensor) -> torch.Tensor:
    """c [M, N] = a [M, K] @ b_nk [N, K]^T, float16 (the candidate contract's layout, F.linear's weights)."""
    _check_half("hgemm", a=a, b_nk=b_nk)
    if a.dim() != 2 or b_nk.dim() != 2 or a.shape[1] != b_nk.shape[1]:
        raise ValueError(f"cudal2.ops.hgemm: expects a [M, K] and b_nk [N, K], got {tuple(a.shape)} and "
                         f"{tuple(b_nk.shape)}")
    return _hgemm(a, b_nk)


def _hgemm(a: torch.Tensor, b_nk: torch.Tensor) -> torch.Tensor:
    """hgemm on validated operands: through the registered op where torch.compile or autograd needs it."""
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and (a.requires_grad or b_nk.requires_grad)):
        return torch.ops.cudal2.hgemm(a, b_nk)
    return _dispatch(a, b_nk)


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [..., N] = x [..., K] @ w [N, K]^T (+ bias [N]), float16; like torch.nn.functional.linear."""
    tensors = {"x": x, "w": w} if bias is None else {"x": x, "w": w, "bias": bias}
    _check_half("linear", **tensors)
    if w.dim() != 2 or x.dim() < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"cudal2.ops.linear: expects x [..., K] and w [N, K], got {tuple(x.shape)} and "
                         f"{tuple(w.shape)}")
    if bias is not None and tuple(bias.shape) != (w.shape[0],):
        raise ValueError(f"cudal2.ops.linear: bias must be [N] = [{w.shape[0]}], got {tuple(bias.shape)}")
    # With a bias, F.linear (cuBLAS adds it in its epilogue) unless the kernel saves more than the separate add costs.
    # Under torch.compile the add is left to the compiler (which may fuse it into what follows); shapes are symbolic.
    if (bias is not None and x.is_cuda and not torch.compiler.is_compiling() and x.numel()
            and _linear_plan(x, w, True)[1] is None):
        return torch.nn.functional.linear(x, w, bias)
    return _linear(x, w, bias)


def _linear_plan(x: torch.Tensor, w: torch.Tensor, bias: bool) -> tuple[Decision, LoadedKernel | None]:
    """_plan of F.linear(x, w[, bias]): x [..., K] (at least one row) on a CUDA device, w [N, K]."""
    return _plan(x.get_device(), x.numel() // x.shape[-1], w.shape[0], w.shape[1], bias)


def _fits(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """What linear would otherwise check per call: x's last dimension is w's K, the bias (if any) is float16."""
    return x.shape[-1] == w.shape[1] and (bias is None or bias.dtype == _HALF)


def _linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """linear on validated operands, through the op (its own dispatch: kernel or torch.matmul), then the bias."""
    y = _hgemm(x.reshape(-1, x.shape[-1]), w).reshape(*x.shape[:-1], w.shape[0])
    return y if bias is None else y + bias


# ------------------------------------------------------------------------------------------ a model's layers


def saving_us(decision: Decision) -> float:
    """GPU time per call the decision's kernel saves over torch by the manifest (us; 0 for torch's route)."""
    return decision.saving_us


class _Eager(Enum):
    """Where a patched nn.Linear call of one shape takes cudal2's kernel."""

    NEVER = 0  # torch's route (explain says so): F.linear, captured or not
    CAPTURED = 1  # a kernel, but it saves less than eager_min_saving_us: only under CUDA-graph capture
    ALWAYS = 2


def _eager_route(key: tuple[Any, ...], x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                 min_saving_us: float) -> _Eager:
    """_Eager for F.linear(x, w, bias), x and w float16 on one CUDA device, cached under `key` (which holds every
    input of this answer but the library's state) until the plans are cleared."""
    route = _Eager.NEVER
    if x.numel() and _fits(x, w, bias):
        decision, kernel = _linear_plan(x, w, bias is not None)
        if kernel is not None:
            route = _Eager.ALWAYS if saving_us(decision) >= min_saving_us else _Eager.CAPTURED
    _STATE.eager[key] = route
    return route


def _patched_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    # Bound to the module (a method, not a closure), so that copy.deepcopy of a patched model binds the copy's own.
    # Eager calls pay this function's host time on every call (the H200's host: ~22 us per nn.Linear call, 0.6 us per
    # capture query; benchmarks/linear_bench.py), so the common case is one dict lookup keyed by the shapes, and the
    # checks that hold per shape (shapes match, the bias's dtype) are made once per key, in _eager_route.
    w, bias = self.weight, self.bias
    # Only float16 on a CUDA device goes through cudal2; F.linear answers (or rejects) the rest as nn.Linear would.
    # (x.is_cuda and get_device(): no torch.device object per call.)
    if x.is_cuda and x.dtype is _HALF and w.dtype is _HALF:
        if torch.compiler.is_compiling():  # every kernel explain picks; the compiler sees the bias add
            if _fits(x, w, bias):
                return _linear(x, w, bias)
            return torch.nn.functional.linear(x, w, bias)
        min_saving = self.cudal2_eager_min_saving_us
        key = (x.get_device(), x.shape, w.shape, None if bias is None else bias.dtype, min_saving)
        route = _STATE.eager.get(key)
        if route is None:
            route = _eager_route(key, x, w, bias, min_saving)
        if route is _Eager.ALWAYS or (route is _Eager.CAPTURED and torch.cuda.is_current_stream_capturing()):
            return _linear(x, w, bias)
    return torch.nn.functional.linear(x, w, bias)


def _is_patched(module: torch.nn.Module) -> bool:
    return getattr(module.__dict__.get("forward"), "__func__", None) is _patched_forward


@dataclass
class LinearPatch:
    """The nn.Linear modules `patch_linear` routed through cudal2.ops.linear (by qualified name), and the ones it
    left alone with why. remove(), or leaving a `with` block, gives every patched module its own forward back."""

    patched: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]  # (qualified name, why)
    _modules: tuple[torch.nn.Linear, ...] = field(repr=False, compare=False)

    def remove(self) -> None:
        for module in self._modules:
            if _is_patched(module):
                del module.forward, module.cudal2_eager_min_saving_us

    def __enter__(self) -> LinearPatch:  # `with patch_linear(model): ...` removes the patch on the way out
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def patch_linear(model: torch.nn.Module, *, eager_min_saving_us: float = EAGER_MIN_SAVING_US) -> LinearPatch:
    """Route the forward of every nn.Linear in `model` with float16 weights through cudal2.ops.linear, so that each
    (M, N, K) it meets takes the active library's kernel where `explain` says so, torch.matmul otherwise. The
    modules stay where they are, with their parameters: state_dict, .to() and autograd are unchanged. Modules whose
    weights are not float16, or whose forward something else replaced, are skipped (listed with why).

    Under CUDA-graph capture or torch.compile every kernel `explain` picks is used (`explain(..., bias=True)` for a
    layer with a bias; under torch.compile every kernel of the bias-less rule, the add left to the compiler). An eager
    call takes the kernel only where the manifest says it saves at least `eager_min_saving_us` of GPU time per call
    (0: wherever `explain` picks it): a call through cudal2.ops costs more host time than nn.Linear's own
    (benchmarks/model_bench.py on the H200: decoder layers 0.90x eager with every kernel used, against 1.01x in a CUDA
    graph), which a host-bound eager forward pays in full and a small GEMM's saving does not cover."""
    patched, skipped, modules = [], [], []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        if module.weight.dtype != torch.float16:
            skipped.append((name, f"weight is {module.weight.dtype}, not torch.float16"))
            continue
        if "forward" in module.__dict__ and not _is_patched(module):
            skipped.append((name, "its forward was replaced already (by something else)"))
            continue
        module.cudal2_eager_min_saving_us = eager_min_saving_us
        module.forward = types.MethodType(_patched_forward, module)
        patched.append(name)
        modules.append(module)
    return LinearPatch(tuple(patched), tuple(skipped), tuple(modules))
