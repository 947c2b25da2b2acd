"""What cuBLASLt's autotuned algorithm is, per shape, next to our best kernel: read from a result store on the CPU.

The harness keeps the cuBLASLt algorithm it autotuned per shape in the store (`algo_cache`); cudal2.sandbox.lt_algo
decodes it (host-only: no GPU needed) into the config cuBLAS chose: algo id, CTA tile, split-K count and reduction,
cluster shape, all in our M x N terms. It tells the kernel families what cuBLAS does where it beats them.

    python3 benchmarks/lt_algos.py --db <store> [--shapes data/grid.csv] [--worst 30] [--gpu h200]

Needs the cuBLAS library and headers (CUDAL2_CUBLAS_HOME, CUDA_HOME or pip's nvidia wheels).
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import sys
from contextlib import closing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cudal2.data import load_shapes  # noqa: E402
from cudal2.sandbox.lt_algo import LtDecodeError, decode  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="result store with the harness's algo_cache table")
    ap.add_argument("--shapes", default=str(ROOT / "data" / "grid.csv"))
    ap.add_argument("--gpu", default="h200", help="GPU label substring")
    ap.add_argument("--worst", type=int, default=30, help="rows: the shapes where our best kernel is slowest vs cuBLAS")
    args = ap.parse_args()
    shapes = {(r.M, r.N, r.K) for r in load_shapes(args.shapes)}
    with closing(sqlite3.connect(args.db)) as db:
        algos = {(m, n, k): (h, us) for m, n, k, h, us in db.execute(
            "SELECT m, n, k, algo_hex, median_us FROM algo_cache WHERE kind = 'cublaslt_autotuned' AND acc = 'fp32' "
            "AND gpu LIKE ?", (f"%{args.gpu}%",)) if (m, n, k) in shapes}
        best: dict[tuple[int, int, int], tuple[float, float]] = {}
        for m, n, k, us, s in db.execute(
                "SELECT m, n, k, cand_median_us, speedup_cublas FROM results WHERE mode = 'offline' AND status = 'ok' "
                "AND acc = 'fp32' AND gpu LIKE ?", (f"%{args.gpu}%",)):
            if (m, n, k) in algos and ((m, n, k) not in best or us < best[(m, n, k)][0]):
                best[(m, n, k)] = (us, s)
    try:
        rows = sorted((best[key][1], key, best[key][0], algos[key][1], decode(algos[key][0]))
                      for key in algos if key in best)
    except LtDecodeError as e:
        raise SystemExit(f"lt_algos: {e}") from None
    print(f"{len(rows)} shapes of {args.shapes} with a stored cuBLASLt autotuned algorithm; the {args.worst} where our "
          "best kernel is slowest vs cuBLAS:\n")
    print("| M x N x K | ours us | speedup vs cuBLAS | Lt autotuned us | algo | tile (M x N) | split-K | reduction | "
          "cluster (M x N) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s, (m, n, k), us, lt_us, a in rows[:args.worst]:
        print(f"| {m}x{n}x{k} | {us:.1f} | {s:.3f}x | {lt_us:.1f} | {a.algo_id} | {a.tile_m}x{a.tile_n} | {a.splits} | "
              f"{a.reduction} | {a.cluster_m}x{a.cluster_n} |")
    lose = [r for r in rows if r[0] < 1]
    split = [r for r in lose if r[4].splits > 1]
    multi = [r for r in lose if r[4].cluster_m * r[4].cluster_n > 1]
    print(f"\nWhere we are slower ({len(lose)} shapes): cuBLASLt splits K on {len(split)}, into "
          f"{sorted({r[4].splits for r in split})} ranges; runs clusters of 2 or more CTAs on {len(multi)}; geomean "
          f"of our speedup there {math.exp(sum(math.log(r[0]) for r in lose) / max(len(lose), 1)):.3f}x.")


if __name__ == "__main__":
    main()
