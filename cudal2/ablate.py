"""`cudal2 ablate`: the same training run with reward terms switched off, and a table comparing the runs.

    cudal2 ablate --config configs/smoke_cpu.yaml --drop length --drop accuracy [--out runs/ablate] [-- train args]

Runs train.py once with every term ("full") and once per --drop (that term off), each in its own output dir under
--out, with the config's seed for all, one after the other (they would compete for the same GPUs). The table reads
each run's cudal2_run.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class RunSummary:
    name: str
    exit_code: int
    steps: int
    reward_last: float | None  # mean reward of the last logged step
    reward_mean: float | None  # mean over logged steps
    success_rate: float | None  # (ok + compiled) / all completions, over the run
    format_error_rate: float | None
    runtime_s: float | None


def variants(drops: list[str]) -> list[tuple[str, list[str]]]:
    return [("full", [])] + [(f"no_{d}", [d]) for d in drops]


def summarize(name: str, exit_code: int, run_json: Path) -> RunSummary:
    if exit_code != 0 or not run_json.exists():
        return RunSummary(name, exit_code, 0, None, None, None, None, None)
    data = json.loads(run_json.read_text())
    steps = [h for h in data["log_history"] if "reward" in h]
    total = sum(h.get(k, 0) for h in steps for k in h if k.startswith("status/"))
    good = sum(h.get("status/ok", 0) + h.get("status/compiled", 0) for h in steps)
    fmt = sum(h.get("status/format_error", 0) for h in steps)
    rewards = [h["reward"] for h in steps]
    return RunSummary(name, 0, len(steps), rewards[-1] if rewards else None,
                      sum(rewards) / len(rewards) if rewards else None, good / total if total else None,
                      fmt / total if total else None, data["metrics"].get("train_runtime"))


def run(config: str, drops: list[str], out: Path, extra: list[str]) -> list[RunSummary]:
    summaries = []
    for name, drop in variants(drops):
        outdir = out / name
        cmd = [sys.executable, str(ROOT / "train.py"), "--config", config, "--output_dir", str(outdir), *extra]
        if drop:
            cmd += ["--drop", *drop]
        print(f"ablate: {name}: {' '.join(cmd[1:])}", flush=True)
        code = subprocess.run(cmd, cwd=ROOT).returncode
        summaries.append(summarize(name, code, outdir / "cudal2_run.json"))
    return summaries


def table(rows: list[RunSummary]) -> str:
    f = lambda v, spec: format(v, spec) if v is not None else "-"  # noqa: E731
    lines = ["| run | exit | steps | reward (last) | reward (mean) | ok/compiled rate | format errors | runtime s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.name} | {r.exit_code} | {r.steps} | {f(r.reward_last, '.3f')} | {f(r.reward_mean, '.3f')} "
                     f"| {f(r.success_rate, '.0%')} | {f(r.format_error_rate, '.0%')} | {f(r.runtime_s, '.1f')} |")
    return "\n".join(lines)
