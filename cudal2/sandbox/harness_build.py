"""Build the C++ measuring harness once per machine and cache it.

The harness links cuBLAS and cuBLASLt, so it builds only where their headers and libraries exist (a GPU
machine with the CUDA toolkit, or the pip wheels nvidia-cublas*); CPU machines evaluate with --compile-only and
never need it. The cache key covers the harness sources, the nvcc version, the target and the library paths, so
an edit to harness.cu or a toolkit upgrade rebuilds it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

HARNESS_DIR = Path(__file__).parent / "harness"
SOURCES = ("harness.cu", "sandbox.h")


class HarnessBuildError(RuntimeError):
    """The harness could not be built (missing cuBLAS, nvcc failure); the message is one line plus a log tail."""


@dataclass(frozen=True)
class CublasLocation:
    include: Path
    lib: Path


def _candidate_roots() -> list[Path]:
    roots = []
    for var in ("CUDAL2_CUBLAS_HOME", "CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            roots.append(Path(os.environ[var]))
    roots += [Path("/usr/local/cuda"), Path("/usr")]
    for pkg in ("nvidia", "nvidia.cu13", "nvidia.cublas"):  # pip wheels: nvidia/cu13/{include,lib}
        try:
            spec = importlib.util.find_spec(pkg)
        except (ImportError, ValueError):
            spec = None
        for loc in (spec.submodule_search_locations or []) if spec else []:
            roots += [Path(loc), Path(loc) / "cu13", Path(loc) / "cublas"]
    return roots


def find_cublas() -> CublasLocation | None:
    """Where cublas_v2.h and libcublas.so* are, or None."""
    for root in _candidate_roots():
        for inc in (root / "include", root / "targets/x86_64-linux/include"):
            if not (inc / "cublas_v2.h").exists():
                continue
            for lib in (root / "lib64", root / "lib", root / "targets/x86_64-linux/lib", Path("/usr/lib/x86_64-linux-gnu")):
                if any(lib.glob("libcublasLt.so*")) and any(lib.glob("libcublas.so*")):
                    return CublasLocation(inc, lib)
    return None


def _cudart_lib_dir() -> Path | None:
    for d in (Path("/usr/local/cuda/lib64"), Path("/usr/local/cuda/targets/x86_64-linux/lib")):
        if any(d.glob("libcudart.so*")):
            return d
    return None


def _lib_flag(lib: Path, name: str) -> str:
    """-l:libcublas.so.13 style flag (pip wheels ship only the versioned name)."""
    plain = lib / f"lib{name}.so"
    if plain.exists():
        return f"-l{name}"
    versioned = sorted(lib.glob(f"lib{name}.so.*"))
    return f"-l:{versioned[0].name}"


def build_command(out: Path, compute_capability: str, cublas: CublasLocation) -> list[str]:
    cc = compute_capability.replace(".", "")
    rpaths = [str(cublas.lib)] + ([str(d)] if (d := _cudart_lib_dir()) else [])
    cmd = [
        "nvcc", "-O2", "-std=c++17", "--cudart", "shared",
        f"-gencode=arch=compute_{cc},code=sm_{cc}",
        f"-I{cublas.include}", f"-L{cublas.lib}",
        _lib_flag(cublas.lib, "cublas"), _lib_flag(cublas.lib, "cublasLt"), "-ldl",
        # Full RELRO: the harness's imports are bound at start-up and read-only, so a candidate loaded later
        # can neither interpose nor easily patch them.
        "-Xlinker", "-z,now", "-Xlinker", "-z,relro",
    ]
    for r in rpaths:
        cmd += ["-Xlinker", f"-rpath={r}"]
    return cmd + ["-o", str(out), str(HARNESS_DIR / "harness.cu")]


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cudal2" / "harness"


def harness_path(compute_capability: str, cache_root: Path | None = None) -> Path:
    """Build (or reuse) the harness for this machine and return its path. Raises HarnessBuildError."""
    cublas = find_cublas()
    if cublas is None:
        raise HarnessBuildError("cuBLAS headers/libraries not found (set CUDAL2_CUBLAS_HOME or CUDA_HOME)")
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((HARNESS_DIR / name).read_bytes())
    h.update(" ".join(build_command(Path("x"), compute_capability, cublas)).encode())
    h.update(_nvcc_version().encode())
    target = (cache_root or _cache_root()) / h.hexdigest()[:24] / "harness"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        tmp_out = Path(tmp) / "harness"
        proc = subprocess.run(build_command(tmp_out, compute_capability, cublas), capture_output=True, text=True,
                              timeout=600)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-2000:]
            raise HarnessBuildError(f"building the harness failed (nvcc exit {proc.returncode}):\n{tail}")
        os.replace(tmp_out, target)  # atomic: concurrent builders both end with a complete file
    return target


def _nvcc_version() -> str:
    try:
        return subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HarnessBuildError(f"nvcc not usable: {e}") from None
