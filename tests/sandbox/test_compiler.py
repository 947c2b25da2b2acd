"""cudal2.sandbox.compiler: flags, the content-addressed cache, timeouts, ptxas parsing and log trimming."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from cudal2.sandbox import compiler
from cudal2.sandbox.compiler import (
    BASE_FLAGS,
    cache_key,
    compile_source,
    cutlass_include_dir,
    nvcc_flags,
    parse_ptxas,
    trim_log,
)
from cudal2.sandbox.types import KernelResources, Status

TINY = """
__global__ void scale(float* p, float s) { p[blockIdx.x * blockDim.x + threadIdx.x] *= s; }
"""

BROKEN = """
__global__ void scale(float* p) {
  p[threadIdx.x] = undefined_thing + 1.0f;
}
"""

# 2^27 distinct instantiations: the front end runs for minutes (a constexpr loop is cut off by EDG's step limit).
BOMB = """
template <int D, int W> struct Bomb {
  static constexpr unsigned long long v = Bomb<D - 1, W * 2>::v + Bomb<D - 1, W * 2 + 1>::v;
};
template <int W> struct Bomb<0, W> { static constexpr unsigned long long v = W; };
static_assert(Bomb<26, 1>::v != 0, "bomb");
__global__ void k(float* p) { p[0] = 1.0f; }
"""

CUTE = """
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>
using namespace cute;
__global__ void cute_copy(cutlass::half_t* out, const cutlass::half_t* in) {
  Tensor g = make_tensor(make_gmem_ptr(in), make_shape(Int<128>{}));
  Tensor o = make_tensor(make_gmem_ptr(out), make_shape(Int<128>{}));
  o(threadIdx.x) = g(threadIdx.x);
}
"""

# Captured from nvcc 13.0 (V13.0.88), one command with
# -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=[sm_80,compute_80] -Xptxas -v, for:
# pressure: __launch_bounds__(1024, 2) with 64 live floats (spills); smem_kernel: 4 KiB static + dynamic smem;
# scale<8, __half>: a template; calls: a __noinline__ callee with a 64-float local array (stack, no spills).
# Note that sm_90a prints no cmem[0] figure, and that `Function properties for _Z6helperf` is no entry function.
REAL_PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z5callsPf' for 'sm_90a'
ptxas info    : Function properties for _Z5callsPf
    256 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 256 bytes cumulative stack size
ptxas info    : Compile time = 10.758 ms
ptxas info    : Function properties for _Z6helperf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z5scaleILi8E6__halfEvPT0_' for 'sm_90a'
ptxas info    : Function properties for _Z5scaleILi8E6__halfEvPT0_
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
ptxas info    : Compile time = 1.951 ms
ptxas info    : Compiling entry function '_Z11smem_kernelPf' for 'sm_90a'
ptxas info    : Function properties for _Z11smem_kernelPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 14 registers, used 1 barriers, 4096 bytes smem
ptxas info    : Compile time = 2.138 ms
ptxas info    : Compiling entry function '_Z8pressurePfPKfi' for 'sm_90a'
ptxas info    : Function properties for _Z8pressurePfPKfi
    272 bytes stack frame, 496 bytes spill stores, 496 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 272 bytes cumulative stack size
ptxas info    : Compile time = 30.836 ms
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z5callsPf' for 'sm_80'
ptxas info    : Function properties for _Z5callsPf
    256 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 256 bytes cumulative stack size, 360 bytes cmem[0]
ptxas info    : Compile time = 6.662 ms
ptxas info    : Function properties for _Z6helperf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z5scaleILi8E6__halfEvPT0_' for 'sm_80'
ptxas info    : Function properties for _Z5scaleILi8E6__halfEvPT0_
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 360 bytes cmem[0]
ptxas info    : Compile time = 1.296 ms
ptxas info    : Compiling entry function '_Z11smem_kernelPf' for 'sm_80'
ptxas info    : Function properties for _Z11smem_kernelPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 4096 bytes smem, 360 bytes cmem[0]
ptxas info    : Compile time = 1.583 ms
ptxas info    : Compiling entry function '_Z8pressurePfPKfi' for 'sm_80'
ptxas info    : Function properties for _Z8pressurePfPKfi
    272 bytes stack frame, 488 bytes spill stores, 488 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 272 bytes cumulative stack size, 372 bytes cmem[0]
ptxas info    : Compile time = 23.187 ms
"""

K = KernelResources
EXPECTED_KERNELS = (
    # name, arch, registers, smem, stack, spill stores, spill loads, cmem[0]
    K("_Z5callsPf", "sm_90a", 40, 0, 256, 0, 0, 0),
    K("_Z5scaleILi8E6__halfEvPT0_", "sm_90a", 8, 0, 0, 0, 0, 0),
    K("_Z11smem_kernelPf", "sm_90a", 14, 4096, 0, 0, 0, 0),
    K("_Z8pressurePfPKfi", "sm_90a", 32, 0, 272, 496, 496, 0),
    K("_Z5callsPf", "sm_80", 32, 0, 256, 0, 0, 360),
    K("_Z5scaleILi8E6__halfEvPT0_", "sm_80", 8, 0, 0, 0, 0, 360),
    K("_Z11smem_kernelPf", "sm_80", 10, 4096, 0, 0, 0, 360),
    K("_Z8pressurePfPKfi", "sm_80", 32, 0, 272, 488, 488, 372),
)

# A real nvcc 13.0 error log (the source path as a temp dir would show it), for trimming.
REAL_ERROR_LOG = """\
/tmp/cache/.build-x1y2/work/candidate.cu(5): error: identifier "undefined_thing" is undefined
    p[threadIdx.x] = undefined_thing + 1;
                     ^

/tmp/cache/.build-x1y2/work/candidate.cu(6): error: identifier "another_missing" is undefined
    p[0] = another_missing;
           ^

2 errors detected in the compilation of "/tmp/cache/.build-x1y2/work/candidate.cu".
"""


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.glob("??/*") if p.is_dir())


def leftovers(cache: Path) -> list[Path]:
    return sorted(cache.glob(".*")) if cache.exists() else []


# ------------------------------------------------------------------------------------------------- flags


def test_flags_sm90a_exact(monkeypatch):
    monkeypatch.setenv("CUDAL2_CUTLASS_INCLUDE", "")
    assert nvcc_flags("sm_90a") == [*BASE_FLAGS, "-gencode=arch=compute_90a,code=sm_90a"]
    assert BASE_FLAGS == (
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


@pytest.mark.parametrize(
    "arch, gencode",
    [
        ("sm_90a", "-gencode=arch=compute_90a,code=sm_90a"),
        ("sm_80", "-gencode=arch=compute_80,code=[sm_80,compute_80]"),
        ("sm_89", "-gencode=arch=compute_89,code=[sm_89,compute_89]"),
        ("sm_100a", "-gencode=arch=compute_100a,code=sm_100a"),
    ],
)
def test_flags_per_target(arch, gencode):
    flags = nvcc_flags(arch)
    assert gencode in flags
    assert not any(f.startswith("-arch") for f in flags)
    assert "-z" not in flags and "defs" not in flags


@pytest.mark.parametrize("arch", ["", "sm90", "sm_9", "compute_90", "sm_90a; rm -rf /", "SM_90", "sm_90ab", None])
def test_bad_arch_is_value_error(arch):
    with pytest.raises(ValueError, match="bad target"):
        nvcc_flags(arch)


def test_cutlass_include_env(monkeypatch, tmp_path):
    (tmp_path / "cutlass").mkdir()
    monkeypatch.setenv("CUDAL2_CUTLASS_INCLUDE", str(tmp_path))
    assert cutlass_include_dir() == str(tmp_path)
    assert nvcc_flags("sm_80")[-2:] == ["-I", str(tmp_path)]
    monkeypatch.setenv("CUDAL2_CUTLASS_INCLUDE", str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="CUDAL2_CUTLASS_INCLUDE"):
        nvcc_flags("sm_80")


def test_cache_key_follows_cutlass_headers_not_where_they_are(monkeypatch, tmp_path):
    """A compile cache filled on one machine serves another with the same nvcc and CUTLASS (pip puts the headers in
    different places): the include path does not enter the key, the headers' version marker does."""
    def key_with(include: Path, version: str) -> str:
        (include / "cutlass").mkdir(parents=True, exist_ok=True)
        (include / "cutlass" / "version.h").write_text(version)
        monkeypatch.setenv("CUDAL2_CUTLASS_INCLUDE", str(include))
        return cache_key(TINY, "sm_90a", nvcc_flags("sm_90a"), "Build cuda_13.0")

    here = key_with(tmp_path / "site-packages", "#define CUTLASS_MINOR 2")
    assert key_with(tmp_path / "tmp" / "site", "#define CUTLASS_MINOR 2") == here
    assert key_with(tmp_path / "tmp" / "site", "#define CUTLASS_MINOR 3") != here
    monkeypatch.setenv("CUDAL2_CUTLASS_INCLUDE", "")  # no CUTLASS at all: another key again
    assert cache_key(TINY, "sm_90a", nvcc_flags("sm_90a"), "Build cuda_13.0") != here


def test_cutlass_include_from_pip_package(monkeypatch):
    monkeypatch.delenv("CUDAL2_CUTLASS_INCLUDE", raising=False)
    include = cutlass_include_dir()
    if include is None:
        pytest.skip("nvidia-cutlass is not installed (pip install --no-deps nvidia-cutlass==4.2.0.0)")
    assert include.endswith(os.path.join("cutlass_library", "source", "include"))
    assert Path(include, "cute", "tensor.hpp").is_file()
    assert Path(include, "cutlass", "version.h").is_file()


def test_nvcc_missing_is_internal_error(monkeypatch, tmp_path, cache):
    monkeypatch.setenv("PATH", str(tmp_path))
    result = compile_source(TINY, "sm_90a", cache)
    assert result.status is Status.INTERNAL_ERROR
    assert "nvcc not found on PATH" in result.reason and "\n" not in result.reason
    assert not result.cached and result.lib_path is None


# ------------------------------------------------------------------------------------------ compile + cache


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_compile_then_cache_hit(cache, arch):
    first = compile_source(TINY, arch, cache)
    assert first.status is Status.COMPILED, first.log
    assert not first.cached and first.seconds > 0 and first.arch == arch
    lib = Path(first.lib_path)
    assert lib.is_file() and lib.name == "candidate.so" and lib.parent.name == first.key
    assert lib.parent.parent.name == first.key[:2] and (lib.stat().st_mode & 0o777) == 0o444
    assert [(k.name, k.arch) for k in first.kernels] == [("scale(float*, float)", arch)]
    assert first.kernels[0].registers > 0
    meta = json.loads((lib.parent / "meta.json").read_text())
    assert meta["status"] == "compiled" and meta["kernels"][0]["registers"] == first.kernels[0].registers
    assert leftovers(cache) == []
    os.utime(lib.parent, (1e9, 1e9))  # as tar leaves an unpacked entry: with its archived mtime (2001)

    start = time.monotonic()
    second = compile_source(TINY, arch, cache)
    assert time.monotonic() - start < 0.5
    assert second.cached and second.seconds == 0 and second.lib_path == first.lib_path
    assert lib.parent.stat().st_mtime > time.time() - 60  # a hit marks the entry used (what precompile.sh packs)
    assert (second.status, second.key, second.kernels) == (first.status, first.key, first.kernels)


@pytest.mark.nvcc
def test_key_depends_on_source_and_arch(cache):
    base = compile_source(TINY, "sm_80", cache)
    changed = compile_source(TINY + "\n// a comment\n", "sm_80", cache)
    other_arch = compile_source(TINY, "sm_90a", cache)
    assert len({base.key, changed.key, other_arch.key}) == 3
    assert len({base.lib_path, changed.lib_path, other_arch.lib_path}) == 3
    assert len(entries(cache)) == 3


@pytest.mark.nvcc
def test_compile_error_is_trimmed_and_cached(cache):
    first = compile_source(BROKEN, "sm_90a", cache, max_log_chars=600)
    assert first.status is Status.COMPILE_ERROR and first.lib_path is None and not first.cached
    assert first.reason == 'candidate.cu(3): error: identifier "undefined_thing" is undefined'
    assert "candidate.cu(3): error" in first.log and "undefined_thing + 1.0f" in first.log
    assert str(cache) not in first.log and "ptxas info" not in first.log and len(first.log) <= 600
    second = compile_source(BROKEN, "sm_90a", cache, max_log_chars=600)
    assert second.cached and second.seconds == 0
    assert (second.status, second.reason, second.log, second.key) == (first.status, first.reason, first.log, first.key)
    assert not (Path(entries(cache)[0]) / "candidate.so").exists()


def _overwrite(lib: Path) -> None:
    lib.write_bytes(b"\x7fELF-not-the-library" + lib.read_bytes()[20:])


def _truncate(lib: Path) -> None:
    lib.write_bytes(lib.read_bytes()[:100])


def _delete(lib: Path) -> None:
    lib.unlink()


@pytest.mark.nvcc
@pytest.mark.parametrize("tamper", [_overwrite, _truncate, _delete])
def test_tampered_library_is_recompiled(cache, tamper):
    first = compile_source(TINY, "sm_90a", cache)
    lib = Path(first.lib_path)
    lib.chmod(0o644)
    tamper(lib)
    again = compile_source(TINY, "sm_90a", cache)
    assert again.status is Status.COMPILED and not again.cached and again.seconds > 0
    assert again.reason == "recompiled: cache entry failed hash verification"
    assert again.log.startswith("recompiled: cache entry failed hash verification")
    assert again.lib_path == first.lib_path  # nvcc output is not bit-reproducible (it embeds tmpxft_<pid> names)
    meta = json.loads((lib.parent / "meta.json").read_text())
    assert lib.stat().st_size > 100 and hashlib.sha256(lib.read_bytes()).hexdigest() == meta["lib_sha256"]
    assert compile_source(TINY, "sm_90a", cache).cached
    assert leftovers(cache) == []


@pytest.mark.nvcc
@pytest.mark.parametrize(
    "corrupt",
    [
        lambda meta: "{not json",
        lambda meta: "\udcff",
        lambda meta: "[1, 2]",
        lambda meta: json.dumps({"status": "compiled"}),
        lambda meta: json.dumps(meta | {"status": "timeout"}),
        lambda meta: json.dumps(meta | {"kernels": [{"name": "k"}]}),
    ],
    ids=["not-json", "not-utf8", "not-a-dict", "missing-fields", "bad-status", "bad-kernels"],
)
def test_corrupt_meta_is_a_miss(cache, corrupt):
    first = compile_source(TINY, "sm_80", cache)
    meta_path = Path(first.lib_path).parent / "meta.json"
    meta_path.write_text(corrupt(json.loads(meta_path.read_text())), errors="surrogateescape")
    again = compile_source(TINY, "sm_80", cache)
    assert again.status is Status.COMPILED and not again.cached
    assert again.reason.startswith("recompiled: cache entry had an unreadable meta.json")
    assert compile_source(TINY, "sm_80", cache).cached


@pytest.mark.nvcc
def test_concurrent_compiles_agree(cache):
    source = TINY + "// concurrent\n"
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(compile_source(source, "sm_80", cache))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {r.status for r in results} == {Status.COMPILED}
    assert len({r.lib_path for r in results}) == 1 and Path(results[0].lib_path).is_file()
    assert len(entries(cache)) == 1 and leftovers(cache) == []


@pytest.mark.nvcc
def test_timeout_kills_nvcc_and_is_not_cached(cache):
    start = time.monotonic()
    result = compile_source(BOMB, "sm_90a", cache, timeout_s=2)
    elapsed = time.monotonic() - start
    assert result.status is Status.TIMEOUT, result.log
    assert result.reason == "nvcc exceeded 2 s and was killed"
    assert elapsed < 2 + 5 and result.lib_path is None and not result.cached
    assert entries(cache) == [] and leftovers(cache) == []


@pytest.mark.nvcc
def test_cutlass_headers_compile(cache):
    if cutlass_include_dir() is None:
        pytest.skip("nvidia-cutlass is not installed (pip install --no-deps nvidia-cutlass==4.2.0.0)")
    result = compile_source(CUTE, "sm_90a", cache)
    assert result.status is Status.COMPILED, result.log
    assert [k.name for k in result.kernels] == ["cute_copy(cutlass::half_t*, cutlass::half_t const*)"]


# ----------------------------------------------------------------------------------------------- ptxas -v


def test_parse_ptxas_real_log_exact():
    assert parse_ptxas(REAL_PTXAS_LOG, demangle=False) == EXPECTED_KERNELS


def test_parse_ptxas_demangles():
    if shutil.which("c++filt") is None:
        pytest.skip("c++filt not on PATH")
    names = [k.name for k in parse_ptxas(REAL_PTXAS_LOG)[:4]]
    assert names == [
        "calls(float*)",
        "void scale<8, __half>(__half*)",
        "smem_kernel(float*)",
        "pressure(float*, float const*, int)",
    ]


@pytest.mark.parametrize("log", ["", "nvcc fatal   : Unsupported gpu architecture 'compute_12'", REAL_ERROR_LOG])
def test_parse_ptxas_without_entries(log):
    assert parse_ptxas(log) == ()


def test_parse_ptxas_dedupes_repeated_entries():
    assert parse_ptxas(REAL_PTXAS_LOG * 2, demangle=False) == EXPECTED_KERNELS


# ------------------------------------------------------------------------------------------------ trim_log


def synthetic_log(errors: int) -> str:
    lines = [REAL_PTXAS_LOG, 'candidate.cu(2): warning #177-D: variable "x" was declared but never referenced']
    for i in range(errors):
        block = (
            f'candidate.cu({10 + i}): error: identifier "missing_{i}" is undefined\n    x = missing_{i};\n        ^\n'
        )
        lines += [block, block]  # each error twice, as a second compilation pass prints it
    lines.append(f'{errors} errors detected in the compilation of "candidate.cu".')
    return "\n".join(lines)


@pytest.mark.parametrize("max_chars", [0, 1, 10, 40, 120, 300, 1000, 4000, 100_000])
@pytest.mark.parametrize(
    "log",
    [synthetic_log(30), synthetic_log(1), REAL_ERROR_LOG, REAL_PTXAS_LOG, "x" * 50_000, "/a/candidate.cu " * 5000],
    ids=["30-errors", "1-error", "real-error", "real-ptxas", "one-long-line", "many-paths"],
)
def test_trim_log_respects_budget(log, max_chars):
    assert len(trim_log(log, max_chars)) <= max_chars


@pytest.mark.parametrize("max_chars", [120, 300, 4000])
def test_trim_log_keeps_first_error(max_chars):
    out = trim_log(synthetic_log(30), max_chars)
    assert out.startswith('candidate.cu(10): error: identifier "missing_0" is undefined'[:max_chars])
    assert "ptxas info" not in out and "warning #177" not in out


def test_trim_log_counts_the_rest_and_drops_duplicates():
    out = trim_log(synthetic_log(30), 100_000)
    assert out.count("missing_0;") == 1 and "missing_4;" in out and "missing_5" not in out
    assert "... 25 more error(s) and 1 other message(s) not shown" in out
    assert out.endswith('30 errors detected in the compilation of "candidate.cu".')


@pytest.mark.parametrize(
    "first_error",
    [
        'candidate.cu(2): error: calling a __host__ function("h()") from a __global__ function("k") is not allowed',
        "candidate.cu(7): error #20014-D: calling a __host__ function from a __global__ function is not allowed",
        "ptxas tmpxft_00003ffc_00000000-6_candidate.ptx, line 23; error   : Unknown modifier '.instr'",
        "nvcc fatal   : Unsupported gpu architecture 'compute_12'",
        'candidate.cu(3): catastrophic error: cannot open source file "cutlass/nope.h"',
    ],
)
def test_trim_log_recognises_error_formats(first_error):
    log = 'candidate.cu(1): warning #177-D: variable "x" was declared but never referenced (no error here)\n'
    out = trim_log(f"{log}{first_error}\n    context line\n", 4000)
    assert out.startswith(f"{first_error}\n    context line") and "warning #177" not in out


def test_trim_log_real_error_log():
    out = trim_log(REAL_ERROR_LOG, 4000)
    assert "/tmp/" not in out
    assert out.splitlines()[:3] == [
        'candidate.cu(5): error: identifier "undefined_thing" is undefined',
        "    p[threadIdx.x] = undefined_thing + 1;",
        "                     ^",
    ]
    assert out.endswith('2 errors detected in the compilation of "candidate.cu".')


def test_trim_log_marker_and_warnings_only():
    warnings = "\n".join(f'candidate.cu({i}): warning #177-D: variable "v{i}" unused' for i in range(500))
    out = trim_log(warnings + "\nptxas info    : (C7515) Potential Performance Loss: wgmma serialized", 2000)
    assert len(out) <= 2000 and out.startswith("candidate.cu(0): warning") and "chars trimmed] ..." in out
    assert out.endswith("(C7515) Potential Performance Loss: wgmma serialized")


def test_version_is_last_line_and_cached():
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    assert compiler.nvcc_version().startswith("Build cuda_")
    assert compiler.nvcc_version() is compiler.nvcc_version()
