"""Compile one candidate source into a shared library with nvcc, behind a content-addressed cache.

What is cached: for each (source, target) the outcome of nvcc, under `cache_dir/<key[:2]>/<key>/`:
`candidate.so` (read-only, 0o444) when it compiled, and `meta.json` (status, reason, sha256 of the library,
nvcc seconds, the untrimmed log, the ptxas figures of each kernel). Compile errors are cached as well: the same
source gives the same error without running nvcc again. Timeouts and internal errors are not cached (they say
something about the machine, not about the source).

The key is sha256 over the source, the exact nvcc flags, the nvcc version line, the target, EVALUATOR_VERSION and
a marker of the CUTLASS headers (a hash of cutlass/version.h): anything that could change the library or the
verdict changes the key. The CUTLASS include dir enters through that marker, not its path, so a cache filled on
one machine serves another with the same nvcc and CUTLASS wherever pip put them (`cudal2 tune --compile-only
--plan-as` fills one on a CPU machine for a GPU run; a served library is still checked against its sha256).

Why an atomic rename: each compile builds in a fresh `tempfile.mkdtemp(dir=cache_dir)` and, once meta.json is
written, renames that directory into place in one step. A reader therefore sees either no entry or a complete
one, never a half-written library, and two workers compiling the same key at once cannot interleave: the
second rename fails, and that worker discards its build and uses the winner's.

Why verify the hash on every hit: the library is loaded and run by the harness, so a cache entry that was
truncated (a full disk, a killed copy) or altered after the fact must not be served. A library whose sha256
differs from meta.json is deleted and recompiled, and the result says so.

An entry's directory mtime is when it was last published or served: a hit refreshes it, so the entries a run used
are those newer than its start (how scripts/precompile.sh keeps its carried pack to the libraries a plan needs).
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import importlib.util
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from cudal2.sandbox.types import EVALUATOR_VERSION, CompileResult, KernelResources, Status

# Flags every target gets. -Xptxas -v prints per-kernel registers / smem / spills (parsed by parse_ptxas);
# --cudart shared keeps the library small and shares the harness's runtime; CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL
# makes CUTLASS call cuTensorMapEncodeTiled directly (resolved by the harness at dlopen time, hence no -z defs).
BASE_FLAGS = (
    "-O3",
    "-std=c++17",
    "-shared",
    "-Xcompiler",
    "-fPIC",
    "--cudart",
    "shared",
    "-Xptxas",
    "-v",
    "--expt-relaxed-constexpr",
    "-DNDEBUG",
    "-DCUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL=1",
    "-lineinfo",
)

SOURCE_NAME = "candidate.cu"
LIB_NAME = "candidate.so"
META_NAME = "meta.json"
STORED_LOG_CHARS = 200_000  # untrimmed log kept in meta.json (trimmed per call to max_log_chars)
MAX_ERRORS_SHOWN = 5
HASH_FAILED = "recompiled: cache entry failed hash verification"
META_CORRUPT = "recompiled: cache entry had an unreadable meta.json"

_ARCH_RE = re.compile(r"sm_(\d{2,3})([af]?)")


def cutlass_include_dir() -> str | None:
    """The CUTLASS/CuTe include dir: $CUDAL2_CUTLASS_INCLUDE if set ('' disables), else nvidia-cutlass's copy.

    The pip package is located with find_spec, without importing it (its import needs packages we do not install).
    """
    env = os.environ.get("CUDAL2_CUTLASS_INCLUDE")
    if env is not None:
        if env and not Path(env, "cutlass").is_dir():
            raise ValueError(f"CUDAL2_CUTLASS_INCLUDE={env!r} has no cutlass/ directory")
        return env or None
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        return None
    include = Path(list(spec.submodule_search_locations)[0], "source", "include")
    return str(include) if (include / "cutlass").is_dir() and (include / "cute").is_dir() else None


def nvcc_flags(arch: str) -> list[str]:
    """The fixed nvcc flags for one target (without -o and the source).

    sm_90a (any sm_XYa / sm_XYf): -gencode=arch=compute_90a,code=sm_90a, SASS only. Not -arch=sm_90a, which also
    runs a plain sm_90 pass that rejects wgmma. Plain sm_XY: SASS plus PTX, e.g.
    -gencode=arch=compute_80,code=[sm_80,compute_80]. Raises ValueError for anything else.
    """
    match = _ARCH_RE.fullmatch(arch) if isinstance(arch, str) else None
    if match is None:
        raise ValueError(f"bad target {arch!r}: expected sm_XY or sm_XYa, e.g. sm_90a or sm_80")
    num, suffix = match.groups()
    if suffix:
        gencode = f"-gencode=arch=compute_{num}{suffix},code=sm_{num}{suffix}"
    else:
        gencode = f"-gencode=arch=compute_{num},code=[sm_{num},compute_{num}]"
    flags = [*BASE_FLAGS, gencode]
    include = cutlass_include_dir()
    if include:
        flags += ["-I", include]
    return flags


def _nvcc_path() -> str:
    path = shutil.which("nvcc")
    if path is None:
        raise FileNotFoundError("nvcc not found on PATH (install the CUDA toolkit or put its bin/ on PATH)")
    return path


@functools.cache
def _version_of(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True, timeout=60).stdout
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    if not lines:
        raise RuntimeError(f"{nvcc} --version printed nothing")
    return lines[-1]


def nvcc_version() -> str:
    """Last line of `nvcc --version`, e.g. 'Build cuda_13.0.r13.0/compiler.36424714_0' (cached per process)."""
    return _version_of(_nvcc_path())


def _cutlass_marker(include: str | None) -> str:
    version_h = Path(include, "cutlass", "version.h") if include else None
    if version_h is None or not version_h.is_file():
        return ""
    return hashlib.sha256(version_h.read_bytes()).hexdigest()


def cache_key(source: str, arch: str, flags: list[str], version: str) -> str:
    """sha256 over everything that can change the library or the verdict (the CUTLASS include path as a placeholder:
    its headers are keyed by their marker)."""
    include = cutlass_include_dir()
    parts = {
        "source": source,
        "flags": ["<cutlass include>" if include is not None and flag == include else flag for flag in flags],
        "nvcc": version,
        "arch": arch,
        "evaluator": EVALUATOR_VERSION,
        "cutlass": _cutlass_marker(include),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------------------------- ptxas -v


_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_FRAME_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"ptxas info\s*: Used (\d+) registers")


def _figure(pattern: str, line: str) -> int:
    match = re.search(pattern, line)
    return int(match.group(1)) if match else 0


@functools.lru_cache(maxsize=4096)
def _demangle_one(name: str) -> str:
    return _demangle((name,))[0]


def _demangle(names: tuple[str, ...]) -> tuple[str, ...]:
    cxxfilt = shutil.which("c++filt")
    if cxxfilt is None or not names:
        return names
    out = subprocess.run([cxxfilt], input="\n".join(names) + "\n", capture_output=True, text=True, check=True).stdout
    demangled = tuple(out.splitlines())
    return demangled if len(demangled) == len(names) else names


def parse_ptxas(log: str, demangle: bool = True) -> tuple[KernelResources, ...]:
    """One KernelResources per entry function per target, from nvcc -Xptxas -v output (nvcc 13.0 format):

        ptxas info    : Compiling entry function '_Z8pressurePfPKfi' for 'sm_90a'
        ptxas info    : Function properties for _Z8pressurePfPKfi
            272 bytes stack frame, 496 bytes spill stores, 496 bytes spill loads
        ptxas info    : Used 32 registers, used 0 barriers, 272 bytes cumulative stack size, 4096 bytes smem

    stack_bytes is the cumulative stack size (callees included) when printed, else the frame. smem is static
    shared memory only (dynamic smem is a launch parameter). Names are demangled with c++filt when present.
    """
    found: dict[tuple[str, str], KernelResources] = {}
    entry: tuple[str, str] | None = None
    props_for, frames = None, {}
    for line in log.splitlines():
        if m := _ENTRY_RE.search(line):
            entry = (m.group(1), m.group(2))
        elif m := _PROPS_RE.search(line):
            props_for = m.group(1)
        elif (m := _FRAME_RE.search(line)) and props_for is not None:
            frames[props_for] = tuple(int(g) for g in m.groups())
        elif (m := _USED_RE.search(line)) and entry is not None:
            frame, stores, loads = frames.get(entry[0], (0, 0, 0))
            stack = max(frame, _figure(r"(\d+) bytes cumulative stack size", line))
            found.setdefault(
                entry,
                KernelResources(
                    name=_demangle_one(entry[0]) if demangle else entry[0],
                    arch=entry[1],
                    registers=int(m.group(1)),
                    smem_bytes=_figure(r"(\d+) bytes smem", line),
                    stack_bytes=stack,
                    spill_store_bytes=stores,
                    spill_load_bytes=loads,
                    cmem_bytes=_figure(r"(\d+) bytes cmem\[0\]", line),
                ),
            )
            entry = None
    return tuple(found.values())


# ------------------------------------------------------------------------------------------------- logs


# Any path ending in /candidate.cu; the lookbehind starts matches only at a token start (linear on long lines).
_PATH_RE = re.compile(r"""(?<![^\s"'(])[^\s"'(]*/""" + re.escape(SOURCE_NAME))
# ptxas info lines are noise, except coded advice such as "(C7515) Potential Performance Loss: wgmma ... serialized".
_NOISE_RE = re.compile(r"^(ptxas info\s*:(?!\s*\(C\d+\))|\s+\d+ bytes stack frame, |Remark: The warnings can be)")
# "candidate.cu(5): error: ...", "error #20014-D: ...", "ptxas error   : ...", "nvcc fatal   : ...", "x.cu:5:3: error: ..."
_ERROR_RE = re.compile(r"\b(error|fatal)(\s+#\d+(-D)?)?\s*:", re.IGNORECASE)
_SUMMARY_RE = re.compile(r"^\d+ errors? detected in the compilation of")


def _blocks(log: str) -> list[str]:
    """Diagnostics: a non-indented line plus the indented context lines (source, caret, instantiation) below it."""
    blocks: list[list[str]] = []
    for line in log.splitlines():
        line = line.rstrip()
        if not line.strip() or _NOISE_RE.match(line):
            continue
        if line[0].isspace() and blocks:
            blocks[-1].append(line)
        else:
            blocks.append([line])
    return list(dict.fromkeys("\n".join(b) for b in blocks))  # drops duplicates, keeps order


def _is_error(block: str) -> bool:
    return bool(_ERROR_RE.search(block.split("\n", 1)[0])) and not _SUMMARY_RE.match(block)


def _select(blocks: list[str]) -> list[str]:
    """With errors: the first MAX_ERRORS_SHOWN error blocks, a count of the rest, the nvcc summary lines."""
    summaries = [b for b in blocks if _SUMMARY_RE.match(b)]
    errors = [b for b in blocks if _is_error(b)]
    if not errors:
        return blocks
    kept = errors[:MAX_ERRORS_SHOWN]
    rest, other = len(errors) - len(kept), len(blocks) - len(errors) - len(summaries)
    if rest or other:
        kept.append(f"... {rest} more error(s) and {other} other message(s) not shown")
    return kept + summaries


def _cap(text: str, max_chars: int) -> str:
    """Head and tail of text with a '... [N chars trimmed] ...' marker, never longer than max_chars."""
    if len(text) <= max_chars:
        return text
    marker_len = len(f"\n... [{len(text)} chars trimmed] ...\n")
    if max_chars <= marker_len:
        return text[:max_chars]
    keep = max_chars - marker_len
    head, tail = keep * 2 // 3, keep - keep * 2 // 3
    marker = f"\n... [{len(text) - head - tail} chars trimmed] ...\n"
    return text[:head] + marker + (text[len(text) - tail :] if tail else "")


def trim_log(log: str, max_chars: int) -> str:
    """What a policy needs to fix an error, in at most max_chars: paths shown as candidate.cu, ptxas info and
    duplicates dropped, the first errors with their context lines kept and the rest counted."""
    text = "\n".join(_select(_blocks(_PATH_RE.sub(SOURCE_NAME, log))))
    return _cap(text, max_chars)


def _first_error(log: str) -> str:
    errors = [b for b in _blocks(log) if _is_error(b)]
    line = errors[0].split("\n", 1)[0] if errors else "nvcc failed without an error message"
    return _cap(line.strip(), 300)


# ------------------------------------------------------------------------------------------------ cache


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _read_meta(entry: Path) -> dict | None:
    """meta.json of an entry, or None when it is missing, unreadable or not a well-formed record."""
    try:
        meta = json.loads((entry / META_NAME).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # a miss: the caller discards the entry and recompiles
    return meta if _well_formed(meta) else None


def _well_formed(meta: object) -> bool:
    required = ("status", "reason", "seconds", "lib_sha256", "log", "kernels")
    if not isinstance(meta, dict) or any(k not in meta for k in required):
        return False
    if meta["status"] not in (Status.COMPILED.value, Status.COMPILE_ERROR.value) or not isinstance(meta["log"], str):
        return False
    fields = {f.name for f in dataclasses.fields(KernelResources)}
    kernels = meta["kernels"]
    return isinstance(kernels, list) and all(isinstance(k, dict) and k.keys() == fields for k in kernels)


def _verified(entry: Path, meta: dict) -> bool:
    if meta["status"] != Status.COMPILED.value:
        return True
    lib = entry / LIB_NAME
    return lib.is_file() and _sha256_file(lib) == meta["lib_sha256"]


def _from_meta(entry: Path, meta: dict, key: str, arch: str, max_log_chars: int, cached: bool) -> CompileResult:
    status = Status(meta["status"])
    return CompileResult(
        status=status,
        reason=meta["reason"],
        key=key,
        arch=arch,
        lib_path=str(entry / LIB_NAME) if status is Status.COMPILED else None,
        seconds=0.0 if cached else meta["seconds"],
        cached=cached,
        log=trim_log(meta["log"], max_log_chars),
        kernels=tuple(KernelResources(**k) for k in meta["kernels"]),
    )


def _discard(entry: Path) -> None:
    """Remove a cache entry: renamed aside first (atomic), so a concurrent reader never sees it half-deleted."""
    trash = Path(tempfile.mkdtemp(dir=entry.parent.parent, prefix=".trash-"))
    try:
        os.rename(entry, trash / "entry")
    except FileNotFoundError:
        pass  # another worker discarded it first
    shutil.rmtree(trash)


def _lookup(entry: Path) -> tuple[dict | None, str]:
    """(meta of a sound entry, "") on a hit; (None, why an entry was discarded, or "") on a miss."""
    if not entry.exists():
        return None, ""
    meta = _read_meta(entry)
    if meta is not None and _verified(entry, meta):
        return meta, ""
    _discard(entry)
    return None, META_CORRUPT if meta is None else HASH_FAILED


# ------------------------------------------------------------------------------------------------- nvcc


def _mark_used(entry: Path) -> None:
    """Set a served entry's mtime to now, so that a cache can be cut to what a run used (scripts/precompile.sh packs
    only the libraries its plan looked up or compiled). A cache on a read-only mount still serves; only this record
    of use is lost there: it is bookkeeping, so no OSError of it (EROFS, EACCES, an entry another worker discarded
    meanwhile) fails a compile that was served."""
    try:
        os.utime(entry)
    except OSError:
        pass


def _limits(memory_limit_bytes: int):
    def apply() -> None:  # runs in the child between fork and exec
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        limit = memory_limit_bytes if hard == resource.RLIM_INFINITY else min(memory_limit_bytes, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _run_nvcc(cmd: list[str], workdir: Path, timeout_s: float, memory_limit_bytes: int) -> tuple[int | None, str]:
    """(return code, merged stdout+stderr); return code None when the wall-clock limit killed the process group."""
    proc = subprocess.Popen(
        cmd,
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "TMPDIR": str(workdir)},
        start_new_session=True,
        preexec_fn=_limits(memory_limit_bytes),
    )
    rc: int | None = None
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
    finally:
        if proc.poll() is None:  # interrupted (e.g. KeyboardInterrupt): leave no compiler behind
            _kill_group(proc)
    return rc, out.decode(errors="replace")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the session leader's pid is its process group id
    except ProcessLookupError:
        pass  # the whole group had already exited
    proc.wait()


def _build(source: str, flags: list[str], build: Path, timeout_s: float, memory_limit_bytes: int) -> dict:
    """Compile in build/work, leaving build/candidate.so when it compiled; returns the meta record."""
    work = build / "work"
    work.mkdir()
    (work / SOURCE_NAME).write_text(source)
    cmd = [_nvcc_path(), *flags, "-o", str(build / LIB_NAME), SOURCE_NAME]
    start = time.monotonic()
    rc, out = _run_nvcc(cmd, work, timeout_s, memory_limit_bytes)
    seconds = time.monotonic() - start
    shutil.rmtree(work)
    log = _cap(_PATH_RE.sub(SOURCE_NAME, out.replace(str(work) + "/", "")), STORED_LOG_CHARS)
    meta = {"seconds": seconds, "log": log, "kernels": [], "lib_sha256": None}
    lib = build / LIB_NAME
    if rc is None:
        return meta | {"status": Status.TIMEOUT.value, "reason": f"nvcc exceeded {timeout_s:g} s and was killed"}
    if rc != 0:
        return meta | {"status": Status.COMPILE_ERROR.value, "reason": _first_error(log)}
    if not lib.is_file():
        return meta | {"status": Status.INTERNAL_ERROR.value, "reason": f"nvcc exited 0 but wrote no {LIB_NAME}"}
    lib.chmod(0o444)
    kernels = [dataclasses.asdict(k) for k in parse_ptxas(out)]
    compiled = {"status": Status.COMPILED.value, "reason": "compiled", "lib_sha256": _sha256_file(lib)}
    return meta | compiled | {"kernels": kernels}


def _publish(build: Path, entry: Path, meta: dict) -> dict:
    """Rename build into place as entry and return the entry's meta; a sound concurrent winner's entry is kept."""
    (build / META_NAME).write_text(json.dumps(meta, indent=1))
    entry.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(build, entry)
        return meta
    except OSError as e:
        if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
    theirs, _ = _lookup(entry)  # discards theirs when it is unsound
    if theirs is None:
        os.rename(build, entry)
        return meta
    return theirs | {"seconds": meta["seconds"]}  # the caller removes our build


def _uncached(key: str, arch: str, status: Status, reason: str, seconds: float, log: str) -> CompileResult:
    return CompileResult(status, reason, key, arch, None, seconds, False, log)


def compile_source(
    source: str,
    arch: str,
    cache_dir: Path,
    timeout_s: float = 180.0,
    max_log_chars: int = 4000,
    memory_limit_bytes: int = 8 << 30,
) -> CompileResult:
    """Compile source for arch (e.g. sm_90a) into a cached shared library; see the module docstring.

    Raises ValueError for a malformed arch (or a bad CUDAL2_CUTLASS_INCLUDE); every other failure is a status.
    """
    flags = nvcc_flags(arch)
    try:
        version = nvcc_version()
    except (OSError, subprocess.SubprocessError, RuntimeError) as e:
        return _uncached("", arch, Status.INTERNAL_ERROR, f"cannot run nvcc: {e}", 0.0, "")
    key = cache_key(source, arch, flags, version)
    cache_dir = Path(cache_dir).resolve()  # nvcc runs in another cwd
    entry = cache_dir / key[:2] / key
    meta, note = _lookup(entry)
    if meta is not None:
        _mark_used(entry)
        return _from_meta(entry, meta, key, arch, max_log_chars, cached=True)
    cache_dir.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".build-"))
    try:
        meta = _build(source, flags, build, timeout_s, memory_limit_bytes)
        status = Status(meta["status"])
        if status in (Status.TIMEOUT, Status.INTERNAL_ERROR):  # says nothing about the source: not cached
            log = trim_log(meta["log"], max_log_chars)
            return _uncached(key, arch, status, meta["reason"], meta["seconds"], log)
        meta = _publish(build, entry, meta)
    except (OSError, subprocess.SubprocessError) as e:
        return _uncached(key, arch, Status.INTERNAL_ERROR, f"compiling failed in the evaluator: {e}", 0.0, "")
    finally:
        if build.exists():  # not published (timeout, error, lost race, interrupt)
            shutil.rmtree(build)
    result = _from_meta(entry, meta, key, arch, max_log_chars, cached=False)
    if not note:
        return result
    reason = note if result.status is Status.COMPILED else f"{note}; {result.reason}"
    return dataclasses.replace(result, reason=reason, log=_cap(f"{note}\n{result.log}", max_log_chars))
