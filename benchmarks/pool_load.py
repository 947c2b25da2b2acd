"""Load run of the sandbox pool on the CPU: 1,000 jobs with 10% injected faults through one backend.

The compile stage is real (static rules, nvcc, link check; ~50 distinct valid kernels compiled once each, cache
hits after); the GPU stage is the fake runner of tests/sandbox/pool_fakes.py on simulated GPU slots (local: worker
processes for gpus=(0, 1); ray: actors on a custom resource in a local Ray instance). Every job is distinct: each
gets its own task tuple. Faults: compile errors, static rejects, fake-GPU worker crashes (os._exit mid-job) and
hangs (caught by job_timeout_s); each faulty kind reuses a few sources, so it costs few compiles.

Checked: every future resolves exactly once (a done-callback count per job, the pool's records per job id), and
every result is what its job expects (status per kind, reason for lost workers, source hash and tasks echoed).
Prints the figures, pool.stats().render() and a markdown table row.

    python3 benchmarks/pool_load.py --backend local
    python3 benchmarks/pool_load.py --backend ray
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.sandbox.pool_fakes, importable by the workers too

from cudal2.sandbox.evaluator import EvalOptions, source_hash  # noqa: E402
from cudal2.sandbox.pool import Backend, JobOutcome, PoolConfig, RunnerSpec, SandboxPool  # noqa: E402
from cudal2.sandbox.types import Status, Task  # noqa: E402
from tests.sandbox.pool_fakes import kernel  # noqa: E402

FAKE = RunnerSpec("tests.sandbox.pool_fakes:fake_runner")
# Share of the faulty jobs per kind, and how many distinct sources each kind uses.
FAULT_MIX = {"compile_error": 0.35, "static_reject": 0.35, "crash": 0.15, "hang": 0.15}
FAULT_SOURCES = 5


def fault_source(kind: str, i: int) -> str:
    if kind == "compile_error":
        return kernel(f"cerr{i}").replace("return cudaGetLastError", "return no_such_symbol + cudaGetLastError")
    if kind == "static_reject":
        return kernel(f"static{i}") + "\nstatic int x = (fork(), 0);\n"
    if kind == "crash":
        return kernel(f"crash{i}", "// fake: die")
    return kernel(f"hang{i}", "// fake: hang")


def make_jobs(n: int, fault_rate: float, n_kernels: int, seed: int) -> list[tuple[str, str, tuple[Task, ...]]]:
    """(kind, source, tasks) per job; kinds shuffled; every (source, tasks) distinct through its task tuple."""
    n_faults = round(n * fault_rate)
    kinds = [k for k, share in FAULT_MIX.items() for _ in range(round(n_faults * share))]
    kinds = (kinds + ["crash"] * n_faults)[:n_faults]  # rounding: pad or cut to exactly n_faults
    kinds += ["valid"] * (n - len(kinds))
    random.Random(seed).shuffle(kinds)
    valid = [kernel(f"load{i}") for i in range(n_kernels)]
    used: Counter = Counter()
    jobs = []
    for j, kind in enumerate(kinds):
        i = used[kind]
        used[kind] += 1
        src = valid[i % n_kernels] if kind == "valid" else fault_source(kind, i % FAULT_SOURCES)
        jobs.append((kind, src, (Task(64, 64, 8 * (j + 1)),)))
    return jobs


def expected_ok(kind: str, result) -> bool:
    statuses = {s.status for s in result.shapes}
    reason = result.shapes[0].reason
    if kind == "valid":
        return statuses == {Status.OK}
    if kind == "compile_error":
        return statuses == {Status.COMPILE_ERROR}
    if kind == "static_reject":
        return statuses == {Status.STATIC_REJECT}
    if kind == "crash":
        return statuses == {Status.INTERNAL_ERROR} and "died" in reason
    return statuses == {Status.INTERNAL_ERROR} and "exceeded" in reason  # hang


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=[b.value for b in Backend], default="local")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--fault-rate", type=float, default=0.10)
    ap.add_argument("--kernels", type=int, default=50, help="distinct valid kernel sources")
    ap.add_argument("--slots", type=int, default=2, help="simulated GPU slots")
    ap.add_argument("--compile-workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--job-timeout", type=float, default=3.0, help="job_timeout_s: a hang costs this per attempt")
    ap.add_argument("--deadline", type=float, default=3600.0, help="give up waiting after this many seconds")
    ap.add_argument("--cache-dir", type=Path, default=None, help="compile cache (default: a fresh temp dir)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="cudal2-pool-load-"))
    cache = args.cache_dir or work / "build"
    fake_log = work / "fake.log"
    os.environ["CUDAL2_FAKE_LOG"] = str(fake_log)  # inherited by worker processes and by a Ray started here
    jobs = make_jobs(args.jobs, args.fault_rate, args.kernels, args.seed)
    kinds = Counter(k for k, _, _ in jobs)
    backend = Backend(args.backend)
    config = PoolConfig(backend=backend, gpus=tuple(range(args.slots)), ray_gpus=args.slots,
                        ray_slot_resource="gpu_slot", compile_workers=args.compile_workers, db_path="",
                        job_timeout_s=args.job_timeout, retries=1,
                        eval=EvalOptions(cache_dir=cache, compile_timeout_s=180))
    print(f"{args.jobs} jobs ({dict(kinds)}), backend {backend.value}, {args.slots} simulated GPU slots, "
          f"cache {cache}", flush=True)

    lock = threading.Lock()
    resolved = [0] * len(jobs)

    def done(j: int):
        def callback(_):
            with lock:
                resolved[j] += 1
        return callback

    t0 = time.monotonic()
    pool = SandboxPool(config, FAKE)
    startup_s = time.monotonic() - t0
    futures: list = []
    try:
        t1 = time.monotonic()
        deadline = t1 + args.deadline
        for j, (_, src, tasks) in enumerate(jobs):
            # Bounded by the run's deadline: submit() blocks while max_pending jobs are unfinished (backpressure).
            fut = pool.submit(src, tasks, caller=f"caller{j % 3}", timeout=max(1.0, deadline - time.monotonic()))
            fut.add_done_callback(done(j))
            futures.append(fut)
        while time.monotonic() < deadline and not all(f.done() for f in futures):
            time.sleep(0.1)
        wall_s = time.monotonic() - t1
        stats = pool.stats()
        records = pool.records()
    finally:
        pool.shutdown(wait=all(f.done() for f in futures))

    lost = sum(1 for f in futures if not f.done())
    ids = Counter(r.job_id for r in records)
    duplicated = sum(max(0, c - 1) for c in resolved) + sum(c - 1 for c in ids.values() if c > 1)
    dedup = sum(1 for r in records if r.outcome == JobOutcome.DEDUPLICATED)
    mismatched = []
    for j, (f, (kind, src, tasks)) in enumerate(zip(futures, jobs, strict=True)):
        if not f.done():
            continue
        res = f.result()
        echoed = res.source_hash == source_hash(src) and tuple(s.task for s in res.shapes) == tasks
        if not (echoed and expected_ok(kind, res)):
            mismatched.append((j, kind, [s.status.value for s in res.shapes], res.shapes[0].reason[:120]))
    gpu_runs = len(fake_log.read_text().splitlines()) if fake_log.exists() else 0
    expected_runs = kinds["valid"] + (config.retries + 1) * (kinds["crash"] + kinds["hang"])
    compiles = sum(1 for p in cache.glob("*/*") if p.is_dir() and not p.name.startswith("."))
    figures = {
        "backend": backend.value, "jobs": len(jobs), "kinds": dict(kinds), "startup_s": round(startup_s, 2),
        "wall_s": round(wall_s, 1), "jobs_per_min": round(60 * len(jobs) / wall_s, 1), "lost": lost,
        "duplicated": duplicated, "deduplicated_records": dedup, "records": len(records),
        "mismatched": len(mismatched), "statuses": stats.statuses, "outcomes": stats.outcomes,
        "worker_restarts": stats.worker_restarts, "gpu_runs": gpu_runs, "gpu_runs_expected": expected_runs,
        "cache_entries": compiles,
    }
    print()
    print(stats.render())
    print()
    for m in mismatched[:10]:
        print("MISMATCH", m)
    print(json.dumps(figures, indent=1))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(stats.statuses.items()))
    print()
    print("| backend | jobs | faults | wall s | jobs/min | lost | duplicated | mismatched | restarts | statuses |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {backend.value} | {len(jobs)} | {len(jobs) - kinds['valid']} | {wall_s:.1f} | "
          f"{60 * len(jobs) / wall_s:.0f} | {lost} | {duplicated} | {len(mismatched)} | {stats.worker_restarts} | "
          f"{statuses} |")
    ok = lost == 0 and duplicated == 0 and not mismatched and len(records) == len(jobs) and gpu_runs == expected_runs
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
