"""Calibrate the relative-error thresholds (GPU): max relative error of fp32-accumulating kernels (the seeds,
cuBLAS-equivalent) and of fp16-accumulating kernels over K, with the threshold switched off.

    python3 benchmarks/calibrate_tolerance.py
The fp32 threshold must sit well above every fp32 kernel's error and below the fp16 kernels' error at K >= 1024.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cudal2.sandbox.evaluator import EvalOptions, Evaluator
from cudal2.sandbox.types import Task

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted((ROOT / "kernels" / "seed").glob("*.cu")) + sorted((ROOT / "kernels" / "adversarial").glob("fp16_acc*.cu"))
KS = (64, 256, 1024, 4096, 16384)


def main() -> int:
    ev = Evaluator(EvalOptions(fresh=True, tol_fp32=1.0, tol_fp16=1.0, baselines=False, target_ms=2, warmup_ms=1,
                               min_reps=2, max_reps=3))
    tasks = [Task(256, 256, k) for k in KS]
    print(f"| kernel | {' | '.join(f'K={k}' for k in KS)} |")
    print("|---|" + "---|" * len(KS))
    for f in FILES:
        res = ev.evaluate(f.read_text(), tasks)
        cells = [f"{s.max_rel_err:.3g}" if s.max_rel_err is not None else s.status.value for s in res.shapes]
        print(f"| {f.stem} | {' | '.join(cells)} |", flush=True)
        for s in res.shapes:
            if s.status.value != "ok":
                print(f"  {f.stem} {s.task.mnk}: {s.status.value}: {s.reason}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
