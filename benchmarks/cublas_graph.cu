// cublas_graph.cu: what the evaluator's cuBLAS baseline (cublasGemmEx with torch.matmul's settings, as harness.cu
// calls it) puts into the offline-mode graph, shape by shape: the nodes of one call (for a kernel: its name, grid,
// block, cluster and dynamic shared memory, and whether it was launched with programmatic dependent launch) and the
// programmatic edges between the R back-to-back calls.
//
// Why it exists:
//   - Candidates may not use programmatic dependent launch (PDL; evaluator 0.2.0): a timed call must not overlap the
//     one before it. If cuBLAS's own graph has programmatic edges, the baseline gets that overlap and every speedup
//     the leaderboard reports is understated by it. This says whether it does.
//   - The kernel names say what cuBLAS runs where the family loses (tile, stages, split-K, a second reduction
//     kernel). `cudal2.sandbox.lt_algo` decodes cuBLASLt's *autotuned* algorithm, which is not always the kernel
//     cuBLAS's default heuristic picks.
// It times nothing (the evaluator does). The cuBLAS headers and library are needed (the GPU machine has them):
//
//     nvcc -O2 -std=c++17 -arch=sm_90a -o /tmp/cublas_graph benchmarks/cublas_graph.cu -lcublas -lcuda
//     /tmp/cublas_graph 1024x512x256 128x128x16384 ...     (M x N x K, row-major C[M,N] = A[M,K] B[N,K]^T)
//
// One line per shape: `MxNxK nodes/call=N programmatic_edges=E`, then one indented line per distinct node (a kernel
// with its launch) and how many of it each call adds.
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "cuda_check.h"

constexpr int R = 64;                     // calls per graph, as in the harness's offline mode
constexpr size_t WORKSPACE = 32u << 20;   // cuBLAS workspace: 32 MiB, what torch (and the harness) gives it on Hopper

struct Shape {
  int m, n, k;
};

static bool parse(const char* s, Shape& out) {
  char tail = 0;
  return std::sscanf(s, "%dx%dx%d%c", &out.m, &out.n, &out.k, &tail) == 3 && out.m > 0 && out.n > 0 && out.k > 0;
}

// The harness's `programmatic_edges`: edges that let the downstream node start before the upstream one has finished.
static long programmatic_edges(cudaGraph_t g) {
  size_t n = 0;
  CK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
  if (n == 0) return 0;
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  CK(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n));
  long found = 0;
  for (const cudaGraphEdgeData& d : data)
    found += d.type != cudaGraphDependencyTypeDefault || d.from_port != cudaGraphKernelNodePortDefault;
  return found;
}

// A kernel node in words. cuBLAS launches through the driver API, sometimes with a CUkernel rather than a
// CUfunction, so the driver's node parameters and both name lookups.
static std::string describe_kernel(cudaGraphNode_t node) {
  CUDA_KERNEL_NODE_PARAMS p{};
  if (cuGraphKernelNodeGetParams((CUgraphNode)node, &p) != CUDA_SUCCESS) return "kernel (parameters unreadable)";
  const char* name = nullptr;
  if (p.func) cuFuncGetName(&name, p.func);
  if (!name && p.kern) cuKernelGetName(&name, p.kern);
  CUlaunchAttributeValue cluster{}, pdl{};
  bool has_cluster =
      cuGraphKernelNodeGetAttribute((CUgraphNode)node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &cluster) == CUDA_SUCCESS;
  bool has_pdl = cuGraphKernelNodeGetAttribute((CUgraphNode)node, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                                               &pdl) == CUDA_SUCCESS;
  char buf[256];
  std::snprintf(buf, sizeof buf, " grid=%ux%ux%u block=%u cluster=%ux%ux%u smem=%u pdl=%d", p.gridDimX, p.gridDimY,
                p.gridDimZ, p.blockDimX * p.blockDimY * p.blockDimZ, has_cluster ? cluster.clusterDim.x : 0,
                has_cluster ? cluster.clusterDim.y : 0, has_cluster ? cluster.clusterDim.z : 0, p.sharedMemBytes,
                has_pdl ? (int)pdl.programmaticStreamSerializationAllowed : -1);
  return std::string("kernel ") + (name ? name : "(unnamed)") + buf;
}

static const char* node_kind(cudaGraphNodeType t) {
  switch (t) {
    case cudaGraphNodeTypeKernel: return "kernel";
    case cudaGraphNodeTypeMemset: return "memset";
    case cudaGraphNodeTypeMemcpy: return "memcpy";
    case cudaGraphNodeTypeEmpty: return "empty";
    case cudaGraphNodeTypeEventRecord: return "event record";
    case cudaGraphNodeTypeWaitEvent: return "event wait";
    default: return "other";
  }
}

__global__ void fill(half* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = __float2half((float)((i * 2654435761u + seed) % 17) / 16.f - 0.5f);
}

static void report(cublasHandle_t blas, cudaStream_t s, Shape sh) {
  half *A, *B, *C;
  CK(cudaMalloc(&A, (size_t)sh.m * sh.k * sizeof(half)));
  CK(cudaMalloc(&B, (size_t)sh.n * sh.k * sizeof(half)));
  CK(cudaMalloc(&C, (size_t)sh.m * sh.n * sizeof(half)));
  fill<<<1024, 256, 0, s>>>(A, (size_t)sh.m * sh.k, 1);
  fill<<<1024, 256, 0, s>>>(B, (size_t)sh.n * sh.k, 2);
  float one = 1.f, zero = 0.f;
  // harness.cu's blas_run (fp32 accumulate): row-major C = A B^T as column-major C^T = B^T(op T) A.
  auto call = [&] {
    return cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, sh.n, sh.m, sh.k, &one, B, CUDA_R_16F, sh.k, A, CUDA_R_16F,
                        sh.k, &zero, C, CUDA_R_16F, sh.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  auto release = [&] {
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(C));
  };
  if (call() != CUBLAS_STATUS_SUCCESS) {  // warm-up outside the capture, as the harness's first calls are
    std::printf("%dx%dx%d cublasGemmEx failed\n", sh.m, sh.n, sh.k);
    return release();
  }
  CK(cudaStreamSynchronize(s));
  cudaGraph_t g = nullptr;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  bool ok = true;
  for (int i = 0; i < R && ok; ++i) ok = call() == CUBLAS_STATUS_SUCCESS;
  CK(cudaStreamEndCapture(s, &g));
  size_t n = 0;
  CK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  CK(cudaGraphGetNodes(g, nodes.data(), &n));
  std::printf("%dx%dx%d nodes/call=%.2f programmatic_edges=%ld%s\n", sh.m, sh.n, sh.k, (double)n / R,
              programmatic_edges(g), ok ? "" : " (a captured call failed)");
  // Each distinct node with its count per call. cudaGraphGetNodes promises no order, so not "the first call's nodes".
  std::map<std::string, int> kinds;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    CK(cudaGraphNodeGetType(node, &t));
    ++kinds[t == cudaGraphNodeTypeKernel ? describe_kernel(node) : node_kind(t)];
  }
  for (const auto& [what, count] : kinds) std::printf("  %.2f/call  %s\n", (double)count / R, what.c_str());
  CK(cudaGraphDestroy(g));
  release();
}

int main(int argc, char** argv) {
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    Shape s{};
    if (!parse(argv[i], s)) {
      std::fprintf(stderr, "cublas_graph: %s is not a shape MxNxK of positive integers\n", argv[i]);
      return 2;
    }
    shapes.push_back(s);
  }
  if (shapes.empty()) {
    std::fprintf(stderr, "usage: cublas_graph MxNxK [MxNxK ...]\n");
    return 2;
  }
  cudaStream_t s;
  cublasHandle_t blas;
  void* ws;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return std::fprintf(stderr, "cublasCreate failed\n"), 1;
  CK(cudaMalloc(&ws, WORKSPACE));
  cublasSetStream(blas, s);
  cublasSetWorkspace(blas, ws, WORKSPACE);
  for (const Shape& sh : shapes) report(blas, s, sh);
  return 0;
}
