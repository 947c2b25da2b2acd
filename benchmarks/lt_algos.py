"""What cuBLASLt's autotuned algorithm is, per shape, next to our best kernel: read from a result store on the CPU.

The harness times the cuBLASLt baseline with the fastest of cublasLtMatmulAlgoGetHeuristic's algorithms and keeps
that algorithm, serialised, in the store's `algo_cache` table (cublasLtMatmulAlgo_t as hex). This script decodes
each one with cublasLtMatmulAlgoConfigGetAttribute (host-only: no GPU needed) into the config cuBLAS chose: algo id,
CTA tile, split-K count and reduction scheme, CTA swizzle, stages, cluster shape. It tells the kernel families what
cuBLAS does where it beats them.

    python3 benchmarks/lt_algos.py --db <store> [--shapes data/grid.csv] [--worst 30] [--gpu h200]

Needs g++ and the cuBLAS headers and library (found as the harness build finds them: CUDAL2_CUBLAS_HOME, CUDA_HOME,
pip's nvidia wheels). cuBLASLt describes C^T = B^T A^T (column-major, the harness's call): its tile "X x Y" is X
along our N and Y along our M, and its cluster "a x b" is a CTAs along our N and b along our M. The columns below
are already in our terms (M x N).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from contextlib import closing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cudal2.data import load_shapes  # noqa: E402
from cudal2.sandbox.harness_build import find_cublas  # noqa: E402

# Reads serialised algorithms (hex, one per line) on stdin; prints one line of config attributes per algorithm.
DECODER = r"""
#include <cublasLt.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
template <class T>
static T get(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof v, &written) != CUBLAS_STATUS_SUCCESS) return T(~0u);
  return v;
}
int main() {
  std::string h;
  while (std::cin >> h) {
    cublasLtMatmulAlgo_t a;
    if (h.size() != 2 * sizeof a) { std::printf("bad\n"); continue; }
    uint8_t* p = reinterpret_cast<uint8_t*>(&a);
    for (size_t i = 0; i < sizeof a; ++i) p[i] = (uint8_t)std::strtoul(h.substr(2 * i, 2).c_str(), nullptr, 16);
    std::printf("%d %u %d %u %u %u %u\n", get<int>(a, CUBLASLT_ALGO_CONFIG_ID), get<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
                get<int>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), get<uint32_t>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
                get<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING), get<uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                (unsigned)get<uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
  }
}
"""
REDUCTION = {0: "none", 1: "inplace", 2: "fp32 workspace", 4: "output type"}  # cublasLtReductionScheme_t


def enum_names(header: str, prefix: str) -> dict[int, str]:
    """Value -> name without `prefix` of one enum of cublasLt.h."""
    return {int(v): n for n, v in re.findall(rf"{prefix}(\w+)\s*=\s*(\d+)", header)}


def build_decoder(workdir: Path) -> tuple[Path, str]:
    """The decoder binary and the text of cublasLt.h."""
    where = find_cublas()
    if where is None:
        raise SystemExit("lt_algos: no cuBLAS headers/libraries (set CUDAL2_CUBLAS_HOME to a cuBLAS root)")
    nvcc = shutil.which("nvcc")
    roots = [Path(os.environ["CUDA_HOME"])] if os.environ.get("CUDA_HOME") else []
    roots += [Path("/usr/local/cuda")] + ([Path(nvcc).resolve().parents[1]] if nvcc else [])
    cuda_include = next((r / "include" for r in roots if (r / "include" / "driver_types.h").exists()), None)
    if cuda_include is None:
        raise SystemExit("lt_algos: no CUDA runtime headers (driver_types.h, which cublasLt.h needs): set CUDA_HOME")
    src, exe = workdir / "decode.cpp", workdir / "decode"
    src.write_text(DECODER)
    lib = sorted(where.lib.glob("libcublasLt.so*"))[0]
    built = subprocess.run(["g++", "-O1", "-std=c++17", f"-I{where.include}", f"-I{cuda_include}", str(src), "-o",
                            str(exe), str(lib), f"-Wl,-rpath,{where.lib}"], capture_output=True, text=True)
    if built.returncode != 0:
        first = next((x for x in built.stderr.splitlines() if "error" in x), built.stderr.strip())
        raise SystemExit(f"lt_algos: building the decoder failed: {first}")
    return exe, (where.include / "cublasLt.h").read_text()


def ours(a: str, b: str) -> str:
    """cuBLASLt's "X x Y" (column-major C^T) as our "M x N"."""
    return f"{b}x{a}"


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
    keys = sorted(k for k in algos if k in best)
    with tempfile.TemporaryDirectory() as tmp:
        exe, header = build_decoder(Path(tmp))
        out = subprocess.run([str(exe)], input="\n".join(algos[k][0] for k in keys), capture_output=True, text=True,
                             check=True).stdout.split("\n")
    tiles = enum_names(header, "CUBLASLT_MATMUL_TILE_")
    stages = enum_names(header, "CUBLASLT_MATMUL_STAGES_")
    clusters = enum_names(header, "CUBLASLT_CLUSTER_SHAPE_")
    rows = []
    for key, line in zip(keys, out, strict=False):
        algo, tile, splitk, red, swz, stage, cluster = (int(x) for x in line.split())
        t = tiles.get(tile, str(tile)).split("x")
        c = clusters.get(cluster, str(cluster)).split("x")
        rows.append((best[key][1], key, best[key][0], algos[key][1], algo, ours(*t) if len(t) == 2 else t[0], splitk,
                     REDUCTION.get(red, str(red)), swz, stages.get(stage, str(stage)),
                     ours(c[0], c[1]) if len(c) == 3 else c[0]))
    print(f"{len(rows)} shapes of {args.shapes} with a stored cuBLASLt autotuned algorithm; the {args.worst} where our "
          "best kernel is slowest vs cuBLAS:\n")
    print("| M x N x K | ours us | speedup vs cuBLAS | Lt autotuned us | algo | tile (M x N) | split-K | reduction | "
          "swizzle | stages | cluster (M x N) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for s, (m, n, k), us, lt_us, algo, tile, splitk, red, swz, stage, cluster in sorted(rows)[:args.worst]:
        print(f"| {m}x{n}x{k} | {us:.1f} | {s:.3f}x | {lt_us:.1f} | {algo} | {tile} | {splitk} | {red} | {swz} | "
              f"{stage} | {cluster} |")
    lose = [r for r in rows if r[0] < 1]
    split = [r for r in lose if r[6] > 1]
    multi = [r for r in lose if r[10] not in ("1x1", "AUTO")]
    print(f"\nWhere we are slower ({len(lose)} shapes): cuBLASLt splits K on {len(split)}, with "
          f"{sorted({r[6] for r in split})} ranges; uses clusters other than 1x1 on {len(multi)}; geomean of our "
          f"speedup there {math.exp(sum(math.log(r[0]) for r in lose) / max(len(lose), 1)):.3f}x.")


if __name__ == "__main__":
    main()
