"""Process isolation and sandbox tests on the CPU, through a test double of the harness.

tests/sandbox/double/fake_harness.c speaks the harness's protocol and applies the real sandbox.h; the candidates
here are host-only libraries. Everything else is the production path: runner.run_harness (scrubbed env, rlimits,
process group, deadlines, capped output, nonce-checked result channel) and evaluator.measure (crash and hang
recovery, statuses). A measure the machine does not permit (no landlock, no seccomp) makes its test skip with
the reason, as the evaluator's notes would say.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cudal2.sandbox.evaluator import measure
from cudal2.sandbox.runner import RunLimits, run_harness
from cudal2.sandbox.types import Status, Task

DOUBLE = Path(__file__).parent / "double" / "fake_harness.c"
HARNESS_DIR = Path(__file__).resolve().parents[2] / "cudal2" / "sandbox" / "harness"

PRELUDE = r"""
#define _GNU_SOURCE 1
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/ptrace.h>
static void honest(const float* A, const float* B, float* C, int M, int N, int K) {
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      float s = 0;
      for (int k = 0; k < K; ++k) s += A[m * K + k] * B[n * K + k];
      C[m * N + n] = s;
    }
}
int cudal2_hgemm(const float* A, const float* B, float* C, int M, int N, int K, void* w, unsigned long wb, void* s) {
"""

TASKS = [Task(8, 8, 8), Task(16, 8, 4), Task(4, 4, 4)]
LIMITS = RunLimits(start_timeout_s=20, task_timeout_s=3, max_output_bytes=4096)


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("double") / "fake_harness"
    subprocess.run(["gcc", "-O1", "-o", str(out), str(DOUBLE), "-ldl"], check=True, capture_output=True)
    return str(out)


@pytest.fixture
def build(tmp_path):
    def _build(body: str, name: str = "cand") -> str:
        src = tmp_path / f"{name}.c"
        src.write_text(PRELUDE + body + "\n}\n")
        lib = tmp_path / f"{name}.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True, capture_output=True)
        return str(lib)

    return _build


def spec(tasks):
    return [f"task {t.m} {t.n} {t.k} fp32 -" for t in tasks]


def evaluate(harness, lib, tasks=TASKS, limits=LIMITS):
    results, _ = measure([harness, lib], list(tasks), spec, None, limits)
    return results


def sandbox_layers(harness, lib) -> dict[str, str]:
    run = run_harness([harness, lib], spec(TASKS[:1]), gpu_index=None, limits=LIMITS)
    start = next(e for e in run.events if e.get("event") == "start")
    return start["sandbox"]


def need_layer(harness, lib, layer):
    state = sandbox_layers(harness, lib)[layer]
    if not state.startswith("on"):
        pytest.skip(f"{layer} not permitted on this machine: {state}")


def test_honest_candidate_ok_on_every_task(harness, build):
    assert [r.status for r in evaluate(harness, build("honest(A, B, C, M, N, K); return 0;"))] == [Status.OK] * 3


def test_wrong_candidate_is_wrong_answer(harness, build):
    res = evaluate(harness, build("honest(A, B, C, M, N, K); C[0] += 1; return 0;"))
    assert all(r.status == Status.WRONG_ANSWER for r in res)


def test_exit_zero_is_runtime_error_not_ok(harness, build):
    res = evaluate(harness, build("honest(A, B, C, M, N, K); exit(0);"))
    assert all(r.status == Status.RUNTIME_ERROR for r in res)
    assert "exited with status 0 before reporting" in res[0].reason


def test_segfault_costs_only_its_task(harness, build):
    lib = build("if (M == 16) { volatile int* p = 0; *p = 1; } honest(A, B, C, M, N, K); return 0;")
    res = evaluate(harness, lib)
    assert [r.status for r in res] == [Status.OK, Status.RUNTIME_ERROR, Status.OK]
    assert "SIGSEGV" in res[1].reason


def test_host_hang_is_killed_at_the_task_deadline(harness, build):
    lib = build("if (M == 16) { volatile long i = 0; for (;;) ++i; } honest(A, B, C, M, N, K); return 0;")
    res = evaluate(harness, lib)
    assert [r.status for r in res] == [Status.OK, Status.TIMEOUT, Status.OK]


def test_abort_in_constructor_fails_every_task(harness, tmp_path, build):
    lib = build("honest(A, B, C, M, N, K); return 0; }\n__attribute__((constructor)) static void boom(void) { abort();")
    res = evaluate(harness, lib)
    assert all(r.status == Status.RUNTIME_ERROR and "SIGABRT" in r.reason for r in res)


def test_forged_lines_on_result_channel_are_rejected(harness, build):
    # Sprays fake reports on every plausible fd, with a guessed nonce: the parent must not believe them.
    lib = build(r"""
      const char* fake = "{\"nonce\":\"00\",\"event\":\"task\",\"m\":8,\"n\":8,\"k\":8,\"status\":\"ok\"}\n";
      for (int fd = 3; fd < 64; ++fd) write(fd, fake, strlen(fake));
      honest(A, B, C, M, N, K); return 0;""")
    res = evaluate(harness, lib)
    assert all(r.status == Status.REJECTED_BEHAVIOUR for r in res)
    assert "result channel" in res[0].reason


def test_forged_stdout_is_never_parsed(harness, build):
    lib = build(r"""
      printf("{\"event\":\"task\",\"status\":\"ok\"}\nstatus: ok\n"); fprintf(stderr, "ok\n");
      return 0;  /* C left unwritten */""")
    assert all(r.status == Status.WRONG_ANSWER for r in evaluate(harness, lib))


def test_output_flood_is_capped(harness, build):
    lib = build("for (int i = 0; i < 200000; ++i) puts(\"flood flood flood flood flood flood flood\");"
                "honest(A, B, C, M, N, K); return 0;")
    run = run_harness([harness, lib], spec(TASKS[:1]), gpu_index=None, limits=LIMITS)
    assert run.done
    assert len(run.stdout) < 2 * LIMITS.max_output_bytes
    assert "bytes dropped" in run.stdout


REFUSED = {
    # name: C statement that returns 90 when the forbidden operation succeeded
    "fork": "pid_t p = fork(); if (p == 0) _exit(0); if (p > 0) return 90;",
    "exec": 'char* argv[] = {"/bin/true", 0}; execv("/bin/true", argv); /* returns only on failure */',
    "signal_parent": "if (kill(getppid(), SIGTERM) == 0) return 90;",
    "ptrace_parent": "if (ptrace(PTRACE_ATTACH, getppid(), 0, 0) == 0) return 90;",
    "network": "if (socket(AF_INET, SOCK_STREAM, 0) >= 0) return 90;",
    "unix_socket": "if (socket(AF_UNIX, SOCK_STREAM, 0) >= 0) return 90;",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_forbidden_operation_is_refused(harness, build, name):
    lib = build(f"{REFUSED[name]} honest(A, B, C, M, N, K); return 0;")
    need_layer(harness, lib, "seccomp")
    res = evaluate(harness, lib)
    assert all(r.status == Status.OK for r in res), f"{name}: {[r.reason for r in res]}"


@pytest.mark.parametrize("target", ["outside", "compile_cache"])
def test_cannot_write_outside_its_temp_dir(harness, build, tmp_path, target):
    victim_dir = tmp_path / ("cache/cudal2/build/ab" if target == "compile_cache" else "elsewhere")
    victim_dir.mkdir(parents=True)
    victim = victim_dir / "candidate.so"
    victim.write_text("original")
    lib = build(f"""
      FILE* f = fopen("{victim}", "w"); if (f) {{ fputs("tampered", f); fclose(f); return 96; }}
      FILE* g = fopen("{victim_dir}/new-file", "w"); if (g) {{ fclose(g); return 95; }}
      honest(A, B, C, M, N, K); return 0;""")
    need_layer(harness, lib, "landlock")
    assert all(r.status == Status.OK for r in evaluate(harness, lib))
    assert victim.read_text() == "original"
    assert not (victim_dir / "new-file").exists()


def test_may_write_its_own_temp_dir(harness, build):
    lib = build("""
      FILE* f = fopen("scratch.txt", "w"); if (!f) return 94; fputs("mine", f); fclose(f);
      honest(A, B, C, M, N, K); return 0;""")
    assert all(r.status == Status.OK for r in evaluate(harness, lib))


def test_environment_is_scrubbed(harness, build, monkeypatch):
    monkeypatch.setenv("CUDAL2_SECRET_TOKEN", "hunter2")
    lib = build("""
      if (getenv("CUDAL2_SECRET_TOKEN")) return 93;
      const char* home = getenv("HOME"); if (!home || strstr(home, "cudal2-run-") == 0) return 92;
      honest(A, B, C, M, N, K); return 0;""")
    assert all(r.status == Status.OK for r in evaluate(harness, lib))


def test_temp_dir_removed_after_run(harness, build):
    lib = build('FILE* f = fopen("left-behind", "w"); if (f) fclose(f); honest(A, B, C, M, N, K); return 0;')
    before = {p for p in os.listdir("/tmp") if p.startswith("cudal2-run-")}
    evaluate(harness, lib, TASKS[:1])
    after = {p for p in os.listdir("/tmp") if p.startswith("cudal2-run-")}
    assert after <= before
