"""Static checks: source rules (pure Python) and link rules on libraries built by the real nvcc."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from cudal2.sandbox import static_check
from cudal2.sandbox.static_check import (
    MAX_SOURCE_BYTES,
    SOURCE_RULES,
    SYMBOL_ALLOWLIST,
    check_library,
    check_source,
    spells_programmatic_launch,
)

HEADER = """#include <cuda_fp16.h>
#include <cuda_runtime.h>
"""
ENTRY = """extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K,
                            void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    return 0;
}
"""

# A realistic hand-written kernel: cp.async into shared memory, ldmatrix, mma.sync, all as inline PTX.
MMA_KERNEL = r"""#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdio>

namespace {
constexpr int BM = 16, BN = 8, BK = 16;

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
    unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem) {
    unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

__device__ __forceinline__ void ldmatrix_x2(unsigned (&r)[2], const void* smem) {
    unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}

__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One warp per 16x8 tile of C = A * B^T; A is MxK and B is NxK, both row-major.
__global__ void __launch_bounds__(32)
    hgemm_16x8(const half* __restrict__ A, const half* __restrict__ B, half* __restrict__ C, int M, int N, int K) {
    __shared__ __align__(16) half sA[BM * BK];
    __shared__ __align__(16) half sB[BN * BK];
    const int lane = threadIdx.x, m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int k0 = 0; k0 < K; k0 += BK) {
        const int r = lane / 2, c = (lane % 2) * 8;
        cp_async_16(&sA[r * BK + c], &A[static_cast<size_t>(m0 + r) * K + k0 + c]);
        if (lane < 16) cp_async_16(&sB[r * BK + c], &B[static_cast<size_t>(n0 + r) * K + k0 + c]);
        cp_async_wait_all();
        __syncthreads();
        unsigned a[4], b[2];
        ldmatrix_x4(a, &sA[(lane % 16) * BK + (lane / 16) * 8]);
        ldmatrix_x2(b, &sB[(lane % 8) * BK + ((lane / 8) % 2) * 8]);
        mma_16816(acc, a, b);
        __syncthreads();
    }
    const int g = lane / 4, t = lane % 4;
    half* c0 = &C[static_cast<size_t>(m0 + g) * N + n0 + 2 * t];
    half* c1 = &C[static_cast<size_t>(m0 + g + 8) * N + n0 + 2 * t];
    c0[0] = __float2half(acc[0]);
    c0[1] = __float2half(acc[1]);
    c1[0] = __float2half(acc[2]);
    c1[1] = __float2half(acc[3]);
}
}  // namespace

extern "C" size_t cudal2_workspace_bytes(int, int, int) { return 0; }

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    if (M % BM || N % BN || K % BK) return 1;
    cudaFuncSetAttribute(hgemm_16x8, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
    cudaMemsetAsync(C, 0, sizeof(half) * M * N, stream);
    hgemm_16x8<<<dim3(N / BN, M / BM), 32, 0, stream>>>(A, B, C, M, N, K);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) fprintf(stderr, "hgemm_16x8: %s\n", cudaGetErrorString(err));
    return static_cast<int>(err);
}
"""


def with_body(*lines: str) -> str:
    """A valid candidate plus `lines`: inside a host function, except preprocessor lines and lines starting
    with "top:", which go to file scope before the entry point."""
    top = [ln.removeprefix("top:") for ln in lines if ln.startswith(("#", "top:"))]
    body = [ln for ln in lines if not ln.startswith(("#", "top:"))]
    return HEADER + "\n".join(top) + "\n" + ENTRY + "static void helper() {\n" + "\n".join(body) + "\n}\n"


def marked_line(source: str) -> int:
    """1-based line of the first line carrying the marker comment /*HIT*/."""
    return next(i for i, ln in enumerate(source.splitlines(), 1) if "/*HIT*/" in ln)


def rules_at(source: str, line: int) -> set[str]:
    return {v.rule for v in check_source(source) if v.line == line}


SOURCE_CASES = [
    ("vendor_library", "#include <cublas_v2.h> /*HIT*/"),
    ("vendor_library", '#include "cublasLt.h" /*HIT*/'),
    ("vendor_library", "cublasGemmEx(h, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0); /*HIT*/"),
    ("vendor_library", "#include <torch/extension.h> /*HIT*/"),
    ("vendor_library", "at::Tensor t; /*HIT*/"),
    ("dynamic_loading", "void* h = dlopen(nullptr, 2); /*HIT*/"),
    ("dynamic_loading", "#include <dlfcn.h> /*HIT*/"),
    ("dynamic_loading", 'const char* lib = "libcublas.so.13"; /*HIT*/'),
    ("dynamic_loading", "dl_iterate_phdr(cb, nullptr); /*HIT*/"),
    ("threads", "pthread_create(&t, nullptr, worker, nullptr); /*HIT*/"),
    ("threads", "std::thread t([] {}); /*HIT*/"),
    ("threads", "auto f = std :: async(work); /*HIT*/"),
    ("threads", "#include <future> /*HIT*/"),
    ("threads", "#pragma omp parallel for /*HIT*/"),
    ("threads", "cudaLaunchHostFunc(stream, cb, nullptr); /*HIT*/"),
    ("process", "pid_t p = fork(); /*HIT*/"),
    ("process", 'system("nvidia-smi"); /*HIT*/'),
    ("process", 'std::system("ls"); /*HIT*/'),
    ("process", "execve(path, argv, envp); /*HIT*/"),
    ("process", "raise(9); /*HIT*/"),
    ("file_io", 'FILE* f = fopen("out.txt", "w"); /*HIT*/'),
    ("file_io", "int fd = open(path, 0); /*HIT*/"),
    ("file_io", "std::ofstream out(path); /*HIT*/"),
    ("file_io", "#include <fstream> /*HIT*/"),
    ("file_io", "write(1, buf, 4); /*HIT*/"),
    ("file_io", 'fprintf(log, "x"); /*HIT*/'),
    ("file_io", 'fputs("x", log); /*HIT*/'),
    ("file_io", "mmap(nullptr, 4096, 3, 0x22, -1, 0); /*HIT*/"),
    ("network", "int s = socket(2, 1, 0); /*HIT*/"),
    ("network", "#include <sys/socket.h> /*HIT*/"),
    ("network", "curl_easy_init(); /*HIT*/"),
    ("environment", 'const char* v = getenv("HOME"); /*HIT*/'),
    ("environment", "extern char** environ; /*HIT*/"),
    ("environment", "int me = getpid(); /*HIT*/"),
    ("environment", "const char* me = program_invocation_name; /*HIT*/"),
    ("environment", 'const char* p = "/proc/self/cmdline"; /*HIT*/'),
    ("timing_sniffing", "clock_gettime(1, &ts); /*HIT*/"),
    ("timing_sniffing", "auto t0 = std::chrono::steady_clock::now(); /*HIT*/"),
    ("timing_sniffing", "cudaEventRecord(ev, stream); /*HIT*/"),
    ("timing_sniffing", "long t = time(nullptr); /*HIT*/"),
    ("timing_sniffing", "unsigned long long c = __rdtsc(); /*HIT*/"),
    (
        "interposition",
        'top:extern "C" cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) { /*HIT*/\n}',
    ),
    ("interposition", "top:void* malloc(size_t n) { return nullptr; } /*HIT*/"),
    ("interposition", "top:int clock_gettime(int c, struct timespec* t) noexcept { return 0; } /*HIT*/"),
    (
        "interposition",
        "top:static cudaError_t CUDARTAPI\ncudaStreamSynchronize(cudaStream_t s) /*HIT*/\n{ return cudaSuccess; }",
    ),
    ("stream_graph_malloc_sync", "cudaMalloc(&p, 16); /*HIT*/"),
    ("stream_graph_malloc_sync", "cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); /*HIT*/"),
    ("stream_graph_malloc_sync", "cudaDeviceSynchronize(); /*HIT*/"),
    ("stream_graph_malloc_sync", "cudaMemcpyAsync(h, C, 4, cudaMemcpyDeviceToHost, stream); /*HIT*/"),
    ("stream_graph_malloc_sync", "cudaMemcpy(d, s, 4, cudaMemcpyDeviceToDevice); /*HIT*/"),
    ("stream_graph_malloc_sync", "cudaMemset (d, 0, 4); /*HIT*/"),
    ("stream_graph_malloc_sync", "cudaGraphLaunch(g, stream); /*HIT*/"),
    ("stream_graph_malloc_sync", "cudaMallocAsync(&p, 16, stream); /*HIT*/"),
    ("stream_graph_malloc_sync", "cuMemAlloc(&p, 16); /*HIT*/"),
    ("l2_persistence", "cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &v); /*HIT*/"),
    ("l2_persistence", "attr.val.accessPolicyWindow.hitRatio = 1.0f; /*HIT*/"),
    ("l2_persistence", "cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 1 << 20); /*HIT*/"),
    ("driver_entry_point", 'cudaGetDriverEntryPoint("cuMemAlloc", &fn, 0, &q); /*HIT*/'),
    ("driver_entry_point", 'cuGetProcAddress("cuMemAlloc", &fn, 12000, 0, nullptr); /*HIT*/'),
    ("exit_abort", "exit(0); /*HIT*/"),
    ("exit_abort", "_exit(0); /*HIT*/"),
    ("exit_abort", "std::abort(); /*HIT*/"),
    ("exit_abort", "std::terminate(); /*HIT*/"),
    ("exit_abort", "quick_exit(0); /*HIT*/"),
    ("exit_abort", "longjmp(env, 1); /*HIT*/"),
    ("raw_syscall", "syscall(60, 0); /*HIT*/"),
    ("raw_syscall", 'asm volatile("mov $60, %%eax; syscall" ::: "rcx", "r11"); /*HIT*/'),
    ("raw_syscall", '__asm__ __volatile__("int $0x80"); /*HIT*/'),
    ("raw_syscall", 'asm("rdtsc" : "=a"(lo), "=d"(hi)); /*HIT*/'),
    ("raw_syscall", "#include <sys/syscall.h> /*HIT*/"),
]


@pytest.mark.parametrize("rule,line", SOURCE_CASES, ids=[f"{r}-{i}" for i, (r, _) in enumerate(SOURCE_CASES)])
def test_source_rule_reports_rule_and_line(rule, line):
    source = with_body(line)
    assert rule in rules_at(source, marked_line(source)), check_source(source)


def test_every_source_rule_is_exercised_and_explained():
    names = {r.name for r in SOURCE_RULES}
    assert names == {rule for rule, _ in SOURCE_CASES}
    assert all(r.rationale.endswith(".") and len(r.rationale) > 40 for r in SOURCE_RULES)


# Programmatic dependent launch is no violation (evaluator 0.3.0: allowed between the kernels of one call), but a
# source that spells it is told to the harness, which then demands capturable calls to check their graph.
PDL_SPELLINGS = [
    "attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;",
    "attr[0].val.programmaticStreamSerializationAllowed = 1;",
    "cudaGridDependencySynchronize();",
    "gemm.run(stream, nullptr, /*launch_with_pdl=*/true); auto f = launch_with_pdl;",
    "#define CUTLASS_ENABLE_GDC_FOR_SM90",
    'asm volatile("griddepcontrol.wait;" ::: "memory");',
]


@pytest.mark.parametrize("line", PDL_SPELLINGS)
def test_pdl_is_no_violation_but_is_told_to_the_harness(line):
    source = with_body(line)
    assert "programmatic_launch" not in {v.rule for v in check_source(source)}
    assert spells_programmatic_launch(source)


def test_pdl_named_only_in_comments_or_strings_is_not_spelled():
    assert not spells_programmatic_launch(with_body('// cudaLaunchAttributeProgrammaticStreamSerialization\n'
                                                    'printf("griddepcontrol.wait");'))
    assert not spells_programmatic_launch(with_body("int x = 0;"))


NEAR_MISSES = [
    "cudaMemsetAsync(C, 0, 4, stream);",
    "cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 1 << 16);",
    "// cudaMalloc(&p, 16); fork(); exit(1);",
    '/* cudaDeviceSynchronize();\n   system("x"); */',
    'const char* msg = "fork() system( exit( getenv cudaMalloc dlopen";',
    'const char* raw = R"x(fork() exit(0) ")x";',
    'char q = \'"\'; const char* t = "exit(0)";',
    "int exit_code = 0; reexit(exit_code); my_exit(1); obj.exit(2); ptr->kill(3);",
    'printf("time(%d)\\n", 3); puts("ok"); fprintf(stderr, "x %d\\n", 1); fprintf( stdout, "y");',
    'fputs("x", stderr); fwrite(buf, 1, 4, stdout); fflush(stdout);',
    "int n = 1'000'000; unsigned long long big = 0xFFFF'FFFFull;",
    "auto it = std::remove(v.begin(), v.end(), 3); auto f = std::bind(g, 1);",
    "double runtime = 1.0; int opened = 0; int timeout_ms = 3; int fork_count = 0;",
    "static void cuda_check(cudaError_t e) { (void)e; }",
    "#include <cuda/pipeline>",
    "#include <cute/tensor.hpp>",
    "#include <cutlass/gemm/device/gemm_universal_adapter.h>",
    "cudaError_t e = cudaGetLastError(); if (e) return;",
    "int dev = 0; cudaGetDevice(&dev); cudaDeviceGetAttribute(&dev, cudaDevAttrMultiProcessorCount, 0);",
    "cudaLaunchConfig_t cfg = {}; cfg.stream = nullptr;",
]


@pytest.mark.parametrize("snippet", NEAR_MISSES)
def test_near_miss_is_not_flagged(snippet):
    assert check_source(with_body(snippet)) == []


def test_typical_mma_kernel_passes():
    assert check_source(MMA_KERNEL) == []


def test_device_code_with_syncthreads_and_pipeline_passes():
    source = (
        HEADER
        + "#include <cuda/pipeline>\n"
        + ENTRY
        + """
__global__ void k(const half* a, half* c) {
    __shared__ half s[64];
    auto pipe = cuda::make_pipeline();
    pipe.producer_acquire();
    cuda::memcpy_async(s, a, sizeof(s), pipe);
    pipe.producer_commit();
    pipe.consumer_wait();
    __syncthreads();
    long long t0 = clock64();
    c[threadIdx.x] = s[threadIdx.x];
    asm volatile("cp.async.commit_group;\\n" ::);
    asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
    asm volatile("exit;");
    pipe.consumer_release();
}
"""
    )
    assert check_source(source) == []


def test_line_splice_cannot_hide_a_call_and_line_is_the_first():
    source = with_body("cuda\\\nMalloc(&p, 16); /*HIT*/")
    assert rules_at(source, marked_line(source) - 1) == {"stream_graph_malloc_sync"}


def test_comment_does_not_hide_code_after_it():
    source = with_body("/* harmless */ fork(); /*HIT*/", "x = 1; // still harmless")
    assert rules_at(source, marked_line(source)) == {"process"}


@pytest.mark.parametrize(
    "source",
    [
        HEADER + ENTRY.replace('extern "C" ', ""),  # C++ linkage: the harness's dlsym would not find it
        HEADER
        + 'extern "C" int cudal2_hgemm(const half*, const half*, half*, int, int, int, void*, size_t, cudaStream_t);\n',
        HEADER + ENTRY.replace("cudaStream_t stream", "cudaStream_t stream, int extra"),
        HEADER + ENTRY.replace(", cudaStream_t stream", ""),
        HEADER + "/*\n" + ENTRY + "*/\n",
        HEADER + 'const char* s = "' + ENTRY.replace("\n", " ").replace('"', "") + '";\n',
    ],
    ids=["cxx_linkage", "declaration_only", "ten_params", "eight_params", "commented_out", "in_string"],
)
def test_missing_entry_point(source):
    assert [v.rule for v in check_source(source)] == ["missing_entry_point"]


@pytest.mark.parametrize(
    "source",
    [
        HEADER + ENTRY,
        HEADER
        + 'extern "C" {\nsize_t cudal2_workspace_bytes(int M, int N, int K) { return 0; }\n'
        + ENTRY.replace('extern "C" ', "")
        + "}\n",
        HEADER
        + 'extern "C" int cudal2_hgemm(const half*, const half*, half*, int, int, int, void*, size_t, cudaStream_t);\n'
        + ENTRY.replace('extern "C" ', ""),
        HEADER + ENTRY.replace('extern "C" int', 'extern "C" __attribute__((visibility("default"))) int'),
    ],
    ids=["plain", "extern_c_block", "declared_then_defined", "with_attribute"],
)
def test_entry_point_accepted(source):
    assert check_source(source) == []


@pytest.mark.parametrize("unit", ["(", "'", '"', "1'", "fwrite(", 'extern "C" {', "cudal2_hgemm(a,b,c,d,e,f,g,h,i)"])
def test_pathological_sources_stay_linear(unit):
    source = unit * ((MAX_SOURCE_BYTES - 1) // len(unit))
    start = time.monotonic()
    check_source(source)
    assert time.monotonic() - start < 15  # about 1 s here; a quadratic scan would take minutes


def test_oversized_source():
    source = HEADER + ENTRY + "// " + "x" * MAX_SOURCE_BYTES + "\n"
    assert [(v.rule, v.line) for v in check_source(source)] == [("oversized_source", 0)]


# --------------------------------------------------------------------------------------------------------------
# Link layer
# --------------------------------------------------------------------------------------------------------------

NVCC_FLAGS = ["-shared", "-Xcompiler", "-fPIC", "--cudart", "shared", "-gencode", "arch=compute_80,code=sm_80"]

# name -> (source, rule the link layer must report, symbol or function the message must name)
LIBRARY_CASES = {
    "pthread_create": (
        "#include <pthread.h>\nstatic void* work(void*) { return nullptr; }\n",
        "pthread_t t; pthread_create(&t, nullptr, work, nullptr);",
        "forbidden_symbol",
        "'pthread_create'",
    ),
    "dlopen": ("#include <dlfcn.h>\n", 'dlopen("libcublas.so", RTLD_NOW);', "forbidden_symbol", "'dlopen'"),
    "dlopen_macro": (
        "#include <dlfcn.h>\n#define LD(x) dl##x\n",
        'LD(open)("libcublas.so", RTLD_NOW);',
        "forbidden_symbol",
        "'dlopen'",
    ),
    "getenv": ("#include <cstdlib>\n", 'if (getenv("CUDAL2_EVAL")) return 1;', "forbidden_symbol", "'getenv'"),
    "fork": ("#include <unistd.h>\n", "if (M < 0) fork();", "forbidden_symbol", "'fork'"),
    "cudaMalloc": ("", "void* p; cudaMalloc(&p, 16);", "forbidden_symbol", "'cudaMalloc'"),
    "cudaStreamCreateWithFlags": (
        "",
        "cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);",
        "forbidden_symbol",
        "'cudaStreamCreateWithFlags'",
    ),
    "fopen": (
        "#include <cstdio>\n",
        'FILE* f = fopen("/tmp/x", "w"); if (f) fclose(f);',
        "forbidden_symbol",
        "'fopen'",
    ),
    "exit": ("#include <cstdlib>\n", "if (M < 0) exit(0);", "forbidden_symbol", "'exit'"),
    "clock_gettime": (
        "#include <ctime>\n",
        "timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);",
        "forbidden_symbol",
        "'clock_gettime'",
    ),
    "cudaGetDriverEntryPoint": (
        "",
        'void* fn; cudaDriverEntryPointQueryResult q; cudaGetDriverEntryPoint("cuMemAlloc", &fn, 0, &q);',
        "forbidden_symbol",
        "'cudaGetDriverEntryPoint'",
    ),
    "ofstream": ("#include <fstream>\n", 'std::ofstream out("/tmp/x"); out << M;', "forbidden_symbol", "ofstream"),
    "asm_syscall": (
        '__attribute__((noinline)) long raw(long n) { long r; asm volatile("syscall" : "=a"(r) : "a"(n) : "rcx", "r11", "memory");'
        " return r; }\n",
        "if (M < 0) raw(39);",
        "host_instruction",
        "raw(long)",
    ),
    "defined_cudaEventElapsedTime": (
        'extern "C" cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) { *ms = 1e-3f;'
        " return cudaSuccess; }\n",
        "",
        "interposition",
        "'cudaEventElapsedTime'",
    ),
}


def candidate(prelude: str, statement: str) -> str:
    return (
        HEADER + prelude + "__global__ void k(half* c) { c[threadIdx.x] = __float2half(1.f); }\n"
        'extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K,\n'
        "                            void* workspace, size_t workspace_bytes, cudaStream_t stream) {\n"
        f"    {statement}\n    k<<<1, 32, 0, stream>>>(C);\n    return (int)cudaGetLastError();\n}}\n"
    )


def nvcc_build(directory, name: str, source: str) -> str:
    src, lib = directory / f"{name}.cu", directory / f"{name}.so"
    src.write_text(source)
    proc = subprocess.run(["nvcc", *NVCC_FLAGS, "-o", str(lib), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"nvcc failed for {name}:\n{proc.stderr}"
    return str(lib)


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    """Every library case plus the clean kernels, built concurrently (nvcc takes seconds each)."""
    directory = tmp_path_factory.mktemp("libs")
    sources = {name: candidate(prelude, stmt) for name, (prelude, stmt, _, _) in LIBRARY_CASES.items()}
    sources["clean"] = candidate("", "")
    sources["mma_kernel"] = MMA_KERNEL
    with ThreadPoolExecutor(max_workers=8) as pool:
        paths = pool.map(lambda item: nvcc_build(directory, *item), sources.items())
        return dict(zip(sources, paths, strict=True))


@pytest.mark.nvcc
@pytest.mark.parametrize("name", ["clean", "mma_kernel"])
def test_clean_library_passes(libraries, name):
    assert check_library(libraries[name]) == []


@pytest.mark.nvcc
@pytest.mark.parametrize("name", list(LIBRARY_CASES))
def test_link_layer_catches(libraries, name):
    _, _, rule, needle = LIBRARY_CASES[name]
    violations = check_library(libraries[name])
    assert any(v.rule == rule and needle in v.message for v in violations), violations


def test_source_rules_see_what_the_link_layer_needs_for_the_clean_kernel():
    assert check_source(candidate("", "")) == []


@pytest.mark.parametrize(
    "symbol",
    [
        "pthread_create",
        "dlopen",
        "dlsym",
        "fork",
        "execve",
        "system",
        "fopen",
        "open",
        "socket",
        "getenv",
        "environ",
        "exit",
        "_exit",
        "abort",
        "clock_gettime",
        "cudaStreamCreate",
        "cudaStreamCreateWithFlags",
        "cudaMemcpyAsync",
        "cudaMalloc",
        "cudaDeviceSynchronize",
        "cudaGetDriverEntryPoint",
        "cublasGemmEx",
        "cudaStreamSetAttribute",
        "syscall",
        "_ZNSt6thread15_M_start_threadESt10unique_ptrINS_6_StateESt14default_deleteIS1_EEPFvvE",
        "_ZNSt6chrono3_V212steady_clock3nowEv",
        "_ZNSt12__basic_fileIcE4openEPKcSt13_Ios_Openmodei",
        "_ZNSt6localeC1EPKc",
        "fclose",
        "atexit",
        "cudaLaunchHostFunc",
        "cudaEventRecord",
        "cudaEventElapsedTime",
    ],
)
def test_allowlist_denies(symbol):
    assert [v.rule for v in static_check._forbidden_symbols([symbol])] == ["forbidden_symbol"]


@pytest.mark.parametrize(
    "symbol",
    [
        "__cudaRegisterFatBinary",
        "__cudaRegisterFatBinaryEnd",
        "__cudaLaunchKernel",
        "__cudaGetKernel",
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaMemsetAsync",
        "cudaGetDeviceProperties_v2",
        "memcpy",
        "__assert_fail",
        "fwrite",
        "stderr",
        "_Znwm",
        "_ZdlPvm",
        "__cxa_guard_acquire",
        "expf",
        "__expf_finite",
        "_ZSt4cout",
        "_ZNSolsEi",
        "cuTensorMapEncodeTiled",
        "_ZNSt6localeC1Ev",
        "__libc_single_threaded",
        "_ZTTNSt7__cxx1119basic_ostringstreamIcSt11char_traitsIcESaIcEEE",
        "__cudaLaunchKernel_ptsz",
        "__cudaRegisterManagedVar",
        "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
        "__udivti3",  # libgcc 128-bit division: every CUTLASS sm90 GEMM's host code (cudal2/kernels/sm90.py)
    ],
)
def test_allowlist_allows(symbol):
    assert list(static_check._forbidden_symbols([symbol])) == []
    assert any(re.fullmatch(rx, symbol) for rx, _ in SYMBOL_ALLOWLIST)


def test_garbage_and_missing_files_are_violations_not_exceptions(tmp_path):
    garbage = tmp_path / "garbage.so"
    garbage.write_bytes(b"\x7fELF not really" * 64)
    for path in (str(garbage), str(tmp_path / "absent.so")):
        assert [v.rule for v in check_library(path)] == ["unreadable_library"]


def test_missing_binutils_is_reported(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert [v.rule for v in check_library(str(tmp_path / "x.so"))] == ["link_check_unavailable"]


@pytest.mark.parametrize(("source", "expected"), [
    ("#include <cute/tensor.hpp>\n", True),
    ('#  include "cutlass/gemm/device/gemm_universal_adapter.h"\n', True),
    ("// #include <cute/tensor.hpp>\n#include <cuda_fp16.h>\n", False),  # commented out: compiles without them
    ('const char* s = "#include <cutlass/cutlass.h>";\n', False),
    ("#include <cuda_fp16.h>\n#include <mma.h>\n", False),
])
def test_includes_cutlass_sees_only_real_includes(source, expected):
    """The evaluator calls a source that needs the CUTLASS headers an internal_error where they are missing; a
    commented-out include must not turn an ordinary compile error into that (unstored, unpenalised) verdict."""
    assert static_check.includes_cutlass(source) is expected
