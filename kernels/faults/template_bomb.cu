// fault: compile-time bomb: 4096 distinct template instantiations, each folding a 200000-step constexpr loop (just under the front end's per-evaluation complexity limit), inside a __device__ function so only the EDG front ends (cudafe++, cicc) evaluate it; about 0.15 s per instantiation per front end, so nvcc runs for well over 10 minutes with flat memory (~200 MB)
// expect: timeout
// caught-by: compiler: the nvcc wall-clock limit (compile_timeout_s, 180 s by default) kills the process group; not cached
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <utility>

constexpr unsigned long long burn(unsigned long long n, unsigned long long seed) {
    unsigned long long x = seed;
    for (unsigned long long i = 0; i < n; ++i) x = x * 6364136223846793005ull + i;
    return x;
}

template <int I>
struct Burn {
    static constexpr unsigned long long value = burn(200000ull, I);  // a fresh evaluation per I
};

template <size_t... I>
constexpr unsigned long long fold_all(std::index_sequence<I...>) {
    return (Burn<(int)I>::value ^ ...);
}

__device__ void never_called() {
    static_assert(fold_all(std::make_index_sequence<4096>{}) != 1, "never fails: the point is the time taken");
}

extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    (void)A; (void)B; (void)C; (void)M; (void)N; (void)K; (void)workspace; (void)workspace_bytes; (void)stream;
    return 1;
}
