"""The kernels cuBLAS's default heuristic runs for a shape (the harness's `cublas` baseline), read back as the
`LtAlgo` they stand for, so that the tuner can start from cuBLAS's own choice as it starts from cuBLASLt's.

`benchmarks/cublas_graph.cu` (run on the GPU by `scripts/gpu_check.sh gap`) captures the baseline's calls into a graph
and prints, per shape, a header line and one indented line per distinct node:

    128x128x16384 nodes/call=2.00 programmatic_edges=64
      1.00/call  kernel nvjet_sm90_hsh_64x32_64x16_2x4_h_bz_splitK_TNT grid=8x12x1 block=384 cluster=8x1x1 ...
      1.00/call  kernel _ZN8cublasLt19splitKreduce_kernel... grid=4x8x1 block=512 ...

cuBLAS computes C^T = B^T A^T (column-major), so an nvjet name's tile "X x Y" and cluster "a x b" are X and a along
our N, Y and b along our M (the convention of `lt_algo`). The name carries no split count: with `_splitK` it is the
grid's CTAs over the output tiles. Kernels of other names (cutlass_*, sm80_* and the reduction) give no algorithm.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from cudal2.sandbox.lt_algo import LtAlgo

_HEADER = re.compile(r"^(?P<m>\d+)x(?P<n>\d+)x(?P<k>\d+) nodes/call=")
_KERNEL = re.compile(r"^\s+[\d.]+/call\s+kernel (?P<name>\S+) grid=(?P<gx>\d+)x(?P<gy>\d+)x(?P<gz>\d+)\b")
# nvjet_sm90_hsh_<tile N>x<tile M>_<BK>x<stages>_<cluster N>x<cluster M>_<raster h|v>_bz[_coopA|_coopB][_splitK]_<ops>
_NVJET = re.compile(r"^nvjet_sm\d+_\w+?_(?P<tn>\d+)x(?P<tm>\d+)_(?P<bk>\d+)x(?P<stages>\d+)_(?P<cn>\d+)x(?P<cm>\d+)_"
                    r"[hv]_\w*?(?P<splitk>_splitK)?_[TN]{3}$")


class CublasKernelsError(ValueError):
    """A cublas_graph report that cannot be read; one line saying where."""


@dataclass(frozen=True)
class Launch:
    """One kernel of a shape's cuBLAS call: its name and grid (CTAs per dimension)."""

    name: str
    grid: tuple[int, int, int]


def read_report(text: str) -> dict[tuple[int, int, int], list[Launch]]:
    """(M, N, K) -> the kernels of one cuBLAS call, from cublas_graph.cu's output. Lines of no shape are skipped (a
    shape whose call failed has a header and no kernels); a kernel line before any shape is an error."""
    out: dict[tuple[int, int, int], list[Launch]] = {}
    shape = None
    for number, line in enumerate(text.splitlines(), 1):
        if m := _HEADER.match(line):
            shape = (int(m["m"]), int(m["n"]), int(m["k"]))
            out[shape] = []
        elif m := _KERNEL.match(line):
            if shape is None:
                raise CublasKernelsError(f"line {number}: a kernel before any shape line")
            out[shape].append(Launch(m["name"], (int(m["gx"]), int(m["gy"]), int(m["gz"]))))
    return out


def as_lt_algo(launch: Launch, m: int, n: int) -> LtAlgo | None:
    """The tile, cluster and split-K of an nvjet kernel run on an M x N output, in our terms; None for other kernels.
    The split count is the grid's CTAs over the output tiles (at least 1), for `_splitK` kernels only."""
    got = _NVJET.match(launch.name)
    if got is None:
        return None
    tile_m, tile_n = int(got["tm"]), int(got["tn"])
    splits = 1
    if got["splitk"]:
        tiles = math.ceil(m / tile_m) * math.ceil(n / tile_n)
        splits = max(1, round(math.prod(launch.grid) / tiles))
    return LtAlgo(algo_id=-1, tile_m=tile_m, tile_n=tile_n, splits=splits,
                  reduction="fp32 workspace" if splits > 1 else "none", cluster_m=int(got["cm"]),
                  cluster_n=int(got["cn"]))


def cublas_algos(text: str) -> dict[tuple[int, int, int], LtAlgo]:
    """(M, N, K) -> the algorithm of the shape's nvjet kernel, for the shapes whose cuBLAS call runs one."""
    out = {}
    for (m, n, k), launches in read_report(text).items():
        algos = [a for a in (as_lt_algo(x, m, n) for x in launches) if a is not None]
        if algos:
            out[(m, n, k)] = algos[0]
    return out
