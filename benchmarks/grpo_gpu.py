"""A short GRPO run with the full reward on a GPU machine, and where its step time goes.

    python3 benchmarks/grpo_gpu.py --label "1 GPU (shared)" -- --config configs/gpu_tiny.yaml --pool_gpus 0 ...
    python3 benchmarks/grpo_gpu.py --label "trainer GPU 0, pool GPU 1" -- --config configs/gpu_tiny.yaml --pool_gpus 1

Everything after `--` goes to train.py. Prints one markdown row: mean seconds per optimizer step of generation,
evaluation and update (cudal2.policy.grpo), the evaluation share, the mean reward and the statuses seen; the first
step is reported apart (it pays the harness build and cuBLAS autotuning of each new shape).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import train  # noqa: E402

PARTS = ("time/generation_s", "time/evaluation_s", "time/update_s")


def summarize(label: str, log_history: list[dict], wall_s: float) -> str:
    steps = [h for h in log_history if "time/evaluation_s" in h]
    if not steps:
        return f"| {label} | no logged steps | | | | | | |"
    later = steps[1:] or steps

    def avg(key: str, rows: list[dict]) -> float:
        return mean(h[key] for h in rows)

    statuses = sorted({k.split("/", 1)[1] for h in steps for k, v in h.items() if k.startswith("status/") and v})
    first = " / ".join(f"{steps[0][k]:.1f}" for k in PARTS)
    return (f"| {label} | {len(steps)} | {first} | " + " | ".join(f"{avg(k, later):.2f}" for k in PARTS)
            + f" | {avg('time/evaluation_share', later):.0%} | {avg('reward', steps):+.3f} | {', '.join(statuses)} "
            f"| {wall_s:.0f} |")


HEADER = ("| run | steps | step 1 gen / eval / update (s) | generation (s/step) | evaluation (s/step) | update (s/step) "
          "| evaluation share | mean reward | statuses | wall (s) |\n|---|---|---|---|---|---|---|---|---|---|")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then train.py arguments")
    args = ap.parse_args()
    targs = [a for a in args.train_args if a != "--"]
    if "--output_dir" not in targs:
        print("grpo_gpu: pass --output_dir to train.py", file=sys.stderr)
        return 2
    out = Path(targs[targs.index("--output_dir") + 1])
    t0 = time.monotonic()
    rc = train.main(targs)
    wall = time.monotonic() - t0
    if rc != 0:
        print(f"grpo_gpu: train.py exited {rc}", file=sys.stderr)
        return rc
    run = json.loads((out / "cudal2_run.json").read_text())
    print(HEADER)
    print(summarize(args.label, run["log_history"], wall))
    return 0


if __name__ == "__main__":
    sys.exit(main())
