"""Run a generated mma.sync kernel on the CPU: the rendered source, PTX primitives emulated, everything else as is.

There is no GPU on the CI machine, so the families' tiling, predication, swizzle, pipeline, split-K and epilogue are
checked by compiling the *rendered* source with g++ against the CUDA headers (host mode) after swapping only the
inline-PTX wrappers (cudal2.kernels.cuda_parts) for emulations that follow the PTX ISA:

    cp.async.cg 16 B   queued per thread; commit_group closes a group; wait_group N lands all but the newest N
                       groups. A read of a stage before its wait sees the poison shared memory starts with (NaN).
    ldmatrix.x4        warp-collective: lanes 8j..8j+7 give matrix j's row addresses; lane l gets row l/4, halves
                       2(l%4), 2(l%4)+1 of each matrix. Counts 8-row phases whose 16-byte units collide in banks.
    mma.m16n8k16       warp-collective, with the fragment layouts of the PTX ISA (fp32 or fp16 accumulate).
    clusters           barrier.cluster (a std::barrier over every thread of the cluster; its arrive and wait also
                       apart), %cluster_ctarank, and mapa + ld.shared::cluster / st.shared::cluster on another block's
                       shared memory (cudaLaunchKernelEx with a cluster dimension; a plain launch is a grid of 1-block
                       clusters).
    PDL                griddepcontrol.launch_dependents / .wait: nothing to do, a grid runs to its end before the
                       next launch starts (the launch attribute is ignored).
    last arrival       atomicAdd / atomicExch on a ticket as host atomics, __threadfence as a fence, loads and stores
                       past L1 as plain ones (cuda_parts.LAST_ARRIVAL); the protocol over them (LAST_ARRIVAL_SYNC)
                       runs as written; the library's __device__ tickets are a host global, zero at start, so a ticket
                       left nonzero shows in the next call.
    cooperative        a launch with cudaLaunchAttributeCooperative runs every block at once (a ticket's readers spin
                       on an atomic load that yields); the occupancy queries describe a GPU of `sms` SMs holding one
                       block each, and a cooperative grid of more blocks is refused as the driver refuses it.

One OS thread per CUDA thread (std::barrier for __syncthreads and for the warp collectives), the blocks of one
cluster at the same time, each with its own shared memory, clusters one after the other in a shuffled order (new
for every launch; all at once when cooperative), so a kernel that needs its blocks in grid order fails. The driver fills A and B with random
halves, surrounds C and the workspace with guard bands, calls cudal2_hgemm with optional misaligned pointers (one
or more calls, each with the workspace filled with garbage and C with a sentinel first), checks the first result
against a double-precision reference rounded to half and counts the halves where a later call differs from it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cudal2.kernels import cuda_parts
from cudal2.sandbox.types import Acc

_PRELUDE = r"""
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>
using std::max;
using std::min;

extern "C" cudaError_t cudaFuncSetAttribute(const void*, enum cudaFuncAttribute, int) { return cudaSuccess; }
extern "C" cudaError_t cudaGetLastError(void) { return cudaSuccess; }
template <class T>  // the runtime header declares this overload for nvcc only
cudaError_t cudaFuncSetAttribute(T*, enum cudaFuncAttribute, int) { return cudaSuccess; }

// The emulated GPU: EMU_SMS SMs (default 132) of one block each at a time, for the occupancy queries a cooperative
// launch plans with (and the emulator refuses a cooperative grid over SMs x 1, as the driver would).
namespace emu {
long long coresident_blocks() {
    const char* sms = getenv("EMU_SMS");
    return sms ? atoll(sms) : 132;
}
}  // namespace emu
extern "C" cudaError_t cudaGetDevice(int* dev) {
    *dev = 0;
    return cudaSuccess;
}
extern "C" cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int) {
    if (attr == cudaDevAttrMultiProcessorCount) *value = (int)emu::coresident_blocks();
    else if (attr == cudaDevAttrCooperativeLaunch) *value = 1;
    else return cudaErrorInvalidValue;
    return cudaSuccess;
}
template <class T>  // (the runtime header's template overload, for nvcc only, as above)
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, T*, int, size_t) {
    *blocks = 1;
    return cudaSuccess;
}

namespace emu {
constexpr size_t SMEM_CAP = 256 * 1024;
thread_local uint3 tidx, bidx;
thread_local dim3 gdim, bdim;
thread_local unsigned char* smem_base = nullptr;  // this thread's block's shared memory
thread_local unsigned crank = 0;                    // the block's rank in its cluster
thread_local std::barrier<>* cluster_bar = nullptr;
thread_local std::optional<std::barrier<>::arrival_token> cluster_token;  // barrier.cluster.arrive's, until its wait
thread_local std::vector<unsigned char*>* cluster_smem = nullptr;  // by rank
size_t smem_size = 0;
long long bank_conflicts = 0;  // (see below)
unsigned launches = 0;         // seeds each launch's cluster order
unsigned cooperative_launches = 0;  // ldmatrix phases (8 rows) hitting one 16-byte bank group twice

struct Warp {
    std::barrier<>* bar;
    uint32_t addr[32];
    uint32_t a[32][4];
    uint32_t b[32][2];
};
thread_local std::barrier<>* block_bar = nullptr;
thread_local Warp* my_warp = nullptr;
std::mutex mu;

void fail(const char* what) {
    fprintf(stderr, "EMU-FAIL %s (block %u,%u,%u thread %u)\n", what, bidx.x, bidx.y, bidx.z, tidx.x);
    fflush(stderr);
    std::_Exit(4);
}

struct Copy {
    uint32_t dst;
    const void* src;
    bool valid;
};
thread_local std::vector<Copy> open_group;
thread_local std::deque<std::vector<Copy>> committed;

void land(const std::vector<Copy>& g) {
    for (const Copy& c : g) {
        if (c.valid) memcpy(smem_base + c.dst, c.src, 16);
        else memset(smem_base + c.dst, 0, 16);
    }
}
void cp_async(uint32_t dst, const void* src, bool valid) {
    if (dst % 16 != 0 || dst + 16 > smem_size) fail("cp.async destination misaligned or outside shared memory");
    if (valid && reinterpret_cast<uintptr_t>(src) % 16 != 0) fail("cp.async source not 16-byte aligned");
    open_group.push_back(Copy{dst, src, valid});
}
void commit() {
    committed.push_back(open_group);
    open_group.clear();
}
void wait_groups(int n) {
    while ((int)committed.size() > n) {
        land(committed.front());
        committed.pop_front();
    }
}

int lane() { return (int)(tidx.x % 32); }

void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    Warp& w = *my_warp;
    const int l = lane();
    if (addr % 16 != 0 || addr + 16 > smem_size) fail("ldmatrix row address misaligned or outside shared memory");
    w.addr[l] = addr;
    w.bar->arrive_and_wait();
    for (int j = 0; j < 4; ++j) memcpy(&r[j], smem_base + w.addr[8 * j + l / 4] + 4 * (l % 4), 4);
    if (l == 0) {
        for (int j = 0; j < 4; ++j) {
            unsigned seen = 0;
            for (int i = 0; i < 8; ++i) {
                const unsigned unit = 1u << ((w.addr[8 * j + i] / 16) % 8);
                if (seen & unit) {
                    std::lock_guard<std::mutex> lock(mu);
                    ++bank_conflicts;
                    break;
                }
                seen |= unit;
            }
        }
    }
    w.bar->arrive_and_wait();
}

float half_at(uint32_t word, int idx) {
    const unsigned short bits = (unsigned short)(idx ? word >> 16 : word & 0xffff);
    return __half2float(__ushort_as_half(bits));
}
// A (16x16 row-major) element (r, k) and B (16x8, col) element (k, n) out of the warp's deposited fragments.
float a_elem(const Warp& w, int r, int k) {
    return half_at(w.a[(r % 8) * 4 + (k % 8) / 2][(k >= 8 ? 2 : 0) + (r >= 8 ? 1 : 0)], k % 2);
}
float b_elem(const Warp& w, int k, int n) { return half_at(w.b[n * 4 + (k % 8) / 2][k >= 8 ? 1 : 0], k % 2); }

// d[i] += sum_k A[row_i][k] * B[k][col_i] for this lane's 4 outputs (rows g, g, g+8, g+8; cols 2t, 2t+1, ...).
void mma_sums(const uint32_t (&a)[4], const uint32_t (&b)[2], double (&sum)[4]) {
    Warp& w = *my_warp;
    const int l = lane();
    for (int i = 0; i < 4; ++i) w.a[l][i] = a[i];
    w.b[l][0] = b[0];
    w.b[l][1] = b[1];
    w.bar->arrive_and_wait();
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i / 2), col = 2 * t + (i % 2);
        double s = 0;
        for (int k = 0; k < 16; ++k) s += (double)a_elem(w, row, k) * (double)b_elem(w, k, col);
        sum[i] = s;
    }
    w.bar->arrive_and_wait();
}

float2 ld_cluster_f2(uint32_t addr, uint32_t rank) {
    if (rank >= cluster_smem->size()) fail("ld.shared::cluster from a rank outside the cluster");
    if (addr % 8 != 0 || addr + 8 > smem_size) fail("ld.shared::cluster address misaligned or outside shared memory");
    float2 v;
    memcpy(&v, (*cluster_smem)[rank] + addr, 8);
    return v;
}

void st_cluster_f2(uint32_t addr, uint32_t rank, float2 v) {
    if (rank >= cluster_smem->size()) fail("st.shared::cluster to a rank outside the cluster");
    if (addr % 8 != 0 || addr + 8 > smem_size) fail("st.shared::cluster address misaligned or outside shared memory");
    memcpy((*cluster_smem)[rank] + addr, &v, 8);
}

// barrier.cluster split in its two halves: an arrival with no wait pending, then a wait for that arrival's phase.
void cluster_arrive() {
    if (cluster_token) fail("barrier.cluster.arrive twice without a wait");
    cluster_token.emplace(cluster_bar->arrive());
}
void cluster_wait() {
    if (!cluster_token) fail("barrier.cluster.wait without an arrival");
    cluster_bar->wait(std::move(*cluster_token));
    cluster_token.reset();
}

// The clusters starting at `origins` (cluster dims `cl`) at once: each block with its own shared memory (poisoned: NaN
// halves, so a read before the data landed shows up) and its cluster's barrier and shared memory windows.
template <class... P, class... Args>
void run_clusters(void (*kernel)(P...), const std::vector<dim3>& origins, dim3 grid, dim3 block, dim3 cl,
                  Args... args) {
    const unsigned nthreads = block.x * block.y * block.z;
    const unsigned csize = cl.x * cl.y * cl.z;
    struct Cluster {
        std::vector<std::unique_ptr<unsigned char[]>> bufs;
        std::vector<unsigned char*> ptrs;  // by rank
        std::vector<std::unique_ptr<std::barrier<>>> bars;  // by rank, then every warp's
        std::vector<std::vector<Warp>> warps;
        std::unique_ptr<std::barrier<>> cbar;
    };
    std::vector<std::unique_ptr<Cluster>> clusters;
    for (size_t c = 0; c < origins.size(); ++c) {
        auto cluster = std::make_unique<Cluster>();
        cluster->warps.assign(csize, std::vector<Warp>(nthreads / 32));
        for (unsigned b = 0; b < csize; ++b) {
            cluster->bufs.emplace_back(new unsigned char[SMEM_CAP]);
            memset(cluster->bufs.back().get(), 0xff, SMEM_CAP);
            cluster->ptrs.push_back(cluster->bufs.back().get());
            cluster->bars.emplace_back(new std::barrier<>(nthreads));
        }
        for (auto& ws : cluster->warps)
            for (auto& w : ws) {
                cluster->bars.emplace_back(new std::barrier<>(32));
                w.bar = cluster->bars.back().get();
            }
        cluster->cbar.reset(new std::barrier<>(csize * nthreads));
        clusters.push_back(std::move(cluster));
    }
    std::vector<std::thread> threads;
    for (size_t c = 0; c < origins.size(); ++c)
        for (unsigned b = 0; b < csize; ++b)  // rank b = x + y * cl.x + z * cl.x * cl.y, as in CUDA
            for (unsigned t = 0; t < nthreads; ++t)
                threads.emplace_back([&, c, b, t] {
                    Cluster& cluster = *clusters[c];
                    const dim3 o = origins[c];
                    tidx = make_uint3(t, 0, 0);
                    bidx = make_uint3(o.x + b % cl.x, o.y + (b / cl.x) % cl.y, o.z + b / (cl.x * cl.y));
                    gdim = grid;
                    bdim = block;
                    smem_base = cluster.ptrs[b];
                    crank = b;
                    cluster_bar = cluster.cbar.get();
                    cluster_smem = &cluster.ptrs;
                    block_bar = cluster.bars[b].get();
                    my_warp = &cluster.warps[b][t / 32];
                    open_group.clear();
                    committed.clear();
                    kernel(args...);
                    if (cluster_token) fail("barrier.cluster.arrive without its wait at kernel exit");
                    if (!open_group.empty()) fail("cp.async copies never committed");
                    for (const auto& g : committed)
                        if (!g.empty()) fail("cp.async copies still in flight at kernel exit");
                });
    for (auto& th : threads) th.join();
}

// Every block of `grid` (cluster dims `cl`): cluster by cluster in a shuffled order, or with `cooperative` every
// cluster at once (all resident, as a cooperative launch guarantees; refused over coresident_blocks()).
template <class... P, class... Args>
cudaError_t run_grid(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem_bytes, dim3 cl, bool cooperative,
                     Args... args) {
    const unsigned nthreads = block.x * block.y * block.z;
    if (smem_bytes > SMEM_CAP || nthreads % 32 != 0 || grid.x % cl.x || grid.y % cl.y || grid.z % cl.z)
        fail("launch configuration");
    if (cooperative && (long long)grid.x * grid.y * grid.z > coresident_blocks())
        return cudaErrorCooperativeLaunchTooLarge;
    smem_size = smem_bytes;
    std::vector<dim3> origins;  // each cluster's first block
    for (unsigned z0 = 0; z0 < grid.z; z0 += cl.z)
        for (unsigned y0 = 0; y0 < grid.y; y0 += cl.y)
            for (unsigned x0 = 0; x0 < grid.x; x0 += cl.x) origins.push_back(dim3(x0, y0, z0));
    std::mt19937 order_rng(1000 + launches++);
    std::shuffle(origins.begin(), origins.end(), order_rng);
    if (cooperative) {
        ++cooperative_launches;
        run_clusters(kernel, origins, grid, block, cl, args...);
    }
    else
        for (const dim3& o : origins) run_clusters(kernel, std::vector<dim3>{o}, grid, block, cl, args...);
    return cudaSuccess;
}

template <class... P, class... Args>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t, Args... args) {
    run_grid(kernel, grid, block, smem_bytes, dim3(1, 1, 1), false, args...);
}

// A launch config's grid and block, for the kernel source (whose `x.gridDim` the gridDim macro below would eat).
inline dim3& grid_of(cudaLaunchConfig_t& c) { return c.gridDim; }
inline dim3& block_of(cudaLaunchConfig_t& c) { return c.blockDim; }

template <class... P, class... Args>
cudaError_t launch_ex(const cudaLaunchConfig_t* config, void (*kernel)(P...), Args... args) {
    dim3 cl(1, 1, 1);
    bool cooperative = false;
    for (unsigned i = 0; i < config->numAttrs; ++i) {
        if (config->attrs[i].id == cudaLaunchAttributeClusterDimension)
            cl = dim3(config->attrs[i].val.clusterDim.x, config->attrs[i].val.clusterDim.y,
                      config->attrs[i].val.clusterDim.z);
        if (config->attrs[i].id == cudaLaunchAttributeCooperative) cooperative = config->attrs[i].val.cooperative != 0;
    }
    return run_grid(kernel, config->gridDim, config->blockDim, config->dynamicSmemBytes, cl, cooperative, args...);
}
}  // namespace emu

#define threadIdx emu::tidx
#define blockIdx emu::bidx
#define gridDim emu::gdim
#define blockDim emu::bdim
#undef __launch_bounds__
#define __launch_bounds__(...)
#define __syncthreads() emu::block_bar->arrive_and_wait()
template <class T>
T __ldg(const T* p) {
    return *p;
}
"""

_EMU_SMEM_ADDR = """\
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return (uint32_t)(static_cast<const unsigned char*>(p) - emu::smem_base);
}
"""

_EMU_ASYNC = _EMU_SMEM_ADDR + """\
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) { emu::cp_async(dst, src, valid); }
__device__ __forceinline__ void cp_async_commit() { emu::commit(); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { emu::wait_groups(N); }
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) { emu::ldmatrix_x4(r, addr); }
"""

_EMU_CLUSTER = """\
__device__ __forceinline__ void cluster_sync() { emu::cluster_bar->arrive_and_wait(); }
__device__ __forceinline__ uint32_t cluster_ctarank() { return emu::crank; }
__device__ __forceinline__ float2 ld_cluster_f2(uint32_t addr, uint32_t rank) { return emu::ld_cluster_f2(addr, rank); }
"""
_EMU_CLUSTER_PUSH = """\
__device__ __forceinline__ void cluster_arrive_relaxed() { emu::cluster_arrive(); }
__device__ __forceinline__ void cluster_wait() { emu::cluster_wait(); }
__device__ __forceinline__ void st_cluster_f2(uint32_t addr, uint32_t rank, float2 v) { emu::st_cluster_f2(addr, rank, v); }
"""

_EMU_LAST_ARRIVAL = """\
__device__ __forceinline__ void fence_gpu() { std::atomic_thread_fence(std::memory_order_seq_cst); }
__device__ __forceinline__ unsigned int ticket_arrive(unsigned int* t) { return __atomic_fetch_add(t, 1u, __ATOMIC_SEQ_CST); }
__device__ __forceinline__ void ticket_reset(unsigned int* t) { __atomic_store_n(t, 0u, __ATOMIC_SEQ_CST); }
__device__ __forceinline__ void store_l2_f2(float2* p, float2 v) { *p = v; }
__device__ __forceinline__ float2 load_l2_f2(const float2* p) { return *p; }
__device__ __forceinline__ float load_l2_f(const float* p) { return *p; }
"""

_EMU_TICKET_READ = """\
__device__ __forceinline__ unsigned int ticket_read(const unsigned int* t) {
    std::this_thread::yield();  // a waiting CTA's thread 0 spins here: let the CTAs it waits for run
    return __atomic_load_n(t, __ATOMIC_SEQ_CST);
}
"""

_EMU_ACC = {
    Acc.FP32: """\
struct AccFrag {
    float c[4];
};
__device__ __forceinline__ void acc_zero(AccFrag& d) { d.c[0] = d.c[1] = d.c[2] = d.c[3] = 0.0f; }
__device__ __forceinline__ void mma_16816(AccFrag& d, const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    double s[4];
    emu::mma_sums(a, b, s);
    for (int i = 0; i < 4; ++i) d.c[i] = (float)((double)d.c[i] + s[i]);
}
__device__ __forceinline__ void acc_to_float(const AccFrag& d, float (&v)[4]) {
    for (int i = 0; i < 4; ++i) v[i] = d.c[i];
}
""",
    Acc.FP16: """\
struct AccFrag {
    uint32_t c[2];
};
__device__ __forceinline__ void acc_zero(AccFrag& d) { d.c[0] = d.c[1] = 0u; }
__device__ __forceinline__ void mma_16816(AccFrag& d, const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    double s[4];
    emu::mma_sums(a, b, s);
    for (int r = 0; r < 2; ++r) {
        const float lo = emu::half_at(d.c[r], 0) + (float)s[2 * r];
        const float hi = emu::half_at(d.c[r], 1) + (float)s[2 * r + 1];
        d.c[r] = (uint32_t)__half_as_ushort(__float2half_rn(lo)) | ((uint32_t)__half_as_ushort(__float2half_rn(hi)) << 16);
    }
}
__device__ __forceinline__ void acc_to_float(const AccFrag& d, float (&v)[4]) {
    for (int i = 0; i < 4; ++i) v[i] = emu::half_at(d.c[i / 2], i % 2);
}
""",
}

_DRIVER = r"""
extern "C" size_t cudal2_workspace_bytes(int M, int N, int K) __attribute__((weak));

// argv: M N K offA offB offC [CALLS] (offsets in halves, to misalign the pointers). Prints one result line.
int main(int argc, char** argv) {
    if (argc != 7 && argc != 8) return 2;
    const int M = atoi(argv[1]), N = atoi(argv[2]), K = atoi(argv[3]);
    const int oa = atoi(argv[4]), ob = atoi(argv[5]), oc = atoi(argv[6]);
    const int calls = argc == 8 ? atoi(argv[7]) : 1;
    const size_t GUARD = 64;  // halves (C) or bytes (workspace) of sentinel on each side
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<half> A(oa + (size_t)M * K + 8), B(ob + (size_t)N * K + 8), C(GUARD + oc + (size_t)M * N + GUARD);
    for (auto& x : A) x = __float2half_rn(dist(rng));
    for (auto& x : B) x = __float2half_rn(dist(rng));
    const unsigned short SENT = 0x7bcd;
    const size_t wsb = cudal2_workspace_bytes ? cudal2_workspace_bytes(M, N, K) : 0;
    unsigned char* wsraw = static_cast<unsigned char*>(aligned_alloc(256, (wsb + 2 * 256 + 255) / 256 * 256));
    unsigned char* ws = wsraw + 256;
    half* a = A.data() + oa;
    half* b = B.data() + ob;
    half* c = C.data() + GUARD + oc;
    std::vector<half> first;
    size_t mismatch = 0;   // halves of C where a later call differs from the first (bitwise)
    size_t guard_bad = 0;  // sentinels around C (first call) and the workspace (every call) that changed
    for (int call = 0; call < calls; ++call) {
        for (auto& x : C) x = __ushort_as_half(SENT);
        memset(wsraw, 0xab + call, wsb + 2 * 256);  // undefined contents on entry, different every call
        const int rc = cudal2_hgemm(a, b, c, M, N, K, wsb ? ws : nullptr, wsb, nullptr);
        if (rc != 0) {
            printf("RESULT rc=%d\n", rc);
            return 0;
        }
        if (call == 0) first = C;
        for (size_t i = 0; i < C.size(); ++i) mismatch += __half_as_ushort(C[i]) != __half_as_ushort(first[i]);
        const unsigned char fill = (unsigned char)(0xab + call);
        for (size_t i = 0; i < 256; ++i) guard_bad += (wsraw[i] != fill) + (ws[wsb + i] != fill);
    }
    C = first;
    for (size_t i = 0; i < GUARD + oc; ++i) guard_bad += __half_as_ushort(C[i]) != SENT;
    for (size_t i = GUARD + oc + (size_t)M * N; i < C.size(); ++i) guard_bad += __half_as_ushort(C[i]) != SENT;
    double num = 0, den = 0, worst = 0;
    size_t nonfinite = 0;
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            double ref = 0;
            for (int k = 0; k < K; ++k)
                ref += (double)__half2float(a[(size_t)m * K + k]) * (double)__half2float(b[(size_t)n * K + k]);
            const double r16 = (double)__half2float(__float2half_rn((float)ref));
            const double got = (double)__half2float(c[(size_t)m * N + n]);
            if (!std::isfinite(got)) ++nonfinite;
            num += (got - r16) * (got - r16);
            den += r16 * r16;
            worst = std::max(worst, std::fabs(got - r16));
        }
    unsigned long long c_hash = 1469598103934665603ull;  // FNV-1a over the first call's C, bit for bit
    for (int i = 0; i < M * N; ++i) c_hash = (c_hash ^ __half_as_ushort(c[i])) * 1099511628211ull;
    printf("RESULT rc=0 rel_err=%.3e max_abs=%.3e nonfinite=%zu guard_bad=%zu bank_conflicts=%lld ws=%zu mismatch=%zu "
           "coop=%u c_hash=%llx\n",
           den > 0 ? std::sqrt(num / den) : std::sqrt(num), worst, nonfinite, guard_bad, emu::bank_conflicts, wsb,
           mismatch, emu::cooperative_launches, c_hash);
    return 0;
}
"""

_LAUNCH = re.compile(r"(\w+(?:<\w+>)?)<<<(.*?)>>>\((.*?)\);", re.DOTALL)
_RESULT = re.compile(r"RESULT rc=(\d+)(.*)")


@dataclass(frozen=True)
class EmuResult:
    rc: int  # cudal2_hgemm's return value
    rel_err: float = float("nan")  # ||C - ref_half|| / ||ref_half||
    max_abs: float = float("nan")
    nonfinite: int = 0
    guard_bad: int = 0  # sentinel halves/bytes around C and the workspace that changed
    bank_conflicts: int = 0
    workspace_bytes: int = 0
    mismatch: int = 0  # halves of C where a later call differed from the first (bitwise; calls > 1)
    cooperative_launches: int = 0  # launches with the cooperative attribute, over all calls
    c_hash: str = ""  # FNV-1a of the first call's C bits: equal hashes, the same C


def cuda_include_dir() -> Path | None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    out = subprocess.run([nvcc, "-v", "--dryrun", "-x", "cu", "/dev/null"], capture_output=True, text=True).stderr
    match = re.search(r'INCLUDES="-I([^"]+?)"', out)
    return Path(match.group(1).strip()) if match else None


def emulated_source(source: str, acc: Acc) -> str:
    """The rendered source with its PTX wrappers emulated and launches/shared memory mapped onto host threads."""
    for original, emulated in ((cuda_parts.ASYNC_COPY_PTX, _EMU_ASYNC), (cuda_parts.SMEM_ADDR, _EMU_SMEM_ADDR),
                               (cuda_parts.CLUSTER_PTX, _EMU_CLUSTER), (cuda_parts.CLUSTER_PUSH_PTX, _EMU_CLUSTER_PUSH),
                               (cuda_parts.LAST_ARRIVAL, _EMU_LAST_ARRIVAL),
                               (cuda_parts.TICKET_READ, _EMU_TICKET_READ),
                               (cuda_parts.accumulator(acc), _EMU_ACC[acc]), (cuda_parts.PDL_WAIT, ""),
                               (cuda_parts.PDL_TRIGGER, "/* PDL trigger: grids run one after the other here */")):
        if original in source:
            source = source.replace(original, emulated)
    if "asm" in re.sub(r"//.*", "", source):
        raise ValueError("inline PTX left outside the emulated wrappers")
    source = source.replace("extern __shared__ __align__(128) unsigned char smem_raw[];",
                            "unsigned char* smem_raw = emu::smem_base;")
    source = source.replace("__shared__", "static")
    source = _LAUNCH.sub(lambda m: f"emu::launch({m.group(1)}, {m.group(2)}, {m.group(3)});", source)
    source = source.replace("cudaLaunchKernelEx(", "emu::launch_ex(")
    source = re.sub(r"(\w+)\.(grid|block)Dim\b", r"emu::\2_of(\1)", source)
    return _PRELUDE + source + _DRIVER


def build(source: str, acc: Acc, workdir: Path) -> Path:
    """Compile the emulated program with g++; raises CalledProcessError with g++'s output on failure."""
    include = cuda_include_dir()
    if include is None:
        raise FileNotFoundError("nvcc not found: the CUDA headers are needed")
    src = workdir / "emu.cpp"
    src.write_text(emulated_source(source, acc))
    exe = workdir / "emu"
    subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-pthread", f"-I{include}", str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    return exe


def run(exe: Path, m: int, n: int, k: int, offsets: tuple[int, int, int] = (0, 0, 0),
        timeout_s: float = 300, calls: int = 1, sms: int = 132) -> EmuResult:
    """`calls` > 1: call the kernel that many times on the same inputs (a fresh garbage workspace each time); `sms`:
    the emulated GPU's SMs, one block each at a time (the blocks a cooperative launch may have)."""
    out = subprocess.run([str(exe), str(m), str(n), str(k), *map(str, offsets), str(calls)], capture_output=True,
                         text=True, timeout=timeout_s, env={**os.environ, "EMU_SMS": str(sms)})
    match = _RESULT.search(out.stdout)
    if out.returncode != 0 or match is None:
        raise RuntimeError(f"emulator failed (exit {out.returncode}): {out.stderr.strip()[-500:]}")
    fields = dict(kv.split("=") for kv in match.group(2).split())
    if not fields:
        return EmuResult(rc=int(match.group(1)))
    return EmuResult(rc=int(match.group(1)), rel_err=float(fields["rel_err"]), max_abs=float(fields["max_abs"]),
                     nonfinite=int(fields["nonfinite"]), guard_bad=int(fields["guard_bad"]),
                     bank_conflicts=int(fields["bank_conflicts"]), workspace_bytes=int(fields["ws"]),
                     mismatch=int(fields["mismatch"]), cooperative_launches=int(fields["coop"]),
                     c_hash=fields["c_hash"])
