// kernel_profile.cu: one call of a candidate library and one of the cuBLAS baseline on one shape, for Nsight Compute.
//
// Why it exists: where the family loses to cuBLAS by 5-10% on a 3-10 us shape, graph-replay timing says by how much
// but not where. Under `ncu` (benchmarks/kernel_profile.py drives it) each kernel of the two calls is replayed with
// the caches flushed and its counters read: its own duration, launch shape, registers, shared memory, DRAM bytes,
// instructions and warp stall reasons, side by side with cuBLAS's kernel on the same shape.
// It times nothing itself and checks no numbers (the evaluator does both); the candidate runs exactly as the harness
// runs it (dlopen, `cudal2_workspace_bytes`, `cudal2_hgemm` on one stream), cuBLAS as the harness's cuBLAS baseline
// (cublasGemmEx, fp32 compute, torch.matmul's settings, a 32 MiB workspace).
//
//     nvcc -O2 -std=c++17 -arch=sm_90a -o /tmp/kernel_profile benchmarks/kernel_profile.cu -lcublas -ldl
//     ncu --clock-control none ... /tmp/kernel_profile candidate.so M N K
//
// Its own fill kernel is named `kp_fill` so that a kernel filter can leave it out (`-k regex:'^(?!kp_)'`).
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "cuda_check.h"

constexpr size_t WORKSPACE = 32u << 20;  // bytes, as the harness gives cuBLAS (and what torch gives it on Hopper)

using hgemm_fn = int (*)(const half*, const half*, half*, int, int, int, void*, size_t, cudaStream_t);
using ws_fn = size_t (*)(int, int, int);

// Values in [-1, 1) from a hash of the index: no host copy, the same data on every run.
__global__ void kp_fill(half* p, size_t n, unsigned salt) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ salt;
    h ^= h >> 13;
    p[i] = __float2half(float(h & 0xffff) / 32768.f - 1.f);
  }
}

int main(int argc, char** argv) {
  int m = 0, n = 0, k = 0;
  if (argc != 5 || (m = std::atoi(argv[2])) <= 0 || (n = std::atoi(argv[3])) <= 0 || (k = std::atoi(argv[4])) <= 0) {
    std::fprintf(stderr, "usage: %s candidate.so M N K\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  hgemm_fn cand = lib ? (hgemm_fn)dlsym(lib, "cudal2_hgemm") : nullptr;
  ws_fn cand_ws = lib ? (ws_fn)dlsym(lib, "cudal2_workspace_bytes") : nullptr;
  if (!cand) {
    std::fprintf(stderr, "%s: no cudal2_hgemm (%s)\n", argv[1], dlerror());
    return 2;
  }
  half *a, *b, *c;
  void *ws = nullptr, *blas_ws;
  size_t ws_bytes = cand_ws ? cand_ws(m, n, k) : 0;
  CK(cudaMalloc(&a, size_t(m) * k * sizeof(half)));
  CK(cudaMalloc(&b, size_t(n) * k * sizeof(half)));
  CK(cudaMalloc(&c, size_t(m) * n * sizeof(half)));
  CK(cudaMalloc(&blas_ws, WORKSPACE));
  if (ws_bytes) CK(cudaMalloc(&ws, ws_bytes));
  kp_fill<<<1024, 256>>>(a, size_t(m) * k, 1u);
  kp_fill<<<1024, 256>>>(b, size_t(n) * k, 2u);
  // Two streams, the candidate's created first: Nsight Compute's "Stream" column tells the two calls' kernels apart.
  cudaStream_t s, blas_s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&blas_s, cudaStreamNonBlocking));
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS || cublasSetStream(h, blas_s) != CUBLAS_STATUS_SUCCESS ||
      cublasSetWorkspace(h, blas_ws, WORKSPACE) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cuBLAS setup failed\n");
    return 1;
  }
  CK(cudaDeviceSynchronize());
  int rc = cand(a, b, c, m, n, k, ws, ws_bytes, s);
  if (rc != 0) {
    std::fprintf(stderr, "cudal2_hgemm returned %d\n", rc);
    return 1;
  }
  CK(cudaStreamSynchronize(s));
  // C[M,N] = A[M,K] B[N,K]^T row-major is, column-major, C^T[N,M] = B A^T: the harness's call.
  float one = 1.f, zero = 0.f;
  if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, b, CUDA_R_16F, k, a, CUDA_R_16F, k, &zero, c,
                   CUDA_R_16F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasGemmEx failed\n");
    return 1;
  }
  CK(cudaStreamSynchronize(blas_s));
  std::printf("%dx%dx%d candidate and cuBLAS called once each (candidate workspace %zu bytes)\n", m, n, k, ws_bytes);
  return 0;
}
