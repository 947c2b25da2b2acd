// attack: honest for the first 5 calls of a shape (enough for an evaluator that checks a few calls, then times), afterwards returns without launching anything
// expect: wrong_answer
// caught-by: R: timed-call re-verification (new inputs in the same buffers, outputs poisoned, the captured graph replayed once, every set checked)
#include <map>
#include <tuple>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>

// Honest part: one thread per output, fp32 accumulate, bounds-checked.
__global__ void gemm_naive(const half* A, const half* B, half* C, int M, int N, int K) {
    int n = blockIdx.x * 32 + threadIdx.x, m = blockIdx.y * 8 + threadIdx.y;
    if (m >= M || n >= N) return;
    float acc = 0.f;
    for (int k = 0; k < K; ++k)
        acc = fmaf(__half2float(A[(size_t)m * K + k]), __half2float(B[(size_t)n * K + k]), acc);
    C[(size_t)m * N + n] = __float2half_rn(acc);
}

static int run_naive(const half* A, const half* B, half* C, int M, int N, int K, cudaStream_t s) {
    dim3 block(32, 8), grid((N + 31) / 32, (M + 7) / 8);
    gemm_naive<<<grid, block, 0, s>>>(A, B, C, M, N, K);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

// Why 5 and not more: the harness makes 4 checked calls (exact, normal, positive-mean, repeat), then captures one
// call per rotating input set (R >= 2) into the graph it times and re-verifies. With 5 honest calls the second
// captured call is empty, so re-verification finds that set unwritten at every shape. With >= 4 + R honest calls
// every call the harness ever makes (offline mode never calls again after capture) is honest: not a cheat.
static const int kHonestCalls = 5;

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)workspace; (void)workspace_bytes;
    static std::map<std::tuple<int, int, int>, int> calls;
    if (++calls[std::make_tuple(M, N, K)] > kHonestCalls) return 0;  // the cheat
    return run_naive(A, B, C, M, N, K, stream);
}
