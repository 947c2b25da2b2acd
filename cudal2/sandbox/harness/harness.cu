// harness.cu: the trusted measuring process. Built once per machine (cudal2/sandbox/harness_build.py), run by
// cudal2/sandbox/runner.py in a child process, one process per candidate library, many tasks per process.
//
//   harness CANDIDATE.so --result-fd FD          spec on stdin (key value lines, ends with "end")
//
// It initialises CUDA, cuBLAS and cuBLASLt, confines itself (sandbox.h), dlopens the candidate with RTLD_LOCAL
// (its symbols cannot interpose ours, which are bound at start-up with -z now), and per task:
//   1. checked calls: exact-integer inputs (bit-exact), normal and positive-mean random inputs (relative error
//      against an fp32 cuBLAS reference rounded to half), a repeat for determinism. Around each call:
//      inputs arrive late on the stream (a gate kernel spins for a secret time, then copies the true inputs
//      over garbage), so work not ordered on the given stream reads garbage; output poisoned with NaN;
//      workspace filled with garbage; guard bands around A, B, C and the workspace; inputs compared after;
//      after the call the output is poisoned again and must stay poisoned (no work left running), and the
//      device must go idle as soon as the stream does (a call that fails only this is run again, up to 4 times: a
//      stalled host or driver reads like GPU work left running, but work left running shows again; checked_call).
//   2. timing with CUDA events: offline = CUDA-graph replay of R calls over R rotating input sets
//      (plain stream calls when the candidate cannot be captured; R <= max_sets, so a shape whose R sets fit in
//      L2 is timed with its inputs in L2), cold = the offline replay after an L2 flush, so that every call of
//      it reads inputs no call since the flush has touched, server = L2 flush + Poisson arrivals.
//      Programmatic (PDL) edges are allowed inside one call (cuBLAS's own split-K launches its reduction kernel
//      that way) and rejected between calls, where back-to-back timed calls would overlap one another, which no
//      single call does. Every mode captures the candidate's calls once for this check (server and wallclock
//      then time plain calls); a source that spells PDL (spec `pdl 1`) must be capturable. Not covered: a
//      candidate that refuses capture and launches with PDL spelled past the static scan runs unseen.
//      wallclock = CUDA-L2's method, for comparison with its tables only: the host clock around one plain call
//      and a stream synchronisation, the same input set every call (warm L2), launch overhead included.
//      Baselines in the same process on the same inputs, interleaved in random order: cuBLAS
//      (cublasGemmEx, torch.matmul's path), cuBLASLt heuristic top-1, cuBLASLt autotuned (best of <= 32).
//   3. re-verification of the timed path: new input contents in the same buffers, outputs poisoned, the
//      timed graph (or call sequence) replayed once, every output checked.
// Results go to FD as JSON lines, each carrying the per-run nonce; never to stdout, which the candidate shares.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <tuple>
#include <random>
#include <string>
#include <vector>

#include "sandbox.h"

typedef int (*hgemm_fn)(const half*, const half*, half*, int, int, int, void*, size_t, cudaStream_t);
typedef size_t (*ws_fn)(int, int, int);

// ------------------------------------------------------------------------------------------------ errors
// A failure of the harness's own CUDA work. `candidate_fault` is true once a candidate call has run in this
// context: a sticky CUDA error from then on (illegal address, launch failure) is the candidate's.
struct Fatal {
  std::string msg;
};
static bool g_candidate_ran = false;

static void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Fatal{std::string(what) + ": " + cudaGetErrorString(e)};
}
static void ckb(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Fatal{std::string(what) + ": cublas status " + std::to_string((int)s)};
}

// ------------------------------------------------------------------------------------------------ output
static std::string jstr(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if ((unsigned char)c < 0x20) {
      char b[8];
      snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += c;
    }
  }
  return o + "\"";
}
static std::string jnum(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  snprintf(b, sizeof b, "%.6g", v);
  return b;
}

// The nonce is kept XOR-masked and the spec text is wiped after parsing, so that it is not lying in memory as
// text for a candidate to find; the result fd is moved to a random high number.
struct Reporter {
  int fd = -1;
  std::string masked, key;
  void set_nonce(const char* nonce, std::mt19937_64& r) {
    for (const char* p = nonce; *p; ++p) {
      char k = (char)(1 + r() % 255);
      key += k;
      masked += (char)(*p ^ k);
    }
  }
  void line(const std::string& body) {
    std::string nonce = masked;
    for (size_t i = 0; i < nonce.size(); ++i) nonce[i] ^= key[i];
    std::string s = "{\"nonce\":" + jstr(nonce) + "," + body + "}\n";
    std::fill(nonce.begin(), nonce.end(), 0);
    const char* p = s.data();
    size_t left = s.size();
    while (left > 0) {
      ssize_t w = write(fd, p, left);
      if (w <= 0) _exit(3);  // parent gone: nothing left to report to
      p += w;
      left -= (size_t)w;
    }
    std::fill(s.begin(), s.end(), 0);
  }
};

static std::string fmt(const char* f, ...) {
  char b[512];
  va_list ap;
  va_start(ap, f);
  vsnprintf(b, sizeof b, f, ap);
  va_end(ap);
  return b;
}

// ------------------------------------------------------------------------------------------------ spec
struct TaskSpec {
  int m, n, k;
  bool acc16;
  std::string algo_hex;  // cached cuBLASLt autotuned winner, or "-"
};
struct Spec {
  std::string mode = "offline", sandbox_dir = ".";
  // offline and cold time CUDA-graph replays of R calls; server and wallclock time plain calls.
  bool replays() const { return mode == "offline" || mode == "cold"; }
  uint64_t seed = 1;
  bool checks = true, baselines = true;
  double warmup_ms = 20, target_ms = 150, qps = 2000, tol_fp32 = 2.5e-4, tol_fp16 = 5e-3;  // at K=1024, scaled by sqrt(K/1024)
  int min_reps = 10, max_reps = 200, max_sets = 32;
  bool pdl = false;  // the source spells programmatic dependent launch: its calls must be capturable (graph check)
  std::vector<TaskSpec> tasks;
};

// Reads the spec from stdin with read(2) (no stdio buffer keeps a copy), parses it with sscanf (no stream
// copies), then wipes the text. `nonce` receives the nonce; the caller masks and wipes it.
static Spec read_spec(char* nonce, size_t nonce_cap) {
  Spec s;
  std::vector<char> buf;
  char chunk[4096];
  ssize_t got;
  while ((got = read(0, chunk, sizeof chunk)) > 0) buf.insert(buf.end(), chunk, chunk + got);
  memset(chunk, 0, sizeof chunk);
  buf.push_back('\0');
  char fmt_nonce[32];
  snprintf(fmt_nonce, sizeof fmt_nonce, "nonce %%%zus", nonce_cap - 1);
  char word[64], text[512];
  for (char* line = strtok(buf.data(), "\n"); line; line = strtok(nullptr, "\n")) {
    if (strncmp(line, "end", 3) == 0) break;
    TaskSpec t;
    double d;
    int i;
    unsigned long long u;
    if (sscanf(line, fmt_nonce, nonce) == 1) continue;
    if (sscanf(line, "seed %llu", &u) == 1) s.seed = u;
    else if (sscanf(line, "mode %63s", word) == 1) s.mode = word;
    else if (sscanf(line, "sandbox_dir %511s", text) == 1) s.sandbox_dir = text;
    else if (sscanf(line, "checks %d", &i) == 1) s.checks = i != 0;
    else if (sscanf(line, "baselines %d", &i) == 1) s.baselines = i != 0;
    else if (sscanf(line, "pdl %d", &i) == 1) s.pdl = i != 0;
    else if (sscanf(line, "warmup_ms %lf", &d) == 1) s.warmup_ms = d;
    else if (sscanf(line, "target_ms %lf", &d) == 1) s.target_ms = d;
    else if (sscanf(line, "min_reps %d", &i) == 1) s.min_reps = i;
    else if (sscanf(line, "max_reps %d", &i) == 1) s.max_reps = i;
    else if (sscanf(line, "max_sets %d", &i) == 1) s.max_sets = i;
    else if (sscanf(line, "qps %lf", &d) == 1) s.qps = d;
    else if (sscanf(line, "tol_fp32 %lf", &d) == 1) s.tol_fp32 = d;
    else if (sscanf(line, "tol_fp16 %lf", &d) == 1) s.tol_fp16 = d;
    else if (sscanf(line, "task %d %d %d %63s %511s", &t.m, &t.n, &t.k, word, text) == 5) {
      t.acc16 = strcmp(word, "fp16") == 0;
      t.algo_hex = text;
      s.tasks.push_back(t);
    }
  }
  std::fill(buf.begin(), buf.end(), 0);
  return s;
}

// ------------------------------------------------------------------------------------------------ device helpers
__device__ __forceinline__ uint64_t mix64(uint64_t x) {  // splitmix64 finaliser: a cheap stateless hash
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__device__ __forceinline__ float u01(uint64_t h) { return ((h >> 40) + 0.5f) * (1.0f / 16777216.0f); }

#define GRID_STRIDE(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// kind 0: N(mean, 1); kind 1: U[0, 1) (positive mean: fp16 accumulation errors grow linearly with K)
__global__ void k_fill_random(half* p, size_t n, uint64_t seed, int kind, float mean) {
  GRID_STRIDE(i, n) {
    uint64_t h = mix64(seed ^ (i * 0xD1B54A32D192ED03ull));
    float v;
    if (kind == 0) {
      float u1 = u01(h), u2 = u01(mix64(h));
      v = mean + sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    } else {
      v = u01(h);
    }
    p[i] = __float2half_rn(v);
  }
}
// Garbage that is finite but large: any use of it ruins the product.
__global__ void k_fill_garbage(uint16_t* p, size_t n, uint64_t seed) {
  GRID_STRIDE(i, n) {
    uint64_t h = mix64(seed + i);
    p[i] = (uint16_t)((h & 0x83FF) | 0x7000);  // exponent 11100: |v| in [2^13, 2^14)
  }
}
// Exact-integer inputs. A: row m has non-zeros (+-1) only where k % stride == off(m), so at most 2048 of them;
// B: entries in {-1, 0, 1}. Every partial sum, in any order, is an integer of magnitude <= 2048: exact in fp16.
__global__ void k_fill_int_a(half* A, int M, int K, int stride, uint64_t seed) {
  GRID_STRIDE(i, (size_t)M * K) {
    int m = (int)(i / K), k = (int)(i % K);
    int off = (int)(mix64(seed ^ (uint64_t)m) % (uint64_t)stride);
    uint64_t h = mix64(seed * 31 + i);
    A[i] = __float2half_rn((k % stride == off) ? ((h & 1) ? 1.f : -1.f) : 0.f);
  }
}
__global__ void k_fill_int_b(half* B, size_t n, uint64_t seed) {
  GRID_STRIDE(i, n) {
    uint64_t h = mix64(seed * 17 + i);
    B[i] = __float2half_rn((float)((int)(h % 3) - 1));
  }
}
__global__ void k_guard_fill(uint8_t* p, size_t n, uint64_t salt) {
  GRID_STRIDE(i, n) p[i] = (uint8_t)mix64(salt + i);
}
__global__ void k_guard_check(const uint8_t* p, size_t n, uint64_t salt, unsigned long long* bad) {
  GRID_STRIDE(i, n) if (p[i] != (uint8_t)mix64(salt + i)) atomicAdd(bad, 1ull);
}
__global__ void k_count_ne(const uint16_t* a, const uint16_t* b, size_t n, unsigned long long* bad) {
  GRID_STRIDE(i, n) if (a[i] != b[i]) atomicAdd(bad, 1ull);
}
__global__ void k_count_not(const uint16_t* a, size_t n, uint16_t v, unsigned long long* bad) {
  GRID_STRIDE(i, n) if (a[i] != v) atomicAdd(bad, 1ull);
}
// Compare C (half) with ref (float). Accumulates sum (C - half(ref))^2 and sum ref^2; counts non-finite outputs
// and bit mismatches against half(ref); records the first mismatching index.
struct CmpOut {
  double diff2, ref2;
  unsigned long long nonfinite, mismatches, first_bad;
};
__global__ void k_compare(const half* C, const float* ref, size_t n, CmpOut* o) {
  double d2 = 0, r2 = 0;
  GRID_STRIDE(i, n) {
    float c = __half2float(C[i]);
    half rh = __float2half_rn(ref[i]);
    float r = __half2float(rh);
    if (!isfinite(c)) {
      atomicAdd(&o->nonfinite, 1ull);
      atomicMin(&o->first_bad, (unsigned long long)i);
      continue;
    }
    if (__half_as_ushort(C[i]) != __half_as_ushort(rh)) {
      atomicAdd(&o->mismatches, 1ull);
      atomicMin(&o->first_bad, (unsigned long long)i);
    }
    double d = (double)c - (double)r;
    d2 += d * d;
    r2 += (double)ref[i] * (double)ref[i];
  }
  for (int s = 16; s > 0; s >>= 1) {
    d2 += __shfl_down_sync(0xffffffff, d2, s);
    r2 += __shfl_down_sync(0xffffffff, r2, s);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&o->diff2, d2);
    atomicAdd(&o->ref2, r2);
  }
}
// 32 random elements of p get new random values (inputs change between timed calls, invisibly to a sampler).
__global__ void k_perturb(half* p, size_t n, uint64_t seed) {
  uint64_t h = mix64(seed + threadIdx.x);
  p[h % n] = __float2half_rn(u01(mix64(h)) * 2.f - 1.f);
}
// The gate: holds the stream for `ns` nanoseconds of wall time (globaltimer), so that what follows on the
// stream starts late; work that is not ordered after it runs while the inputs are still garbage.
__global__ void k_spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

static int blocks_for(size_t n) { return (int)std::min<size_t>((n + 255) / 256, 132 * 16); }

// ------------------------------------------------------------------------------------------------ buffers
static const size_t GUARD = 256 * 1024;  // bytes of guard band on each side of every checked buffer

struct Guarded {
  uint8_t* base = nullptr;
  size_t bytes = 0;  // payload
  uint64_t salt = 0;
  void* ptr() const { return base ? base + GUARD : nullptr; }
  void alloc(size_t b, uint64_t s, cudaStream_t st) {
    bytes = b;
    salt = s;
    ck(cudaMalloc(&base, b + 2 * GUARD), "cudaMalloc (harness buffer)");
    k_guard_fill<<<blocks_for(GUARD), 256, 0, st>>>(base, GUARD, salt);
    k_guard_fill<<<blocks_for(GUARD), 256, 0, st>>>(base + GUARD + b, GUARD, salt ^ 0xABCDEF);
  }
  void release() {
    if (base) cudaFree(base);
    base = nullptr;
  }
};

struct DevScratch {
  unsigned long long* counters = nullptr;  // 8 counters
  CmpOut* cmp = nullptr;
};

// ------------------------------------------------------------------------------------------------ context
struct Ctx {
  Spec spec;
  Reporter rep;
  cudaStream_t s = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* blas_ws = nullptr;
  void* lt_ws = nullptr;
  size_t lib_ws_bytes = 32u << 20;  // cuBLAS / cuBLASLt workspace: 32 MiB, what torch gives cuBLAS on Hopper
  uint8_t* flush = nullptr;
  size_t flush_bytes = 0;
  DevScratch dev;
  hgemm_fn cand = nullptr;
  ws_fn cand_ws = nullptr;
  std::mt19937_64 rng;
  cudaDeviceProp prop;
};

struct TaskBufs {
  int M, N, K, R;
  bool acc16;
  std::vector<Guarded> A, B, C;  // R rotating sets; set 0 is the checked one
  Guarded W;
  half *A_true = nullptr, *B_true = nullptr, *C_prev = nullptr, *C_snap = nullptr;
  float* ref = nullptr;
  size_t ws = 0;
  double tol = 0, tol_normal = 0;  // relative-error limit for the current check / for normal inputs
  void release() {
    for (auto* v : {&A, &B, &C})
      for (auto& g : *v) g.release();
    W.release();
    for (void* p : {(void*)A_true, (void*)B_true, (void*)C_prev, (void*)C_snap, (void*)ref})
      if (p) cudaFree(p);
  }
};

// Task outcome, built up as checks run.
struct Outcome {
  std::string status = "ok", reason;
  double max_err = 0;
  bool graph = false;
  std::vector<std::string> checks;
  std::string timings_json;
  std::string paired_json;  // {"cublas": {"median": baseline/candidate, ...}, ...}; empty without a candidate
  std::string algo_hex = "-";
  bool fail(const std::string& st, const std::string& why) {
    status = st;
    reason = why;
    return false;
  }
};

// ------------------------------------------------------------------------------------------------ reference
// Row-major C[M,N] = A[M,K] B[N,K]^T is column-major C^T[N,M] = op_T(B as KxN col-major) * (A as KxM col-major).
static void reference(Ctx& c, const half* A, const half* B, float* ref, int M, int N, int K) {
  float one = 1.f, zero = 0.f;
  ckb(cublasGemmEx(c.blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, B, CUDA_R_16F, K, A, CUDA_R_16F, K, &zero, ref,
                   CUDA_R_32F, N, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx (reference)");
}

static CmpOut compare(Ctx& c, const half* C, const float* ref, size_t n) {
  CmpOut h;
  memset(&h, 0, sizeof h);
  h.first_bad = ~0ull;
  ck(cudaMemcpyAsync(c.dev.cmp, &h, sizeof h, cudaMemcpyHostToDevice, c.s), "upload cmp");
  k_compare<<<blocks_for(n), 256, 0, c.s>>>(C, ref, n, c.dev.cmp);
  ck(cudaMemcpyAsync(&h, c.dev.cmp, sizeof h, cudaMemcpyDeviceToHost, c.s), "download cmp");
  ck(cudaStreamSynchronize(c.s), "compare");
  return h;
}

static unsigned long long bad_guard_bytes(Ctx& c, const Guarded& g, bool after) {
  ck(cudaMemsetAsync(c.dev.counters, 0, 8, c.s), "memset counter");
  const uint8_t* p = after ? g.base + GUARD + g.bytes : g.base;
  k_guard_check<<<blocks_for(GUARD), 256, 0, c.s>>>(p, GUARD, after ? g.salt ^ 0xABCDEF : g.salt, c.dev.counters);
  unsigned long long h = 0;
  ck(cudaMemcpyAsync(&h, c.dev.counters, 8, cudaMemcpyDeviceToHost, c.s), "download counter");
  ck(cudaStreamSynchronize(c.s), "guard check");
  return h;
}

static unsigned long long count_ne(Ctx& c, const void* a, const void* b, size_t n) {
  ck(cudaMemsetAsync(c.dev.counters, 0, 8, c.s), "memset counter");
  k_count_ne<<<blocks_for(n), 256, 0, c.s>>>((const uint16_t*)a, (const uint16_t*)b, n, c.dev.counters);
  unsigned long long h = 0;
  ck(cudaMemcpyAsync(&h, c.dev.counters, 8, cudaMemcpyDeviceToHost, c.s), "download counter");
  ck(cudaStreamSynchronize(c.s), "count_ne");
  return h;
}

static unsigned long long count_not(Ctx& c, const void* a, size_t n, uint16_t v) {
  ck(cudaMemsetAsync(c.dev.counters, 0, 8, c.s), "memset counter");
  k_count_not<<<blocks_for(n), 256, 0, c.s>>>((const uint16_t*)a, n, v, c.dev.counters);
  unsigned long long h = 0;
  ck(cudaMemcpyAsync(&h, c.dev.counters, 8, cudaMemcpyDeviceToHost, c.s), "download counter");
  ck(cudaStreamSynchronize(c.s), "count_not");
  return h;
}

static double now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// How long cudaDeviceSynchronize waited (host wall clock, ms), and whether this thread was off its CPU for part of it
// (`off_cpu`). On a loaded host, e.g. while the tuner runs one nvcc per core, a preemption can stall the thread
// for a scheduler slice (~1 ms) after an instant sync; that wait says nothing about the GPU. An involuntary context
// switch shows a preemption; a thread that blocked instead (a page fault, a lock in the driver) shows as CPU time well
// under the wall time: the sync spins while the GPU works (cudaDeviceScheduleAuto spins while the process's threads
// fit the cores), so a wait for leftover work is spent on the CPU. But honest kernels were also rejected after 0.60-1.35
// ms waits with neither (3 such results in 117,958 stored, RESULTS nineteenth session): checked_call runs a call that
// fails the idle check again either way, and `off_cpu` decides how many clean attempts it then needs.
struct SyncWait {
  double ms;
  bool off_cpu;
};

static double thread_cpu_ms(const rusage& r) {
  return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1e3 + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-3;
}

static SyncWait timed_device_sync() {
  rusage before{}, after{};
  getrusage(RUSAGE_THREAD, &before);
  double t0 = now_ms();
  ck(cudaDeviceSynchronize(), "device sync");
  double ms = now_ms() - t0;
  getrusage(RUSAGE_THREAD, &after);
  const bool switched = after.ru_nivcsw != before.ru_nivcsw || after.ru_nvcsw != before.ru_nvcsw;
  return SyncWait{ms, switched || thread_cpu_ms(after) - thread_cpu_ms(before) < 0.5 * ms};
}

// ------------------------------------------------------------------------------------------------ candidate calls
static int call_candidate(Ctx& c, TaskBufs& b, int set) {
  g_candidate_ran = true;
  return c.cand((const half*)b.A[set].ptr(), (const half*)b.B[set].ptr(), (half*)b.C[set].ptr(), b.M, b.N, b.K,
                b.ws ? b.W.ptr() : nullptr, b.ws, c.s);
}

static const uint16_t POISON_AFTER = 0x7F7F;  // a NaN pattern (memset byte 0x7F)

static const int IDLE_ATTEMPTS = 4;  // the most runs of a checked call that fails only the idle check (checked_call)

// One fully checked call on set 0. The true inputs are in A_true/B_true and `ref` holds their fp32 product.
// `gate`: inputs arrive late on the stream (see the file comment). Returns false with the outcome filled in;
// `idle_failure`: the idle check's wait when that check is what failed (untouched otherwise).
static bool checked_call_once(Ctx& c, TaskBufs& b, Outcome& out, const char* what, bool exact, bool gate,
                              SyncWait& idle_failure) {
  size_t na = (size_t)b.M * b.K, nb = (size_t)b.N * b.K, nc = (size_t)b.M * b.N;
  uint64_t salt = c.rng();
  if (gate) {
    k_fill_garbage<<<blocks_for(na), 256, 0, c.s>>>((uint16_t*)b.A[0].ptr(), na, salt);
    k_fill_garbage<<<blocks_for(nb), 256, 0, c.s>>>((uint16_t*)b.B[0].ptr(), nb, salt + 1);
  } else {
    ck(cudaMemcpyAsync(b.A[0].ptr(), b.A_true, na * 2, cudaMemcpyDeviceToDevice, c.s), "copy A");
    ck(cudaMemcpyAsync(b.B[0].ptr(), b.B_true, nb * 2, cudaMemcpyDeviceToDevice, c.s), "copy B");
  }
  ck(cudaMemsetAsync(b.C[0].ptr(), 0xFF, nc * 2, c.s), "poison C");  // 0xFFFF: NaN
  if (b.ws) k_fill_garbage<<<blocks_for(b.ws / 2), 256, 0, c.s>>>((uint16_t*)b.W.ptr(), b.ws / 2, salt + 2);
  ck(cudaStreamSynchronize(c.s), "prepare checked call");
  if (gate) {  // queued right before the call, no synchronisation in between: the inputs really arrive late
    k_spin<<<1, 1, 0, c.s>>>(20000 + c.rng() % 60000);  // 20..80 us, secret
    ck(cudaMemcpyAsync(b.A[0].ptr(), b.A_true, na * 2, cudaMemcpyDeviceToDevice, c.s), "copy A");
    ck(cudaMemcpyAsync(b.B[0].ptr(), b.B_true, nb * 2, cudaMemcpyDeviceToDevice, c.s), "copy B");
  }
  int rc = call_candidate(c, b, 0);
  cudaError_t le = cudaGetLastError();
  if (rc != 0) return out.fail("runtime_error", fmt("%s: cudal2_hgemm returned %d", what, rc));
  if (le != cudaSuccess) return out.fail("runtime_error", fmt("%s: launch error: %s", what, cudaGetErrorString(le)));
  // In stream order right after the call: snapshot the output, poison it again.
  ck(cudaMemcpyAsync(b.C_snap, b.C[0].ptr(), nc * 2, cudaMemcpyDeviceToDevice, c.s), "snapshot C");
  ck(cudaMemsetAsync(b.C[0].ptr(), 0x7F, nc * 2, c.s), "re-poison C");
  ck(cudaStreamSynchronize(c.s), "candidate call");  // a candidate's illegal address surfaces here
  const SyncWait idle = timed_device_sync();
  if (c.spec.checks && idle.ms > 0.5) {
    idle_failure = idle;
    return out.fail("rejected_behaviour",
                    fmt("%s: GPU work still running %.2f ms after the call's stream finished (work on another "
                        "stream or launched later)%s", what, idle.ms,
                        idle.off_cpu ? "; the harness thread was off its CPU meanwhile" : ""));
  }
  if (c.spec.checks) {
    usleep(300);  // give a late launcher (host thread, callback) a chance to show itself
    ck(cudaDeviceSynchronize(), "device sync");
    if (count_not(c, b.C[0].ptr(), nc, POISON_AFTER))
      return out.fail("rejected_behaviour",
                      fmt("%s: C was written after the call had returned and its stream had finished (work left "
                          "running on another stream or launched later)", what));
    const char* names[4] = {"A", "B", "C", "workspace"};
    const Guarded* gs[4] = {&b.A[0], &b.B[0], &b.C[0], &b.W};
    for (int i = 0; i < 4; ++i) {
      if (!gs[i]->base) continue;
      for (int after = 0; after < 2; ++after)
        if (unsigned long long bad = bad_guard_bytes(c, *gs[i], after))
          return out.fail("rejected_behaviour", fmt("%s: out-of-bounds write: %llu guard bytes %s %s changed", what,
                                                    bad, after ? "after" : "before", names[i]));
    }
    if (count_ne(c, b.A[0].ptr(), b.A_true, na) || count_ne(c, b.B[0].ptr(), b.B_true, nb))
      return out.fail("rejected_behaviour", fmt("%s: the candidate wrote into its inputs A or B", what));
  }
  CmpOut r = compare(c, b.C_snap, b.ref, nc);
  if (r.nonfinite) {
    size_t i = r.first_bad;
    return out.fail("wrong_answer", fmt("%s: %llu of %zu outputs not written or not finite (first at row %zu, col %zu)",
                                        what, r.nonfinite, nc, i / b.N, i % b.N));
  }
  if (exact && r.mismatches) {
    size_t i = r.first_bad;
    return out.fail("wrong_answer", fmt("%s: %llu of %zu outputs differ from the exact integer result (first at "
                                        "row %zu, col %zu)", what, r.mismatches, nc, i / b.N, i % b.N));
  }
  double err = r.ref2 > 0 ? sqrt(r.diff2 / r.ref2) : sqrt(r.diff2);
  out.max_err = std::max(out.max_err, err);
  double tol = b.tol;
  if (!exact && !(err <= tol))
    return out.fail("wrong_answer", fmt("%s: relative error %.3g exceeds %.3g (%s accumulation required)", what, err,
                                        tol, b.acc16 ? "fp16" : "fp32"));
  return true;
}

// A checked call that fails only the idle check is run again, up to IDLE_ATTEMPTS times in all. A wait during which
// the harness thread was off its CPU says nothing (a preemption on a loaded host, sixth session): one clean attempt
// after it passes. A wait with the thread on its CPU is suspect, yet something other than the candidate (the host or
// the driver; the cause is not known) can cause it too: 3 results in the H200 store of ~139,000 rejected honest
// kernels after 0.60-1.35 ms such waits (the one measured again was ok). So after one, the call must pass twice in a
// row from then on. Work a candidate leaves on every call fails every attempt, and one that leaves it on every other
// call never passes twice in a row; one that leaves it on fewer calls still can pass this check. Every attempt
// starts from the outcome as it was before the first.
static bool checked_call(Ctx& c, TaskBufs& b, Outcome& out, const char* what, bool exact, bool gate) {
  const Outcome before = out;
  Outcome failure;
  int owed = 1, failed = 0;  // clean attempts still needed; attempts that failed the idle check
  bool suspect = false;      // an attempt failed it with the thread on its CPU
  for (int attempt = 1; attempt <= IDLE_ATTEMPTS; ++attempt) {
    out = before;
    SyncWait idle{0, false};
    if (checked_call_once(c, b, out, what, exact, gate, idle)) {
      if (--owed == 0) return true;
      continue;
    }
    if (idle.ms == 0) return false;  // another check failed: its verdict stands
    failure = out;
    ++failed;
    suspect = suspect || !idle.off_cpu;
    owed = suspect ? 2 : 1;
  }
  out = failure;
  out.reason += fmt("; %d of %d attempts failed this check", failed, IDLE_ATTEMPTS);
  return false;
}

// When a gated check fails, re-run it with the inputs in place before the call: if it then passes, the
// result depended on work that was not ordered on the given stream.
static bool gated_call(Ctx& c, TaskBufs& b, Outcome& out, const char* what, bool exact) {
  if (checked_call(c, b, out, what, exact, c.spec.checks)) return true;
  if (!c.spec.checks || out.status != "wrong_answer") return false;
  Outcome again;
  if (checked_call(c, b, again, what, exact, false))
    return out.fail("rejected_behaviour",
                    fmt("%s: correct only when inputs are ready before the call; the work is not ordered on the given "
                        "stream (private stream, another device stream or a host thread)", what));
  return false;
}

static void fill_inputs(Ctx& c, half* A, half* B, int M, int N, int K, int kind, uint64_t seed) {
  size_t na = (size_t)M * K, nb = (size_t)N * K;
  if (kind == 2) {
    int stride = (K + 2047) / 2048;
    k_fill_int_a<<<blocks_for(na), 256, 0, c.s>>>(A, M, K, stride, seed);
    k_fill_int_b<<<blocks_for(nb), 256, 0, c.s>>>(B, nb, seed + 1);
  } else {
    k_fill_random<<<blocks_for(na), 256, 0, c.s>>>(A, na, seed, kind, 0.f);
    k_fill_random<<<blocks_for(nb), 256, 0, c.s>>>(B, nb, seed + 1, kind, 0.f);
  }
  ck(cudaGetLastError(), "fill inputs");
}

static cublasStatus_t blas_run(Ctx& c, const half* A, const half* B, half* C, int M, int N, int K, bool acc16);

// Relative-error limit for the inputs now in A_true/B_true (reference in `ref`). Rounding-order noise of an
// fp32-accumulating tensor-core kernel grows like sqrt(K) (measured on H200: 6e-5 at K=1024, 2.7e-4 at K=16384,
// benchmarks/RESULTS.md); fp16 accumulation is 100x worse. fp16-accumulate tasks may be no worse than twice the
// vendor's fp16-accumulating GEMM on the same inputs.
static double tolerance(Ctx& c, TaskBufs& b) {
  double scaled = sqrt(b.K / 1024.0);
  if (!b.acc16) return c.spec.tol_fp32 * scaled;
  ckb(blas_run(c, b.A_true, b.B_true, b.C_prev, b.M, b.N, b.K, true), "cublas fp16 (tolerance)");
  CmpOut r = compare(c, b.C_prev, b.ref, (size_t)b.M * b.N);
  double vendor = r.ref2 > 0 ? sqrt(r.diff2 / r.ref2) : 0;
  return std::max(c.spec.tol_fp16 * scaled, 2 * vendor);
}

static bool correctness(Ctx& c, TaskBufs& b, Outcome& out) {
  struct Check {
    const char* name;
    int kind;
    bool exact;
  };
  const Check checks[3] = {{"exact-integer check", 2, true}, {"random normal check", 0, false},
                           {"positive-mean random check", 1, false}};
  size_t nc = (size_t)b.M * b.N;
  for (const Check& ch : checks) {
    fill_inputs(c, b.A_true, b.B_true, b.M, b.N, b.K, ch.kind, c.rng());
    reference(c, b.A_true, b.B_true, b.ref, b.M, b.N, b.K);
    if (!ch.exact) b.tol = tolerance(c, b);
    if (ch.kind == 0) b.tol_normal = b.tol;
    if (!gated_call(c, b, out, ch.name, ch.exact)) return false;
    out.checks.push_back(ch.name);
    if (ch.kind == 1 && c.spec.checks) {
      // Same inputs again, different garbage around them: the output must not change beyond rounding-order noise.
      ck(cudaMemcpyAsync(b.C_prev, b.C_snap, nc * 2, cudaMemcpyDeviceToDevice, c.s), "keep C");
      if (!gated_call(c, b, out, "repeat check", false)) return false;
      unsigned long long diff = count_ne(c, b.C_prev, b.C_snap, nc);
      if (diff > nc / 100 + 1)
        return out.fail("wrong_answer", fmt("repeat check: %llu of %zu outputs changed between two calls on the same "
                                            "inputs (reads uninitialised memory?)", diff, nc));
      out.checks.push_back("repeat check");
    }
  }
  return true;
}

// ------------------------------------------------------------------------------------------------ baselines
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t heur, tuned;
  bool have_heur = false, have_tuned = false;
  void release() {
    if (op) cublasLtMatmulDescDestroy(op);
    for (auto l : {la, lb, lc})
      if (l) cublasLtMatrixLayoutDestroy(l);
  }
};

static void lt_setup(Ctx& c, LtPlan& p, int M, int N, int K, bool acc16) {
  cublasComputeType_t ct = acc16 ? CUBLAS_COMPUTE_16F : CUBLAS_COMPUTE_32F;
  cudaDataType_t st = acc16 ? CUDA_R_16F : CUDA_R_32F;
  ckb(cublasLtMatmulDescCreate(&p.op, ct, st), "lt desc");
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  ckb(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "lt transa");
  ckb(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "lt transb");
  ckb(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16F, K, N, K), "lt layout a");
  ckb(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16F, K, M, K), "lt layout b");
  ckb(cublasLtMatrixLayoutCreate(&p.lc, CUDA_R_16F, N, M, N), "lt layout c");
}

static cublasStatus_t lt_run(Ctx& c, LtPlan& p, const cublasLtMatmulAlgo_t* algo, const half* A, const half* B,
                             half* C, bool acc16) {
  float one = 1.f, zero = 0.f;
  half h1 = __float2half(1.f), h0 = __float2half(0.f);
  const void* alpha = acc16 ? (const void*)&h1 : (const void*)&one;
  const void* beta = acc16 ? (const void*)&h0 : (const void*)&zero;
  return cublasLtMatmul(c.lt, p.op, alpha, B, p.la, A, p.lb, beta, C, p.lc, C, p.lc, algo, c.lt_ws, c.lib_ws_bytes,
                        c.s);
}

static cublasStatus_t blas_run(Ctx& c, const half* A, const half* B, half* C, int M, int N, int K, bool acc16) {
  if (acc16) {
    half one = __float2half(1.f), zero = __float2half(0.f);
    return cublasGemmEx(c.blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, B, CUDA_R_16F, K, A, CUDA_R_16F, K, &zero, C,
                        CUDA_R_16F, N, CUBLAS_COMPUTE_16F, CUBLAS_GEMM_DEFAULT);
  }
  float one = 1.f, zero = 0.f;
  return cublasGemmEx(c.blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, B, CUDA_R_16F, K, A, CUDA_R_16F, K, &zero, C,
                      CUDA_R_16F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static std::string algo_to_hex(const cublasLtMatmulAlgo_t& a) {
  std::string s;
  const uint8_t* p = (const uint8_t*)&a;
  for (size_t i = 0; i < sizeof a; ++i) s += fmt("%02x", p[i]);
  return s;
}
static bool algo_from_hex(const std::string& h, cublasLtMatmulAlgo_t& a) {
  if (h.size() != 2 * sizeof a) return false;
  uint8_t* p = (uint8_t*)&a;
  for (size_t i = 0; i < sizeof a; ++i) p[i] = (uint8_t)strtoul(h.substr(2 * i, 2).c_str(), nullptr, 16);
  return true;
}

// Median time (us) of `reps` back-to-back runs of fn, on set 0. Used to rank cuBLASLt algorithms.
template <class F>
static double quick_time_us(Ctx& c, F fn, int reps) {
  cudaEvent_t e0, e1;
  ck(cudaEventCreate(&e0), "event");
  ck(cudaEventCreate(&e1), "event");
  std::vector<float> t;
  for (int i = 0; i < reps + 2; ++i) {
    ck(cudaEventRecord(e0, c.s), "record");
    if (!fn()) {
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      return INFINITY;
    }
    ck(cudaEventRecord(e1, c.s), "record");
    ck(cudaEventSynchronize(e1), "sync");
    float ms;
    ck(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    if (i >= 2) t.push_back(ms * 1000.f);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

static void lt_choose(Ctx& c, LtPlan& p, TaskBufs& b, const std::string& cached_hex, Outcome& out) {
  cublasLtMatmulPreference_t pref;
  ckb(cublasLtMatmulPreferenceCreate(&pref), "lt pref");
  ckb(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &c.lib_ws_bytes,
                                           sizeof c.lib_ws_bytes),
      "lt pref ws");
  cublasLtMatmulHeuristicResult_t res[32];
  int found = 0;
  cublasLtMatmulAlgoGetHeuristic(c.lt, p.op, p.la, p.lb, p.lc, p.lc, pref, 32, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (found < 1) return;
  p.heur = res[0].algo;
  p.have_heur = true;
  const half *A = (const half*)b.A[0].ptr(), *B = (const half*)b.B[0].ptr();
  half* C = (half*)b.C[0].ptr();
  cublasLtMatmulAlgo_t cached;
  cublasLtMatmulHeuristicResult_t chk;
  if (cached_hex != "-" && algo_from_hex(cached_hex, cached) &&
      cublasLtMatmulAlgoCheck(c.lt, p.op, p.la, p.lb, p.lc, p.lc, &cached, &chk) == CUBLAS_STATUS_SUCCESS &&
      chk.workspaceSize <= c.lib_ws_bytes) {
    p.tuned = cached;
    p.have_tuned = true;
    out.algo_hex = cached_hex;
    return;
  }
  double best = INFINITY;
  for (int i = 0; i < found; ++i) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
    double t = quick_time_us(c, [&] { return lt_run(c, p, &res[i].algo, A, B, C, b.acc16) == CUBLAS_STATUS_SUCCESS; }, 5);
    if (t < best) {
      best = t;
      p.tuned = res[i].algo;
      p.have_tuned = true;
    }
  }
  if (p.have_tuned) out.algo_hex = algo_to_hex(p.tuned);
}

// ------------------------------------------------------------------------------------------------ timing
// One timed thing: R calls (one per input set), captured as a graph when possible.
struct Timed {
  std::string name;
  std::function<bool(int)> call;  // issue the call for set i on c.s; false on failure
  cudaGraphExec_t exec = nullptr;
  std::vector<float> samples_us;  // per-call device time
};

static bool issue_all(Timed& t, int R) {
  for (int i = 0; i < R; ++i)
    if (!t.call(i)) return false;
  return true;
}

// Issues calls 0..R-1 into the capture on c.s and records which call added each node of the graph being built
// (cudaStreamGetCaptureInfo hands out that graph, which may be read while the capture goes on). False when a call
// fails or leaves the capture invalidated.
static bool issue_all_captured(Ctx& c, Timed& t, int R, std::map<cudaGraphNode_t, int>& call_of) {
  std::vector<cudaGraphNode_t> nodes;
  for (int i = 0; i < R; ++i) {
    if (!t.call(i)) return false;
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaGraph_t g = nullptr;
    size_t n = 0;
    if (cudaStreamGetCaptureInfo(c.s, &st, nullptr, &g) != cudaSuccess || st != cudaStreamCaptureStatusActive || !g ||
        cudaGraphGetNodes(g, nullptr, &n) != cudaSuccess)
      return cudaGetLastError(), false;
    nodes.resize(n);
    if (n && cudaGraphGetNodes(g, nodes.data(), &n) != cudaSuccess) return cudaGetLastError(), false;
    for (size_t j = 0; j < n; ++j) call_of.emplace(nodes[j], i);  // a node seen after an earlier call keeps its call
  }
  return true;
}

// Edges of `g` that let the downstream node start before the upstream one has finished (programmatic dependent
// launch: a kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization, or waiting on a launch-completion
// or programmatic port) and that leave the call which added the upstream node (`call_of`; a node of no call counts
// as its own). Such an edge lets a timed call overlap the one before it. -1 when the edges cannot be read.
static long cross_call_programmatic_edges(cudaGraph_t g, const std::map<cudaGraphNode_t, int>& call_of) {
  size_t n = 0;
  if (cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n) != cudaSuccess) return cudaGetLastError(), -1;
  if (n == 0) return 0;
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  if (cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n) != cudaSuccess) return cudaGetLastError(), -1;
  long found = 0;
  for (size_t i = 0; i < n; ++i) {
    if (data[i].type == cudaGraphDependencyTypeDefault && data[i].from_port == cudaGraphKernelNodePortDefault) continue;
    auto a = call_of.find(from[i]), b = call_of.find(to[i]);
    found += a == call_of.end() || b == call_of.end() || a->second != b->second;
  }
  return found;
}

// Capture R calls into a graph and, when `instantiate`, make it t's timed path. Returns "" on success, else why not
// (the candidate then runs uncaptured). `cross_call`: the captured graph's programmatic edges between calls
// (cross_call_programmatic_edges), 0 when nothing was captured.
static std::string capture(Ctx& c, Timed& t, int R, bool instantiate, bool& empty, long& cross_call) {
  empty = false;
  cross_call = 0;
  cudaGraph_t g = nullptr;
  if (cudaStreamBeginCapture(c.s, cudaStreamCaptureModeGlobal) != cudaSuccess) {
    cudaGetLastError();
    return "cudaStreamBeginCapture failed";
  }
  std::map<cudaGraphNode_t, int> call_of;
  bool ok = issue_all_captured(c, t, R, call_of);
  cudaError_t e = cudaStreamEndCapture(c.s, &g);
  cudaGetLastError();  // clear a capture-invalidation error; the context is not sticky-broken by it
  if (!ok || e != cudaSuccess || !g) {
    if (g) cudaGraphDestroy(g);
    return ok ? std::string("capture failed: ") + cudaGetErrorString(e) : "a call failed during capture";
  }
  size_t nodes = 0;
  cudaGraphGetNodes(g, nullptr, &nodes);
  if (nodes == 0) {
    empty = true;
    cudaGraphDestroy(g);
    return "graph is empty";
  }
  cross_call = cross_call_programmatic_edges(g, call_of);
  cudaError_t ie = instantiate ? cudaGraphInstantiate(&t.exec, g, 0) : cudaSuccess;
  cudaGraphDestroy(g);
  if (ie != cudaSuccess) {
    cudaGetLastError();
    t.exec = nullptr;
    return std::string("instantiate failed: ") + cudaGetErrorString(ie);
  }
  return "";
}

static bool launch(Ctx& c, Timed& t, int R, int set) {
  if (set < 0) return t.exec ? cudaGraphLaunch(t.exec, c.s) == cudaSuccess : issue_all(t, R);
  return t.call(set);
}

// Quantile f (0..1) of sorted, non-empty v, nearest rank.
static double quantile(const std::vector<float>& v, double f) {
  return (double)v[std::min(v.size() - 1, (size_t)(f * (v.size() - 1) + 0.5))];
}

static std::string timing_json(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  double med = quantile(v, 0.5);
  return fmt("{\"median_us\":%s,\"min_us\":%s,\"p10_us\":%s,\"p90_us\":%s,\"p99_us\":%s,\"spread\":%s,\"reps\":%zu}",
             jnum(med).c_str(), jnum(v.front()).c_str(), jnum(quantile(v, 0.1)).c_str(), jnum(quantile(v, 0.9)).c_str(),
             jnum(quantile(v, 0.99)).c_str(), jnum(med > 0 ? (quantile(v, 0.9) - quantile(v, 0.1)) / med : 0).c_str(),
             v.size());
}

// The candidate's speedup over each baseline, paired by repetition: the median over r of baseline_r / candidate_r.
// time_all times every path once per repetition, in shuffled order, so the two samples of a pair are adjacent in
// time. A shift of the GPU's state between repetitions (a large shape's samples fall in two clusters ~15% apart on
// both sides, e.g. 8192x14336x4096 near 1,260 or 1,460-1,510 us) moves both samples and cancels in their ratio; the
// ratio of the two medians does not cancel it when the medians land in different clusters. ts[0] is the candidate.
static std::string paired_json(const std::vector<Timed>& ts) {
  std::string j;
  const std::vector<float>& cand = ts[0].samples_us;
  for (size_t i = 1; i < ts.size(); ++i) {
    std::vector<float> r;
    for (size_t k = 0; k < cand.size() && k < ts[i].samples_us.size(); ++k)
      if (cand[k] > 0) r.push_back(ts[i].samples_us[k] / cand[k]);
    if (r.empty()) continue;
    std::sort(r.begin(), r.end());
    j += (j.empty() ? "" : ",") + jstr(ts[i].name) +
         fmt(":{\"median\":%s,\"p10\":%s,\"p90\":%s,\"reps\":%zu}", jnum(quantile(r, 0.5)).c_str(),
             jnum(quantile(r, 0.1)).c_str(), jnum(quantile(r, 0.9)).c_str(), r.size());
  }
  return "{" + j + "}";
}

// Interleaved timing of all `ts`, in a fresh random order every repetition.
// offline: each sample is one replay of all R sets, divided by R. cold: the same after an L2 flush (outside the
// timed window), so every call of the replay reads its set from DRAM. server: one call after an L2 flush and a
// Poisson-distributed idle gap; the sample is that call's device time. wallclock: the stream drained, then the
// host time from issuing one call on set 0 to the end of cudaStreamSynchronize (CUDA-L2's timing).
static bool time_all(Ctx& c, std::vector<Timed>& ts, int R, Outcome& out, const std::function<void()>& before) {
  bool server = c.spec.mode == "server", wall = c.spec.mode == "wallclock", cold = c.spec.mode == "cold";
  cudaEvent_t e0, e1;
  ck(cudaEventCreate(&e0), "event");
  ck(cudaEventCreate(&e1), "event");
  std::exponential_distribution<double> gap(c.spec.qps);
  auto one = [&](Timed& t, int set, float& us) -> bool {
    before();  // outside the timed window
    if (wall) {
      ck(cudaStreamSynchronize(c.s), "drain before a wall-clock sample");
      double t0 = now_ms();
      if (!launch(c, t, R, 0)) return false;  // set 0 every time, as CUDA-L2 reuses its tensors
      ck(cudaStreamSynchronize(c.s), "timed call");
      us = (float)((now_ms() - t0) * 1000.0);
      return true;
    }
    if (server || cold) ck(cudaMemsetAsync(c.flush, (int)(c.rng() & 0xff), c.flush_bytes, c.s), "L2 flush");
    if (server) usleep((useconds_t)std::min(1e6 * gap(c.rng), 100000.0));
    ck(cudaEventRecord(e0, c.s), "record");
    if (!launch(c, t, R, server ? set : -1)) return false;
    ck(cudaEventRecord(e1, c.s), "record");
    ck(cudaEventSynchronize(e1), "timed call");
    float ms;
    ck(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    us = ms * 1000.f / (server ? 1 : R);
    return true;
  };
  // Warm-up: each at least twice and for warmup_ms; estimates the per-sample cost for the repetition count.
  double est_ms = 0;
  for (Timed& t : ts) {
    double t0 = now_ms();
    int n = 0;
    float us = 0;
    while (n < 2 || now_ms() - t0 < c.spec.warmup_ms / ts.size()) {
      if (!one(t, n % R, us)) return out.fail("runtime_error", t.name + " failed during warm-up");
      ++n;
    }
    est_ms += (now_ms() - t0) / n;
  }
  int reps = (int)std::clamp(c.spec.target_ms / std::max(est_ms, 1e-3), (double)c.spec.min_reps, (double)c.spec.max_reps);
  std::vector<int> order(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) order[i] = (int)i;
  for (int r = 0; r < reps; ++r) {
    std::shuffle(order.begin(), order.end(), c.rng);
    for (int i : order) {
      float us;
      if (!one(ts[i], r % R, us)) return out.fail("runtime_error", ts[i].name + " failed during timing");
      ts[i].samples_us.push_back(us);
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return true;
}

// After timing: new contents in the same buffers, outputs poisoned, the timed path run once, every set checked.
static bool reverify(Ctx& c, TaskBufs& b, Timed& cand, Outcome& out) {
  size_t nc = (size_t)b.M * b.N;
  std::vector<uint64_t> seeds;
  for (int i = 0; i < b.R; ++i) {
    seeds.push_back(c.rng());
    fill_inputs(c, (half*)b.A[i].ptr(), (half*)b.B[i].ptr(), b.M, b.N, b.K, 0, seeds.back());
    ck(cudaMemsetAsync(b.C[i].ptr(), 0xFF, nc * 2, c.s), "poison");
  }
  // launch(-1) replays the timed graph (or issues every set when there is none); other modes time plain calls.
  bool ok = c.spec.replays() ? launch(c, cand, b.R, -1) : issue_all(cand, b.R);
  if (!ok) return out.fail("runtime_error", "re-verification: the timed call failed");
  ck(cudaStreamSynchronize(c.s), "re-verification");
  double tol = b.tol_normal;
  for (int i = 0; i < b.R; ++i) {
    reference(c, (const half*)b.A[i].ptr(), (const half*)b.B[i].ptr(), b.ref, b.M, b.N, b.K);
    CmpOut r = compare(c, (const half*)b.C[i].ptr(), b.ref, nc);
    double err = r.ref2 > 0 ? sqrt(r.diff2 / r.ref2) : 0;
    if (r.nonfinite || !(err <= tol))
      return out.fail("wrong_answer",
                      fmt("timed-call re-verification: set %d of %d wrong after its inputs changed (%llu unwritten, "
                          "relative error %.3g): results cached or work skipped in timed calls?",
                          i + 1, b.R, r.nonfinite, err));
  }
  out.checks.push_back(fmt("timed-call re-verification (%d sets)", b.R));
  return true;
}

// What the capture of the candidate's R calls says about it (checks on); false after out.fail.
static bool capture_verdict(const Ctx& c, const std::string& why, bool empty, long cross_call, int R, Outcome& out) {
  if (empty)
    return out.fail("rejected_behaviour", "enqueued no GPU work while its stream was being captured into a CUDA "
                                          "graph (detects capture and behaves differently)");
  if (cross_call < 0)
    return out.fail("rejected_behaviour", "the edges of its captured CUDA graph could not be read, so programmatic "
                                          "dependent launch between calls cannot be ruled out");
  if (cross_call > 0)
    return out.fail("rejected_behaviour",
                    fmt("launches with programmatic dependent launch (PDL) across calls: %ld programmatic edge(s) "
                        "between its %d timed calls in the captured graph, so a call could start before the one "
                        "before it ends; PDL is allowed only between kernels of one call",
                        cross_call, R));
  if (!why.empty() && c.spec.pdl)
    return out.fail("rejected_behaviour",
                    "spells programmatic dependent launch but its calls could not be captured into a CUDA graph (" +
                        why + "), so PDL edges between calls cannot be ruled out");
  return true;
}

static bool timing(Ctx& c, TaskBufs& b, const TaskSpec& t, Outcome& out) {
  int R = b.R;
  std::vector<Timed> ts;
  if (c.cand)  // absent in baseline-only runs (`cudal2 baseline`)
    ts.push_back({"candidate", [&](int i) { return call_candidate(c, b, i) == 0 && cudaPeekAtLastError() == cudaSuccess; }});
  LtPlan plan;
  auto set_ptrs = [&b](int i) {
    return std::make_tuple((const half*)b.A[i].ptr(), (const half*)b.B[i].ptr(), (half*)b.C[i].ptr());
  };
  if (c.spec.baselines) {
    ts.push_back({"cublas", [&](int i) {
                    auto [A, B, C] = set_ptrs(i);
                    return blas_run(c, A, B, C, b.M, b.N, b.K, b.acc16) == CUBLAS_STATUS_SUCCESS;
                  }});
    lt_setup(c, plan, b.M, b.N, b.K, b.acc16);
    lt_choose(c, plan, b, t.algo_hex, out);
    if (plan.have_heur)
      ts.push_back({"cublaslt_heuristic", [&](int i) {
                      auto [A, B, C] = set_ptrs(i);
                      return lt_run(c, plan, &plan.heur, A, B, C, b.acc16) == CUBLAS_STATUS_SUCCESS;
                    }});
    if (plan.have_tuned)
      ts.push_back({"cublaslt_autotuned", [&](int i) {
                      auto [A, B, C] = set_ptrs(i);
                      return lt_run(c, plan, &plan.tuned, A, B, C, b.acc16) == CUBLAS_STATUS_SUCCESS;
                    }});
  }
  bool ok = true;
  // Offline and cold time graph replays of every path. The other modes time plain calls but still capture the
  // candidate's calls once (checks on), so that what its graph shows (no work, PDL between calls) is checked in
  // every mode.
  bool replays = c.spec.replays();
  for (Timed& x : ts) {
    bool cand = c.cand && &x == &ts[0];
    if (!replays && !(cand && c.spec.checks)) continue;
    bool empty = false;
    long cross_call = 0;
    std::string why = capture(c, x, R, replays, empty, cross_call);
    if (!cand) continue;
    if (c.spec.checks && !(ok = capture_verdict(c, why, empty, cross_call, R, out))) break;
    out.graph = replays && why.empty();
  }
  // Before every timed sample (outside the timed window): outputs poisoned, workspace garbage, a few input
  // elements of every set changed. A candidate that keeps results between calls (keyed by pointer, shape or
  // sampled content) must still compute everything, so caching cannot buy time.
  auto scramble = [&]() {
    if (!c.spec.checks) return;
    size_t na = (size_t)b.M * b.K, nb = (size_t)b.N * b.K, nc = (size_t)b.M * b.N;
    for (int i = 0; i < R; ++i) {
      ck(cudaMemsetAsync(b.C[i].ptr(), 0xFF, nc * 2, c.s), "poison");
      k_perturb<<<1, 32, 0, c.s>>>((half*)b.A[i].ptr(), na, c.rng());
      k_perturb<<<1, 32, 0, c.s>>>((half*)b.B[i].ptr(), nb, c.rng());
    }
    if (b.ws) k_fill_garbage<<<blocks_for(b.ws / 2), 256, 0, c.s>>>((uint16_t*)b.W.ptr(), b.ws / 2, c.rng());
  };
  if (ok) ok = time_all(c, ts, R, out, scramble);
  if (ok && c.cand && c.spec.checks) ok = reverify(c, b, ts[0], out);
  if (ok) {
    std::string j;
    for (Timed& x : ts) j += (j.empty() ? "" : ",") + jstr(x.name) + ":" + timing_json(x.samples_us);
    out.timings_json = "{" + j + "}";
    if (c.cand && ts.size() > 1) out.paired_json = paired_json(ts);
  }
  for (Timed& x : ts)
    if (x.exec) cudaGraphExecDestroy(x.exec);
  plan.release();
  return ok;
}

// ------------------------------------------------------------------------------------------------ per task
static size_t pick_sets(const Ctx& c, int M, int N, int K) {
  // Enough rotating sets that back-to-back calls do not find their inputs in L2 (3x L2), within limits. The
  // max_sets limit (32) bounds the graph and the checks, so a set under ~L2 / 31 bytes is still in L2 when its
  // turn comes again: offline times such shapes with warm inputs, cold mode flushes first.
  size_t set_bytes = ((size_t)M * K + (size_t)N * K + (size_t)M * N) * 2;
  size_t want = (3 * (size_t)c.prop.l2CacheSize + set_bytes - 1) / set_bytes;
  size_t cap_mem = std::max<size_t>(2, (size_t)(8ull << 30) / set_bytes);
  return std::max<size_t>(2, std::min<size_t>({want, (size_t)c.spec.max_sets, cap_mem}));
}

static const size_t MAX_WORKSPACE = 8ull << 30;  // bytes a candidate may ask for

static bool setup_task(Ctx& c, TaskBufs& b, const TaskSpec& t, Outcome& out) {
  b.M = t.m;
  b.N = t.n;
  b.K = t.k;
  b.acc16 = t.acc16;
  b.R = c.spec.checks || c.spec.mode == "server" ? (int)pick_sets(c, t.m, t.n, t.k) : 1;
  if (c.cand_ws) {
    g_candidate_ran = true;
    b.ws = c.cand_ws(t.m, t.n, t.k);
    if (b.ws > MAX_WORKSPACE)
      return out.fail("runtime_error", fmt("cudal2_workspace_bytes asked for %zu bytes; the limit is %zu", b.ws,
                                           MAX_WORKSPACE));
  }
  size_t na = (size_t)t.m * t.k, nb = (size_t)t.n * t.k, nc = (size_t)t.m * t.n;
  b.A.resize(b.R);
  b.B.resize(b.R);
  b.C.resize(b.R);
  for (int i = 0; i < b.R; ++i) {
    b.A[i].alloc(na * 2, c.rng(), c.s);
    b.B[i].alloc(nb * 2, c.rng(), c.s);
    b.C[i].alloc(nc * 2, c.rng(), c.s);
    if (i > 0) fill_inputs(c, (half*)b.A[i].ptr(), (half*)b.B[i].ptr(), t.m, t.n, t.k, 0, c.rng());
  }
  if (b.ws) b.W.alloc(b.ws, c.rng(), c.s);
  ck(cudaMalloc(&b.A_true, na * 2), "cudaMalloc");
  ck(cudaMalloc(&b.B_true, nb * 2), "cudaMalloc");
  ck(cudaMalloc(&b.C_prev, nc * 2), "cudaMalloc");
  ck(cudaMalloc(&b.C_snap, nc * 2), "cudaMalloc");
  ck(cudaMalloc(&b.ref, nc * 4), "cudaMalloc");
  ck(cudaStreamSynchronize(c.s), "setup");
  return true;
}

static void eval_task(Ctx& c, const TaskSpec& t, Outcome& out) {
  TaskBufs b;
  try {
    if (setup_task(c, b, t, out) && (!c.cand || correctness(c, b, out))) {
      // Set 0 must hold ordinary inputs for timing too (the checks left integer data there).
      fill_inputs(c, (half*)b.A[0].ptr(), (half*)b.B[0].ptr(), t.m, t.n, t.k, 0, c.rng());
      timing(c, b, t, out);
    }
  } catch (Fatal& f) {
    b.release();
    throw;
  }
  b.release();
}

static std::string task_line(const TaskSpec& t, const Outcome& o) {
  std::string checks;
  for (auto& x : o.checks) checks += (checks.empty() ? "" : ",") + jstr(x);
  return fmt("\"event\":\"task\",\"m\":%d,\"n\":%d,\"k\":%d,\"acc\":\"%s\",", t.m, t.n, t.k, t.acc16 ? "fp16" : "fp32") +
         "\"status\":" + jstr(o.status) + ",\"reason\":" + jstr(o.reason) + ",\"max_rel_err\":" + jnum(o.max_err) +
         ",\"graph\":" + (o.graph ? "true" : "false") + ",\"checks\":[" + checks + "],\"timings\":" +
         (o.timings_json.empty() ? "{}" : o.timings_json) +
         ",\"paired\":" + (o.paired_json.empty() ? "{}" : o.paired_json) + ",\"algo_hex\":" + jstr(o.algo_hex);
}

static void init_gpu(Ctx& c) {
  ck(cudaSetDevice(0), "cudaSetDevice");
  ck(cudaFree(0), "CUDA init");
  ck(cudaGetDeviceProperties(&c.prop, 0), "cudaGetDeviceProperties");
  ck(cudaStreamCreateWithFlags(&c.s, cudaStreamNonBlocking), "stream");
  ckb(cublasCreate(&c.blas), "cublasCreate");
  ckb(cublasLtCreate(&c.lt), "cublasLtCreate");
  ck(cudaMalloc(&c.blas_ws, c.lib_ws_bytes), "cudaMalloc");
  ck(cudaMalloc(&c.lt_ws, c.lib_ws_bytes), "cudaMalloc");
  ckb(cublasSetStream(c.blas, c.s), "cublasSetStream");
  ckb(cublasSetWorkspace(c.blas, c.blas_ws, c.lib_ws_bytes), "cublasSetWorkspace");
  c.flush_bytes = std::max<size_t>(2 * (size_t)c.prop.l2CacheSize, 128u << 20);
  ck(cudaMalloc(&c.flush, c.flush_bytes), "cudaMalloc");
  ck(cudaMalloc(&c.dev.counters, 64), "cudaMalloc");
  ck(cudaMalloc(&c.dev.cmp, sizeof(CmpOut)), "cudaMalloc");
  ck(cudaDeviceSynchronize(), "init");
}

static void fail_all(Ctx& c, size_t from, const std::string& status, const std::string& why) {
  for (size_t i = from; i < c.spec.tasks.size(); ++i) {
    Outcome o;
    o.fail(status, why);
    c.rep.line(task_line(c.spec.tasks[i], o));
  }
}

int main(int argc, char** argv) {
  if (argc < 4 || strcmp(argv[2], "--result-fd") != 0) {
    fprintf(stderr, "usage: harness CANDIDATE.so --result-fd FD < spec\n");
    return 2;
  }
  Ctx c;
  char nonce[128] = {0};
  c.spec = read_spec(nonce, sizeof nonce);
  c.rng.seed(c.spec.seed);
  std::mt19937_64 keys(std::random_device{}());
  c.rep.set_nonce(nonce, keys);
  memset(nonce, 0, sizeof nonce);
  int fd = atoi(argv[3]);
  c.rep.fd = fcntl(fd, F_DUPFD_CLOEXEC, 100 + (int)(keys() % 800));
  close(fd);
  if (c.rep.fd < 0) return 3;
  cudal2_sandbox_report sb;
  memset(&sb, 0, sizeof sb);
  cudal2_sandbox_netns(&sb);
  try {
    init_gpu(c);
  } catch (Fatal& f) {
    c.rep.line("\"event\":\"fatal\",\"reason\":" + jstr("GPU initialisation failed: " + f.msg));
    _exit(0);
  }
  // The TMA descriptor encoders CUTLASS calls live in the driver library; make them resolvable for the candidate.
  dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  cudal2_sandbox_confine(c.spec.sandbox_dir.c_str(), &sb);
  c.rep.line(fmt("\"event\":\"start\",\"gpu\":%s,\"cc\":\"%d.%d\",\"sms\":%d,\"l2_bytes\":%d,", jstr(c.prop.name).c_str(),
                 c.prop.major, c.prop.minor, c.prop.multiProcessorCount, c.prop.l2CacheSize) +
             "\"sandbox\":{\"netns\":" + jstr(sb.netns) + ",\"landlock\":" + jstr(sb.landlock) +
             ",\"seccomp\":" + jstr(sb.seccomp) + "}");
  bool baseline_only = strcmp(argv[1], "-") == 0;
  void* h = baseline_only ? nullptr : dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!baseline_only && !h) {
    const char* e = dlerror();
    fail_all(c, 0, "runtime_error", std::string("cannot load the candidate library: ") + (e ? e : "?"));
    c.rep.line("\"event\":\"done\"");
    _exit(0);
  }
  c.cand = h ? (hgemm_fn)dlsym(h, "cudal2_hgemm") : nullptr;
  c.cand_ws = h ? (ws_fn)dlsym(h, "cudal2_workspace_bytes") : nullptr;
  if (!baseline_only && !c.cand) {
    fail_all(c, 0, "static_reject", "the library exports no cudal2_hgemm (is it extern \"C\"?)");
    c.rep.line("\"event\":\"done\"");
    _exit(0);
  }
  for (size_t i = 0; i < c.spec.tasks.size(); ++i) {
    const TaskSpec& t = c.spec.tasks[i];
    c.rep.line(fmt("\"event\":\"begin\",\"m\":%d,\"n\":%d,\"k\":%d", t.m, t.n, t.k));
    Outcome o;
    try {
      eval_task(c, t, o);
    } catch (Fatal& f) {
      // A CUDA error in the harness's own calls: after a candidate ran, the context is poisoned by it.
      std::string st = g_candidate_ran ? "runtime_error" : "internal_error";
      o.fail(st, "CUDA error: " + f.msg);
      c.rep.line(task_line(t, o));
      fail_all(c, i + 1, st, "not run: the CUDA context was lost on an earlier shape (" + f.msg + ")");
      break;
    }
    c.rep.line(task_line(t, o));
  }
  c.rep.line("\"event\":\"done\"");
  fflush(stdout);
  _exit(0);
}
