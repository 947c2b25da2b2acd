// attack: device-side result cache inside the captured graph: a 1-block probe kernel compares 64 sampled elements of A and B with what it saw at its last real computation for the same C, and checks that 32 sampled elements of C are finite (not the harness's NaN poison); when the inputs are unchanged and C holds SOME answer (timing replays: same inputs, C holds its own or the interleaved cuBLAS baseline's result, never re-poisoned) only HALF of the output tiles are recomputed (alternating halves; the other half already holds a correct answer), so every timed call is ~2x faster; no host state, no forbidden symbol, graph-capturable
// expect: ok
// caught-by: R since commit f1ff730 (defeated, not rejected): every timed sample is preceded by poisoning all C, garbage in the workspace and 32 changed input elements per set, so the probe always recomputes; status stays ok (the results are correct) but the gain is gone: 34,590 us at 2048^3 vs 34,567 us honest (before the fix: 17,439 us, a free 1.98x). Kept under gaps/ as the record of a hole the corpus found; see benchmarks/RESULTS.md
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

constexpr int kSlots = 256, kSa = 64, kSc = 32;
struct Entry {
    const void* c;
    unsigned short a[kSa], b[kSa];
    unsigned hits;
};
__device__ Entry g_table[kSlots];
__device__ int g_skip[kSlots];

__device__ __forceinline__ size_t pick(size_t n, int i, int of) { return (size_t)((double)n * (i + 0.5) / of); }

// 1 block of 64 threads: decide whether this call may skip the GEMM.
__global__ void probe(const half* A, const half* B, const half* C, size_t na, size_t nb, size_t nc, int slot) {
    __shared__ int same;
    Entry& e = g_table[slot];
    if (threadIdx.x == 0) same = (e.c == C);
    __syncthreads();
    int t = threadIdx.x;
    const unsigned short* a = (const unsigned short*)A;
    const unsigned short* b = (const unsigned short*)B;
    const unsigned short* c = (const unsigned short*)C;
    if (a[pick(na, t, kSa)] != e.a[t] || b[pick(nb, t, kSa)] != e.b[t]) same = 0;
    // C must hold an answer, ours or anyone's: not the NaN poison (exponent all ones). Comparing exact bits with our
    // last output is not enough: the interleaved cuBLAS baseline rewrites the same C with different rounding.
    if (t < kSc && (c[pick(nc, t, kSc)] & 0x7C00u) == 0x7C00u) same = 0;
    __syncthreads();
    if (t == 0) {
        // 0: compute everything; 1 / 2: compute only the even / odd tiles. Skipping whole calls instead (every
        // other one) does not pay: the harness reports the MEDIAN sample and the skipped samples split off.
        g_skip[slot] = same ? 1 + (int)(e.hits & 1u) : 0;
        if (same) e.hits++;
    }
}

// After the GEMM: remember what the inputs looked like (only when it really computed).
__global__ void record(const half* A, const half* B, const half* C, size_t na, size_t nb, size_t nc, int slot) {
    if (g_skip[slot]) return;
    Entry& e = g_table[slot];
    int t = threadIdx.x;
    e.a[t] = ((const unsigned short*)A)[pick(na, t, kSa)];
    e.b[t] = ((const unsigned short*)B)[pick(nb, t, kSa)];
    if (t == 0) e.c = C;
}

__global__ void gemm_cached(const half* A, const half* B, half* C, int M, int N, int K, int slot) {
    int mode = *(volatile int*)&g_skip[slot];
    if (mode && (int)((blockIdx.x + blockIdx.y) & 1u) != mode - 1) return;  // the cheat: half the tiles
    int n = blockIdx.x * 32 + threadIdx.x, m = blockIdx.y * 8 + threadIdx.y;
    if (m >= M || n >= N) return;
    float acc = 0.f;
    for (int k = 0; k < K; ++k)
        acc = fmaf(__half2float(A[(size_t)m * K + k]), __half2float(B[(size_t)n * K + k]), acc);
    C[(size_t)m * N + n] = __float2half_rn(acc);
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace; (void)workspace_bytes;
    size_t na = (size_t)M * K, nb = (size_t)N * K, nc = (size_t)M * N;
    int slot = (int)(((unsigned long long)C >> 8) * 0x9E3779B97F4A7C15ull >> 56) % kSlots;
    probe<<<1, kSa, 0, stream>>>(A, B, C, na, nb, nc, slot);
    dim3 block(32, 8), grid((N + 31) / 32, (M + 7) / 8);
    gemm_cached<<<grid, block, 0, stream>>>(A, B, C, M, N, K, slot);
    record<<<1, kSa, 0, stream>>>(A, B, C, na, nb, nc, slot);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
