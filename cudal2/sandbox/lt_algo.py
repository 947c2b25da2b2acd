"""The cuBLASLt algorithm the harness autotuned for a shape, decoded into the config it stands for.

The harness times the cuBLASLt baseline with the fastest of cublasLtMatmulAlgoGetHeuristic's algorithms and the store
keeps that algorithm serialised (`algo_cache`, cublasLtMatmulAlgo_t as 128 hex digits). `decode` reads it back with
cublasLtMatmulAlgoConfigGetAttribute through ctypes: a host-only call, so it runs on a machine without a GPU as long
as the cuBLAS library and headers are there (found as the harness build finds them). The names of tiles and cluster
shapes come from cublasLt.h's enums.

cuBLASLt computes C^T = B^T A^T (column-major, the harness's call): its tile "X x Y" is X along our N and Y along our
M. `LtAlgo` is in our terms.
"""

from __future__ import annotations

import ctypes
import functools
import re
from dataclasses import dataclass

from cudal2.sandbox.harness_build import find_cublas

CUBLASLT_AUTOTUNED = "cublaslt_autotuned"  # the algo_cache kind of the harness's autotuned algorithm
ALGO_BYTES = 64  # sizeof(cublasLtMatmulAlgo_t): uint64_t data[8]
# cublasLtMatmulAlgoConfigAttributes_t values and the C type of each (cublasLt.h).
_ATTRS = {"algo": (0, ctypes.c_int32), "tile": (1, ctypes.c_uint32), "splits": (2, ctypes.c_uint32),
          "reduction": (3, ctypes.c_uint32), "cluster": (8, ctypes.c_uint16)}
# cublasLtReductionScheme_t
REDUCTIONS = {0: "none", 1: "inplace", 2: "fp32 workspace", 4: "output type"}


class LtDecodeError(Exception):
    """No cuBLAS to decode with, or a malformed algorithm: one line saying which."""


@dataclass(frozen=True)
class LtAlgo:
    """One autotuned cuBLASLt algorithm, in our M x N terms. 0 in a tile or cluster field: cuBLASLt left it open
    (CUBLASLT_MATMUL_TILE_UNDEFINED, CUBLASLT_CLUSTER_SHAPE_AUTO)."""

    algo_id: int
    tile_m: int
    tile_n: int
    splits: int  # K ranges (1: no split-K)
    reduction: str  # how split-K partials are summed (REDUCTIONS)
    cluster_m: int
    cluster_n: int


@functools.cache
def _library() -> tuple[ctypes.CDLL, dict[int, tuple[int, int]], dict[int, tuple[int, int]]]:
    """libcublasLt, and tile / cluster-shape enum value -> (cuBLASLt's first, second) dimension."""
    where = find_cublas()
    if where is None:
        raise LtDecodeError("no cuBLAS library and headers to decode cuBLASLt algorithms with (set CUDAL2_CUBLAS_HOME)")
    try:
        lib = ctypes.CDLL(str(sorted(where.lib.glob("libcublasLt.so*"))[0]))
        header = (where.include / "cublasLt.h").read_text()
    except OSError as e:
        raise LtDecodeError(f"cannot load cuBLASLt from {where.lib}: {e}") from None
    lib.cublasLtMatmulAlgoConfigGetAttribute.restype = ctypes.c_int
    return lib, _enum_dims(header, "CUBLASLT_MATMUL_TILE_"), _enum_dims(header, "CUBLASLT_CLUSTER_SHAPE_")


def _enum_dims(header: str, prefix: str) -> dict[int, tuple[int, int]]:
    """`PREFIX<a>x<b>[x<c>] = value` entries of cublasLt.h as value -> (a, b)."""
    return {int(v): (int(a), int(b)) for a, b, v in re.findall(rf"{prefix}(\d+)x(\d+)(?:x\d+)?\s*=\s*(\d+)", header)}


def decode(algo_hex: str) -> LtAlgo:
    """The config of a serialised cublasLtMatmulAlgo_t (the store's algo_hex)."""
    try:
        raw = bytes.fromhex(algo_hex)
    except ValueError:
        raise LtDecodeError(f"not a hex string: {algo_hex[:40]!r}") from None
    if len(raw) != ALGO_BYTES:
        raise LtDecodeError(f"a cublasLtMatmulAlgo_t is {ALGO_BYTES} bytes, got {len(raw)}")
    lib, tiles, clusters = _library()
    algo = ctypes.create_string_buffer(raw, ALGO_BYTES)
    values = {}
    for name, (attr, ctype) in _ATTRS.items():
        value, written = ctype(0), ctypes.c_size_t(0)
        status = lib.cublasLtMatmulAlgoConfigGetAttribute(algo, attr, ctypes.byref(value), ctypes.sizeof(value),
                                                          ctypes.byref(written))
        if status != 0:
            raise LtDecodeError(f"cublasLtMatmulAlgoConfigGetAttribute({name}) returned status {status}")
        values[name] = value.value
    tile_n, tile_m = tiles.get(values["tile"], (0, 0))  # cuBLASLt's first dimension is our N
    cluster_n, cluster_m = clusters.get(values["cluster"], (0, 0))
    return LtAlgo(values["algo"], tile_m, tile_n, max(values["splits"], 1),
                  REDUCTIONS.get(values["reduction"], str(values["reduction"])), cluster_m, cluster_n)
