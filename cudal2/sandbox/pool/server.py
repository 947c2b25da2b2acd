"""A long-lived pool that several processes share (the ranks of a multi-GPU trainer, a trainer and `cudal2 sample`):
`cudal2 pool start` serves one SandboxPool on loopback, `PoolClient` talks to it, `cudal2 pool stop` ends it.

The server listens on 127.0.0.1 only and authenticates every connection with a random key (HMAC challenge of
multiprocessing.connection). Address, key and pid are in a state file readable by the owner alone
(default ~/.cache/cudal2/pool.json). One request per connection: ("submit", source, tasks, caller) ->
EvalResult; ("stats",) -> PoolStats; ("stop",) -> True.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Listener
from pathlib import Path

from cudal2.sandbox.pool.local import RunnerSpec
from cudal2.sandbox.pool.pool import SandboxPool
from cudal2.sandbox.pool.types import Backend, PoolConfig, PoolStats
from cudal2.sandbox.types import EvalResult, Task


class PoolNotRunning(RuntimeError):
    """No pool server answers at the state file's address (one-line message for the CLI)."""


def default_state_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cudal2" / "pool.json"


def _write_state(path: Path, port: int, key: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"host": "127.0.0.1", "port": port, "key": key.hex(), "pid": os.getpid()}, f)
    os.replace(tmp, path)


def serve(config: PoolConfig, state_file: Path, port: int = 0, runner: RunnerSpec | None = None,
          ready: threading.Event | None = None) -> None:
    """Run a pool server until a stop request. Blocks."""
    key = secrets.token_bytes(32)
    pool = SandboxPool(config, runner)
    stop = threading.Event()
    with Listener(("127.0.0.1", port), authkey=key) as listener:
        _write_state(state_file, listener.address[1], key)
        if ready is not None:
            ready.set()

        def wake() -> None:  # a stop request unblocks accept() by connecting once more
            with Client(listener.address, authkey=key):
                pass

        while not stop.is_set():
            try:
                conn = listener.accept()
            except (AuthenticationError, OSError):  # a client without the key, or one that hung up
                continue
            if stop.is_set():
                conn.close()
                break
            threading.Thread(target=_handle, args=(conn, pool, stop, wake), daemon=True).start()
    pool.shutdown(wait=True)
    state_file.unlink(missing_ok=True)


def _handle(conn, pool: SandboxPool, stop: threading.Event, wake) -> None:
    with conn:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        kind = request[0]
        if kind == "submit":
            _, source, tasks, caller = request
            conn.send(pool.submit(source, tasks, caller).result())
        elif kind == "stats":
            conn.send(pool.stats())
        elif kind == "stop":
            stop.set()
            conn.send(True)
            wake()


class PoolClient:
    """The SandboxPool API against a pool server: submit / map / evaluate (async) / stats / stop."""

    def __init__(self, state_file: Path | None = None, max_inflight: int = 64):
        path = state_file or default_state_file()
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            raise PoolNotRunning(f"no pool server: {path} is missing or unreadable (start one: cudal2 pool start)") from None
        self.address = (state["host"], state["port"])
        self.key = bytes.fromhex(state["key"])
        self.pid = state["pid"]
        self.executor = ThreadPoolExecutor(max_workers=max_inflight, thread_name_prefix="cudal2-client")

    def _call(self, *request):
        try:
            with Client(self.address, authkey=self.key) as conn:
                conn.send(request)
                return conn.recv()
        except (ConnectionError, EOFError, OSError) as e:
            raise PoolNotRunning(f"no pool server answers at {self.address[0]}:{self.address[1]} ({e})") from None
        except AuthenticationError:
            raise PoolNotRunning(f"the pool server at {self.address[0]}:{self.address[1]} refused this client's "
                                 "key (stale state file?)") from None

    def submit(self, source: str, tasks: Sequence[Task], caller: str = "default") -> Future:
        return self.executor.submit(self._call, "submit", source, tuple(tasks), caller)

    def map(self, sources, tasks: Sequence[Task], caller: str = "default") -> list[EvalResult]:
        return [f.result() for f in [self.submit(s, tasks, caller) for s in sources]]

    async def evaluate(self, source: str, tasks: Sequence[Task], caller: str = "default") -> EvalResult:
        return await asyncio.wrap_future(self.submit(source, tasks, caller))

    def stats(self) -> PoolStats:
        return self._call("stats")

    def stop(self) -> None:
        self._call("stop")

    def shutdown(self, wait: bool = True) -> None:
        """Closes this client only; the server and its pool keep running for the other clients."""
        self.executor.shutdown(wait=wait)

    close = shutdown


def start_background(args: Sequence[str], state_file: Path, timeout_s: float = 120.0) -> int:
    """Start `python -m cudal2.sandbox.pool.server ARGS` detached; return its pid once it serves."""
    state_file.unlink(missing_ok=True)
    log = state_file.with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "cudal2.sandbox.pool.server", "--state-file", str(state_file),
                                 *args], stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if state_file.exists():
            return proc.pid
        if proc.poll() is not None:
            raise PoolNotRunning(f"the pool server exited with status {proc.returncode}; see {log}")
        time.sleep(0.1)
    proc.kill()
    raise PoolNotRunning(f"the pool server did not start within {timeout_s:.0f} s; see {log}")


def server_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cudal2 pool start")
    p.add_argument("--backend", default="local", choices=[b.value for b in Backend])
    p.add_argument("--gpus", default=None, help="comma-separated GPU indices (default: all visible)")
    p.add_argument("--port", type=int, default=0, help="loopback port (default: any free one)")
    p.add_argument("--ray-address", default=None)
    p.add_argument("--db", default=None, help="result store path")
    p.add_argument("--runner", default=None, help=argparse.SUPPRESS)  # tests: module:factory of the GPU stage
    return p


def config_from_args(ns: argparse.Namespace) -> PoolConfig:
    gpus = tuple(int(g) for g in ns.gpus.split(",") if g.strip()) if ns.gpus is not None else None
    return replace(PoolConfig(), backend=Backend(ns.backend), gpus=gpus, ray_address=ns.ray_address, db_path=ns.db)


def main(argv: Sequence[str] | None = None) -> int:
    p = server_args_parser()
    p.add_argument("--state-file", default=str(default_state_file()))
    ns = p.parse_args(argv)
    serve(config_from_args(ns), Path(ns.state_file), ns.port, RunnerSpec(ns.runner) if ns.runner else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
