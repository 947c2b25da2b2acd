// fake_harness.c: a CPU-only test double of cudal2/sandbox/harness/harness.cu.
//
// Same command line, same spec on stdin, same confinement (it includes the real sandbox.h), same result
// protocol on the result fd; only the measurement differs: the candidate is a host-only library whose
// cudal2_hgemm takes float host buffers, and correctness is a plain comparison. CI runs it through the real
// runner.py and evaluator.measure(), so process isolation, deadlines, forgery and crash handling are tested
// without a GPU.
#include "../../../cudal2/sandbox/harness/sandbox.h"

#include <dlfcn.h>
#include <stdlib.h>

typedef int (*fake_fn)(const float*, const float*, float*, int, int, int, void*, size_t, void*);

static int g_fd;
static char g_nonce[128];

static void emit(const char* body) {
  char line[4096];
  int n = snprintf(line, sizeof line, "{\"nonce\":\"%s\",%s}\n", g_nonce, body);
  if (write(g_fd, line, (size_t)n) != n) _exit(3);
}

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  g_fd = atoi(argv[3]);
  char line[512], dir[300] = ".";
  int tm[64], tn[64], tk[64], nt = 0;
  while (fgets(line, sizeof line, stdin)) {
    if (strncmp(line, "end", 3) == 0) break;
    if (sscanf(line, "nonce %127s", g_nonce) == 1) continue;
    if (sscanf(line, "sandbox_dir %299s", dir) == 1) continue;
    if (nt < 64 && sscanf(line, "task %d %d %d", &tm[nt], &tn[nt], &tk[nt]) == 3) ++nt;
  }
  cudal2_sandbox_report sb;
  memset(&sb, 0, sizeof sb);
  cudal2_sandbox_netns(&sb);
  cudal2_sandbox_confine(dir, &sb);
  char body[1024];
  snprintf(body, sizeof body,
           "\"event\":\"start\",\"gpu\":\"cpu double\",\"sandbox\":{\"netns\":\"%s\",\"landlock\":\"%s\",\"seccomp\":\"%s\"}",
           sb.netns, sb.landlock, sb.seccomp);
  emit(body);
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  fake_fn f = h ? (fake_fn)dlsym(h, "cudal2_hgemm") : NULL;
  for (int t = 0; t < nt; ++t) {
    int M = tm[t], N = tn[t], K = tk[t];
    snprintf(body, sizeof body, "\"event\":\"begin\",\"m\":%d,\"n\":%d,\"k\":%d", M, N, K);
    emit(body);
    const char* status = "ok";
    const char* reason = "";
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * N * K), *C = malloc(sizeof(float) * M * N);
    for (int i = 0; i < M * K; ++i) A[i] = (float)(rand() % 5 - 2);
    for (int i = 0; i < N * K; ++i) B[i] = (float)(rand() % 5 - 2);
    for (int i = 0; i < M * N; ++i) C[i] = -12345.f;
    int rc = f ? f(A, B, C, M, N, K, NULL, 0, NULL) : -1;
    if (rc != 0) {
      status = "runtime_error";
      reason = "cudal2_hgemm returned non-zero";
    } else {
      for (int m = 0; m < M && !*reason; ++m)
        for (int n = 0; n < N; ++n) {
          float s = 0;
          for (int k = 0; k < K; ++k) s += A[m * K + k] * B[n * K + k];
          if (C[m * N + n] != s) {
            status = "wrong_answer";
            reason = "output differs from the reference";
            break;
          }
        }
    }
    snprintf(body, sizeof body,
             "\"event\":\"task\",\"m\":%d,\"n\":%d,\"k\":%d,\"acc\":\"fp32\",\"status\":\"%s\",\"reason\":\"%s\","
             "\"max_rel_err\":0,\"graph\":false,\"checks\":[],\"timings\":{},\"algo_hex\":\"-\"",
             M, N, K, status, reason);
    emit(body);
    free(A);
    free(B);
    free(C);
  }
  emit("\"event\":\"done\"");
  _exit(0);
}
