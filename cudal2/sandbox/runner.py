"""Run the measuring harness on one candidate library in a confined child process.

Threat model
------------
A candidate is untrusted native code: its host part runs inside the harness process (which dlopens it), its
device part on the GPU. What is protected, and how:

- The result channel. Results travel over a private pipe (an inherited fd, not stdout/stderr), one JSON line
  per event, each carrying a per-run nonce read from stdin before the candidate is loaded. The parent never
  parses the child's stdout/stderr (they are captured, capped at `max_output_bytes`, and shown as logs only).
  A line with a wrong nonce on the channel marks the run as tampered with. A child that exits without a
  complete report (exit(0) from a constructor, abort, a crash) gets a runtime_error, never `ok`.
- The parent process. The child is a separate process in its own session and process group, killed whole
  (SIGKILL to the group and the pid) at its deadline; PR_SET_PDEATHSIG kills it if the parent dies. Inside
  the harness, seccomp forbids ptrace, kill(2), fork/exec and sockets, and landlock (ABI >= 6) scopes
  signals, so it cannot signal or trace the parent.
- The filesystem: the compile cache, the result store, other candidates. Landlock limits writes to the run's
  fresh temp dir (also its cwd, HOME and TMPDIR) and the GPU device nodes; cache entries are verified by hash
  before use (cudal2.sandbox.compiler), so a tampered library is rebuilt, never run.
- The network: an empty network namespace where permitted (root or user namespaces), and landlock's TCP rules
  (ABI >= 4), and seccomp's ban on socket(2).
- Resources: RLIMIT_CORE=0, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_DATA (heap), a per-task wall-clock deadline,
  capped output.
- Other candidates: one process per candidate, a fresh temp dir, the GPU context dies with the process.

What is NOT protected:
- The harness's own memory. The candidate shares the harness's address space; a deliberate attacker could
  scan memory for the nonce or patch the harness's code. The link check (cudal2.sandbox.static_check:
  allowlisted imports only, no syscall instructions) makes the ordinary routes to that impossible, but plain
  pointer arithmetic is not detectable. Plausibility gates in the evaluator (a roofline floor) remain.
- GPU memory of the harness: a kernel can write anywhere in the context's address space. Guard bands and
  re-verification catch writes near the buffers; far-away writes into the harness's reference buffers could
  in principle fake a pass. The fp32 reference is recomputed right before each comparison to narrow this.
- Machines where a layer is not permitted: each layer reports on/off and why in the result's notes.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RunLimits:
    """Limits for one harness process. Seconds and bytes."""

    start_timeout_s: float = 90.0  # CUDA + cuBLAS initialisation and library load
    task_timeout_s: float = 120.0  # one task: checks, autotuning, timing, re-verification
    max_output_bytes: int = 64 * 1024  # of the child's stdout and of its stderr, each (head and tail kept)
    file_size_bytes: int = 64 << 20  # RLIMIT_FSIZE: largest file the child may write
    open_files: int = 4096  # RLIMIT_NOFILE
    # RLIMIT_DATA: private writable memory (heap). Not RLIMIT_AS: CUDA reserves large inaccessible address
    # ranges that an address-space limit would refuse.
    data_bytes: int = 16 << 30


@dataclass
class CappedBuffer:
    """Keeps the first and last `cap // 2` bytes of a stream and counts the rest."""

    cap: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    dropped: int = 0

    def add(self, data: bytes) -> None:
        half = self.cap // 2
        room = half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > half:
            cut = len(self.tail) - half
            self.dropped += cut
            del self.tail[:cut]

    def text(self) -> str:
        mid = f"\n... [{self.dropped} bytes dropped] ...\n" if self.dropped else ""
        return (bytes(self.head).decode(errors="replace") + mid + bytes(self.tail).decode(errors="replace")).strip()


@dataclass
class HarnessRun:
    """What one harness process reported and how it ended."""

    events: list[dict]  # verified result-channel events, in order
    exit_code: int | None  # None when killed by us
    timed_out: bool
    timeout_phase: str  # "", "start" or "task"
    forged_lines: int  # lines on the result channel without the nonce
    stdout: str
    stderr: str
    seconds: float

    @property
    def done(self) -> bool:
        return any(e.get("event") == "done" for e in self.events)

    def task_events(self) -> list[dict]:
        return [e for e in self.events if e.get("event") == "task"]


def _drain(stream, buf: CappedBuffer) -> None:
    for chunk in iter(lambda: stream.read1(65536), b""):
        buf.add(chunk)


def _child_setup(limits: RunLimits) -> None:  # runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_bytes, limits.file_size_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_DATA, (limits.data_bytes, limits.data_bytes))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _child_env(workdir: Path, gpu_index: int | None) -> dict[str, str]:
    """A scrubbed environment: nothing of the parent's leaks in (tokens, paths, the store's location)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "LANG": "C",
        "CUDA_CACHE_PATH": str(workdir / ".nv"),
        # Module loading stays CUDA's default (lazy): kernels load on first use, which is in the checked calls
        # and warm-up, never in a timed sample. EAGER would load every cuBLAS module at start-up.
    }
    if gpu_index is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu_index)
    return env


def _kill(proc: subprocess.Popen) -> None:
    for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: os.kill(proc.pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass


def run_harness(
    command: list[str],
    spec_lines: list[str],
    *,
    gpu_index: int | None,
    limits: RunLimits,
) -> HarnessRun:
    """Run `command + [--result-fd N]` with `spec_lines` (plus nonce and sandbox dir) on stdin.

    The deadline is per phase: `start_timeout_s` until the harness reports "start", then `task_timeout_s` from
    each "begin" event. The whole process group is killed at a deadline.
    """
    nonce = secrets.token_hex(16)
    workdir = Path(tempfile.mkdtemp(prefix="cudal2-run-"))
    read_fd, write_fd = os.pipe()
    t0 = time.monotonic()
    try:
        spec = "\n".join([f"nonce {nonce}", f"sandbox_dir {workdir}", *spec_lines, "end"]) + "\n"
        proc = subprocess.Popen(
            [*command, "--result-fd", str(write_fd)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(write_fd,),
            cwd=workdir,
            env=_child_env(workdir, gpu_index),
            start_new_session=True,
            preexec_fn=lambda: _child_setup(limits),
        )
        os.close(write_fd)
        write_fd = -1
        return _supervise(proc, spec, read_fd, nonce, limits, t0)
    finally:
        if write_fd >= 0:
            os.close(write_fd)
        os.close(read_fd)
        shutil.rmtree(workdir, ignore_errors=True)


def _supervise(proc, spec: str, read_fd: int, nonce: str, limits: RunLimits, t0: float) -> HarnessRun:
    out, err = CappedBuffer(limits.max_output_bytes), CappedBuffer(limits.max_output_bytes)
    threads = [threading.Thread(target=_drain, args=(s, b), daemon=True) for s, b in ((proc.stdout, out), (proc.stderr, err))]
    for t in threads:
        t.start()
    try:
        proc.stdin.write(spec.encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the child died before reading its spec; its exit status says why
    events: list[dict] = []
    forged = 0
    channel = os.fdopen(os.dup(read_fd), "rb", buffering=0)
    state = {"deadline": time.monotonic() + limits.start_timeout_s, "phase": "start"}
    reader = threading.Thread(target=_read_channel, args=(channel, nonce, events, state, limits), daemon=True)
    reader.start()
    timed_out = False
    while proc.poll() is None:
        if time.monotonic() > state["deadline"]:
            timed_out = True
            _kill(proc)
            break
        time.sleep(0.02)
    proc.wait()
    reader.join(timeout=5)
    channel.close()
    for t in threads:
        t.join(timeout=5)
    forged = state.get("forged", 0)
    return HarnessRun(
        events=events,
        exit_code=None if timed_out else proc.returncode,
        timed_out=timed_out,
        timeout_phase=state["phase"] if timed_out else "",
        forged_lines=forged,
        stdout=out.text(),
        stderr=err.text(),
        seconds=time.monotonic() - t0,
    )


def _read_channel(channel, nonce: str, events: list[dict], state: dict, limits: RunLimits) -> None:
    buf = b""
    for chunk in iter(lambda: channel.read(65536), b""):
        buf += chunk
        if len(buf) > 16 << 20:  # no honest report is this long
            state["forged"] = state.get("forged", 0) + 1
            buf = b""
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            event = _parse_line(raw, nonce)
            if event is None:
                state["forged"] = state.get("forged", 0) + 1
                continue
            event["_t"] = time.monotonic()  # arrival time (parent clock), for per-task wall times
            events.append(event)
            kind = event.get("event")
            if kind in ("start", "begin"):
                state["phase"] = "task" if kind == "begin" else "start"
                state["deadline"] = time.monotonic() + (limits.task_timeout_s if kind == "begin" else limits.start_timeout_s)


def _parse_line(raw: bytes, nonce: str) -> dict | None:
    try:
        event = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(event, dict) or event.get("nonce") != nonce:
        return None
    return event
