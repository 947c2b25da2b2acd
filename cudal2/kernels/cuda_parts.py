"""CUDA source fragments shared by the generated families (sm80_mma, small_mma; sm90_wgmma takes the split-K reduction).

Each constant is a block of readable CUDA C++ that a family pastes into its rendered source, so that the PTX
wrappers, the accumulator fragment and the guarded epilogue are written (and reviewed) once. Nothing here is
parameterised by a config except through the named constants the including source defines before it.
"""

from __future__ import annotations

import string
import textwrap
from typing import Any

from cudal2.kernels.family import shown_fields
from cudal2.sandbox.types import Acc

INCLUDES = """\
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
"""

# The m16n8k16 fragment layouts every mma.sync kernel here relies on, for the header comment.
FRAGMENT_LAYOUTS = """\
Fragment layouts of mma.sync.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4:
  A (16x16, row-major): a0 = (row g, k 2t..2t+1)   a1 = (row g+8, k 2t..2t+1)
                        a2 = (row g, k 2t+8..+9)   a3 = (row g+8, k 2t+8..+9)       (each a .b32 = 2 halves)
  B (16x8, "col" = our [n][k] rows): b0 = (k 2t..2t+1, col g)   b1 = (k 2t+8..+9, col g)
  C/D (16x8): c0, c1 = (row g, cols 2t, 2t+1)   c2, c3 = (row g+8, cols 2t, 2t+1)
      fp32 accumulate: 4 float registers; fp16 accumulate: 2 .b32 registers, each a half2 {c0, c1} / {c2, c3}."""

# A generic pointer into this CTA's shared memory as the 32-bit shared-window address PTX takes.
SMEM_ADDR = """\
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
"""

# PTX wrappers for the cp.async / ldmatrix path (sm80_mma).
ASYNC_COPY_PTX = SMEM_ADDR + """
// 16-byte async copy global -> shared; src_bytes = 0 reads nothing and fills the 16 bytes with zeros.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lanes 8j..8j+7 give the row addresses of matrix j, register j of lane l receives
// row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 of matrix j.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
"""

# PTX wrappers for thread-block clusters (sm_90): a barrier over every thread of the cluster (release/acquire, so
# shared-memory stores before it are visible to every CTA after it), this CTA's rank in the cluster, and an 8-byte
# load from another CTA's shared memory (distributed shared memory: mapa turns our address into theirs).
CLUSTER_PTX = """\
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\\n\\tbarrier.cluster.wait.acquire.aligned;\\n" ::: "memory");
}
__device__ __forceinline__ uint32_t cluster_ctarank() {
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\\n" : "=r"(rank));
    return rank;
}
// The two floats at shared-memory address `addr` (8-byte aligned) of the cluster's CTA `rank`.
__device__ __forceinline__ float2 ld_cluster_f2(uint32_t addr, uint32_t rank) {
    uint32_t remote;
    float2 v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\\n" : "=r"(remote) : "r"(addr), "r"(rank));
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\\n" : "=f"(v.x), "=f"(v.y) : "r"(remote) : "memory");
    return v;
}
"""

# The last-arrival reduction (the small family's grid_k, sm80's reduce=last): the CTAs of one output tile write their fp32
# partials to the workspace and take a ticket; the one that finds every other arrival in sums them, in one launch.
# LAST_ARRIVAL holds the memory primitives (the CPU emulator swaps them for host atomics); LAST_ARRIVAL_SYNC the
# protocol built on them, shared by both families.
# Tickets a library keeps for it (256 KiB of device memory): one per output tile (sm80) or per tile and CTA rank
# (small); a shape needing more takes the family's path without tickets.
MAX_TICKETS = 1 << 16
# The tickets' declaration in a rendered source; cudal2.ops finds the kernels that keep tickets by it.
TICKETS_DECL = "__device__ unsigned int g_tickets[MAX_TICKETS];"
# fence_gpu as rendered: __threadfence() is PTX fence.sc.gpu. The protocols below only pass messages (partials, then
# a ticket), for which release/acquire at GPU scope is enough (fence.acq_rel.gpu, as CUTLASS's GenericBarrier uses);
# benchmarks/fence_ab.py times the rendered kernels with one against the other.
FENCE_GPU_SC = "__device__ __forceinline__ void fence_gpu() { __threadfence(); }\n"
FENCE_GPU_ACQ_REL = '__device__ __forceinline__ void fence_gpu() { asm volatile("fence.acq_rel.gpu;\\n" ::: "memory"); }\n'
LAST_ARRIVAL = FENCE_GPU_SC + """\
// The ticket's value before this arrival; the last of n arrivals reads n - 1.
__device__ __forceinline__ unsigned int ticket_arrive(unsigned int* ticket) { return atomicAdd(ticket, 1u); }
// Called by the last arrival only: the ticket is zero again for the next launch (kernels on a stream do not overlap).
__device__ __forceinline__ void ticket_reset(unsigned int* ticket) { atomicExch(ticket, 0u); }
__device__ __forceinline__ void store_l2_f2(float2* p, float2 v) { __stcg(p, v); }
__device__ __forceinline__ float2 load_l2_f2(const float2* p) { return __ldcg(p); }
__device__ __forceinline__ float load_l2_f(const float* p) { return __ldcg(p); }
"""
LAST_ARRIVAL_SYNC = """\
// Every thread of a CTA calls this after its last workspace write (stored past L1). It returns true, in every thread,
// in the CTA that draws the last of `arrivals` tickets: that CTA has reset the ticket and may read the others'
// writes (past L1). One thread fences and draws after the barrier, as cooperative groups' grid sync and CUTLASS's
// semaphore do: the barrier orders the CTA's writes before thread 0's fence, whose cumulativity makes them visible
// on every SM before the ticket moves; one fence per CTA, not one per thread. `flag`: one int of shared memory.
__device__ __forceinline__ bool last_arrival(unsigned int* ticket, unsigned int arrivals, volatile int* flag) {
    __syncthreads();
    if (threadIdx.x == 0) {
        fence_gpu();
        const bool last = ticket_arrive(ticket) == arrivals - 1;
        if (last) {
            ticket_reset(ticket);
            fence_gpu();  // the other CTAs fenced before their tickets: their writes are visible from here on
        }
        *flag = last;
    }
    __syncthreads();
    return *flag != 0;
}
"""

# The spread reduction (the small family's grid_k with spread): every CTA of a tile waits until all have left their
# partials, then each sums its own share, so no one CTA reads every partial. It waits for other CTAs, so it needs them
# all resident at once: the launch is cooperative (the driver refuses a grid the GPU cannot hold at once).
# TICKET_READ is its memory primitive (the CPU emulator swaps it too); ALL_ARRIVED_SYNC the protocol.
TICKET_READ = """\
__device__ __forceinline__ unsigned int ticket_read(const unsigned int* ticket) {
    return *reinterpret_cast<const volatile unsigned int*>(ticket);  // past L1: another SM's atomics move it
}
"""
ALL_ARRIVED_SYNC = """\
// Every thread of a CTA calls this after its last workspace write (stored past L1). It returns, in every thread, once
// all `arrivals` CTAs of the tile have called it: each may then read the others' writes (past L1). It waits for the
// other CTAs, so they must all be resident (a cooperative launch). The ticket counts the arrivals, then the
// departures (thread 0 of each CTA, after its wait, while the other warps go on): the last departure resets it to
// zero for the next launch, when no CTA of the tile still waits on it. Fences as in last_arrival.
__device__ __forceinline__ void all_arrived(unsigned int* ticket, unsigned int arrivals) {
    __syncthreads();
    if (threadIdx.x == 0) {
        fence_gpu();
        ticket_arrive(ticket);
        while (ticket_read(ticket) < arrivals) {
        }
        fence_gpu();  // the others fenced before they arrived: their writes are visible from here on
    }
    __syncthreads();
    if (threadIdx.x == 0 && ticket_arrive(ticket) == 2 * arrivals - 1) ticket_reset(ticket);
}
"""

# The push-form cluster sums (the small family's push, sm80's reduce=push): an 8-byte store into another CTA's shared
# memory (mapa turns our address into theirs); and a split-phase cluster barrier, whose first phase the small family
# arrives at (relaxed: it orders nothing) when a CTA starts and waits on only before the CTAs write into one another's
# shared memory, so that every CTA is known to run by then at no cost (sm80 stores only after a whole cluster_sync,
# since its inbox overlays the pipeline stages). The second phase is cluster_sync (CLUSTER_PTX).
CLUSTER_PUSH_PTX = """\
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\\n" ::: "memory"); }
// Store the two floats `v` at shared-memory address `addr` (8-byte aligned) of the cluster's CTA `rank`.
__device__ __forceinline__ void st_cluster_f2(uint32_t addr, uint32_t rank, float2 v) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\\n" : "=r"(remote) : "r"(addr), "r"(rank));
    asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\\n" ::"r"(remote), "f"(v.x), "f"(v.y) : "memory");
}
"""

# Thread-block clusters (sm_90): CTAs per cluster without the non-portable opt-in, and with it (CUDA programming guide,
# "Thread Block Clusters": 8 portable, 16 with cudaFuncAttributeNonPortableClusterSizeAllowed).
MAX_PORTABLE_CLUSTER = 8
MAX_CLUSTER = 16


def non_portable_opt_in(kernel: str, cluster_size: str) -> str:
    """Host code opening a launch function that returns int: clusters of 9-16 CTAs allowed for `kernel` (an
    attribute, set once per instantiation), and 1 returned when `cluster_size` (a C++ expression) is over the portable
    size and the GPU refused. A launch the GPU cannot schedule then fails (cudaLaunchKernelEx's error, returned as 1),
    never runs with a smaller cluster. Ends with the indent of the statement it stands before."""
    return f"""// Over {MAX_PORTABLE_CLUSTER} CTAs a cluster needs the non-portable opt-in (sm_90: up to {MAX_CLUSTER}).
    static const bool non_portable = cudaFuncSetAttribute(
        {kernel}, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
    if ({cluster_size} > {MAX_PORTABLE_CLUSTER} && !non_portable) return 1;
    """


_ACC_FP32 = """\
// Accumulator of one m16n8 tile, fp32: c0..c3 as in the fragment layout above.
struct AccFrag {
    float c[4];
};

__device__ __forceinline__ void acc_zero(AccFrag& d) { d.c[0] = d.c[1] = d.c[2] = d.c[3] = 0.0f; }

// D = A * B + D, m16n8k16, A row-major f16, B column-major f16, fp32 accumulate.
__device__ __forceinline__ void mma_16816(AccFrag& d, const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\\n"
        : "+f"(d.c[0]), "+f"(d.c[1]), "+f"(d.c[2]), "+f"(d.c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// v[0], v[1] = (row g, cols 2t, 2t+1); v[2], v[3] = (row g+8, same cols).
__device__ __forceinline__ void acc_to_float(const AccFrag& d, float (&v)[4]) {
    v[0] = d.c[0];
    v[1] = d.c[1];
    v[2] = d.c[2];
    v[3] = d.c[3];
}
"""

_ACC_FP16 = """\
// Accumulator of one m16n8 tile, fp16: c[0] = half2 {c0, c1} (row g), c[1] = half2 {c2, c3} (row g+8).
struct AccFrag {
    uint32_t c[2];
};

__device__ __forceinline__ void acc_zero(AccFrag& d) { d.c[0] = d.c[1] = 0u; }

// D = A * B + D, m16n8k16, A row-major f16, B column-major f16, fp16 accumulate (for fp16-accuracy tasks only).
__device__ __forceinline__ void mma_16816(AccFrag& d, const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 "
        "{%0, %1}, {%2, %3, %4, %5}, {%6, %7}, {%0, %1};\\n"
        : "+r"(d.c[0]), "+r"(d.c[1])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// v[0], v[1] = (row g, cols 2t, 2t+1); v[2], v[3] = (row g+8, same cols). half -> float is exact.
__device__ __forceinline__ void acc_to_float(const AccFrag& d, float (&v)[4]) {
    const float2 lo = __half22float2(reinterpret_cast<const half2&>(d.c[0]));
    const float2 hi = __half22float2(reinterpret_cast<const half2&>(d.c[1]));
    v[0] = lo.x;
    v[1] = lo.y;
    v[2] = hi.x;
    v[3] = hi.y;
}
"""


def accumulator(acc: Acc) -> str:
    """The AccFrag type with acc_zero / mma_16816 / acc_to_float for fp32 or fp16 accumulation."""
    return _ACC_FP32 if acc is Acc.FP32 else _ACC_FP16


STORE_PAIR = """\
// Write (v0, v1) to C[row][col], C[row][col+1] (rounded to nearest even), skipping what lies outside M x N.
// vec: N even and C 4-byte aligned, so an even col < N has col + 1 < N and a 4-byte aligned address.
__device__ __forceinline__ void store_pair(half* __restrict__ C, int M, int N, bool vec, int row, int col,
                                           float v0, float v1) {
    if (row >= M) return;
    half* p = C + (size_t)row * (size_t)N + col;
    if (vec) {
        if (col < N) *reinterpret_cast<half2*>(p) = __floats2half2_rn(v0, v1);
    } else {
        if (col < N) p[0] = __float2half_rn(v0);
        if (col + 1 < N) p[1] = __float2half_rn(v1);
    }
}
"""


def comment_block(text: str) -> str:
    """`text` as `// ` comment lines (blank lines become `//`)."""
    return "\n".join(f"// {line}".rstrip() for line in textwrap.dedent(text).strip("\n").splitlines())


def config_lines(cfg: Any) -> str:
    """One `name = value` line per shown config field (family.shown_fields), for a header comment."""
    def show(v: Any) -> str:
        return str(getattr(v, "value", v))

    return "\n".join(f"  {f.name:<11} = {show(getattr(cfg, f.name))}" for f in shown_fields(cfg))


def constants(rows: list[tuple[str, str, str, str]]) -> str:
    """`constexpr TYPE NAME = VALUE;  // comment` lines, comments aligned: rows of (type, name, value, comment)."""
    code = [f"constexpr {t} {name} = {value};" for t, name, value, _ in rows]
    width = max(len(c) for c in code) + 2
    return "\n".join(f"{c:<{width}}// {comment}" for c, (*_, comment) in zip(code, rows, strict=True))


# The second kernel of split-K through a workspace (sm80_mma, and sm90_wgmma's split-K as a batch): sums the fp32
# partial slices into half C. The including source defines REDUCE_THREADS.
_SPLITK_REDUCE = string.Template("""\
// C[i] = half(sum over splits s = 0, 1, ... of ws[s][i]) over the flattened M*N elements (C's rows are N apart,
// like the slabs'), summed in split order: bitwise reproducible. vec4: MN % 4 == 0, ws 16-byte and C 4-byte aligned.
${batch_note}__global__ void __launch_bounds__(REDUCE_THREADS)
splitk_reduce(const float* __restrict__ ws, half* __restrict__ C, long long MN, int splits, int vec4) {
$wait    const long long stride = (long long)gridDim.x * REDUCE_THREADS;
    const long long first = (long long)blockIdx.x * REDUCE_THREADS + threadIdx.x;
    if (vec4) {
        const float4* w4 = reinterpret_cast<const float4*>(ws);
        const long long quads = MN / 4;
        for (long long q = first; q < quads; q += stride) {
            float4 s = w4[q];
$sum_vec4            half2* c2 = reinterpret_cast<half2*>(C + 4 * q);
            c2[0] = __floats2half2_rn(s.x, s.y);
            c2[1] = __floats2half2_rn(s.z, s.w);
        }
    } else {
        for (long long i = first; i < MN; i += stride) {
            float s = ws[i];
$sum_scalar            C[i] = __float2half_rn(s);
        }
    }
}
""")

# One load, then its add, split after split: a thread waits on memory once per split. Kept for the sources stored
# with it (sm80_mma without split-K renders it too, and never runs it).
_SUM_ONE_BY_ONE = {
    "batch_note": "",
    "sum_vec4": """\
            for (int z = 1; z < splits; ++z) {
                const float4 p = w4[(size_t)z * quads + q];
                s.x += p.x;
                s.y += p.y;
                s.z += p.z;
                s.w += p.w;
            }
""",
    "sum_scalar": """\
            for (int z = 1; z < splits; ++z) s += ws[(size_t)z * MN + i];
""",
}
# REDUCE_BATCH loads in flight before any add (same order of adds): 8 splits of 128x128 took 4.8 us one by one.
_SUM_BATCHED = {
    "batch_note": """\
// The partials are loaded REDUCE_BATCH at a time before any of them is added (in the same order): a thread has that
// many loads in flight, not one.
constexpr int REDUCE_BATCH = 8;
""",
    "sum_vec4": """\
            for (int z0 = 1; z0 < splits; z0 += REDUCE_BATCH) {
                float4 p[REDUCE_BATCH];
#pragma unroll
                for (int j = 0; j < REDUCE_BATCH; ++j) {
                    if (z0 + j < splits) p[j] = w4[(size_t)(z0 + j) * quads + q];
                }
#pragma unroll
                for (int j = 0; j < REDUCE_BATCH; ++j) {
                    if (z0 + j < splits) {
                        s.x += p[j].x;
                        s.y += p[j].y;
                        s.z += p[j].z;
                        s.w += p[j].w;
                    }
                }
            }
""",
    "sum_scalar": """\
            for (int z0 = 1; z0 < splits; z0 += REDUCE_BATCH) {
                float p[REDUCE_BATCH];
#pragma unroll
                for (int j = 0; j < REDUCE_BATCH; ++j) {
                    if (z0 + j < splits) p[j] = ws[(size_t)(z0 + j) * MN + i];
                }
#pragma unroll
                for (int j = 0; j < REDUCE_BATCH; ++j) {
                    if (z0 + j < splits) s += p[j];
                }
            }
""",
}

# With programmatic dependent launch the kernel may start while the GEMM that wrote the partials still runs: it waits
# for that GEMM's writes first (a no-op without PDL, but older sources render without the line).
PDL_WAIT = """    asm volatile("griddepcontrol.wait;" ::: "memory");  // the partials are the GEMM's: wait for them (PDL)
"""
# The GEMM's side, in a hand-written kernel (CUTLASS's own kernels trigger by themselves): from here on its dependent
# kernel may be launched; it still waits in PDL_WAIT for the whole GEMM to finish. One statement, no indentation.
PDL_TRIGGER = 'asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // PDL: the reduction may start'


def pdl_launch_config(grid: str, block: str, indent: str) -> str:
    """Host lines that set up `launch`, a cudaLaunchConfig_t for `stream` whose kernel may start before the kernel
    before it on the stream has finished (programmatic dependent launch); a cudaLaunchKernelEx(&launch, ...) follows.
    `grid`, `block`: C++ expressions; every line starts with `indent`."""
    lines = ("cudaLaunchConfig_t launch = {};", f"launch.gridDim = dim3({grid});", f"launch.blockDim = dim3({block});",
             "launch.stream = stream;", "cudaLaunchAttribute early[1];",
             "early[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;",
             "early[0].val.programmaticStreamSerializationAllowed = 1;", "launch.attrs = early;", "launch.numAttrs = 1;")
    return "".join(f"{indent}{line}\n" for line in lines)


def splitk_reduce(wait: bool = False, batched: bool = False) -> str:
    """splitk_reduce's source; `wait`: it is launched with programmatic dependent launch (sm_90 and later);
    `batched`: it loads several splits' partials before adding them (False: the one-by-one loop of older sources)."""
    sums = _SUM_BATCHED if batched else _SUM_ONE_BY_ONE
    return _SPLITK_REDUCE.substitute(wait=PDL_WAIT if wait else "", **sums)
