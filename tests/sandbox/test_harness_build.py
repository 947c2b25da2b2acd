"""The C++ harness builds (host code and its cuBLAS calls) before any device time is spent on it.

Needs cuBLAS headers and libraries as well as nvcc: found the way the evaluator finds them (CUDAL2_CUBLAS_HOME,
CUDA_HOME, the nvidia-cublas wheels). Where they are absent (CI's CPU machine) the test says so and skips; the GPU
run builds the harness on first use anyway.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from cudal2.sandbox.harness_build import find_cublas, harness_path
from cudal2.sandbox.types import MAX_WORKSPACE_BYTES


@pytest.mark.nvcc
def test_harness_builds_for_sm90(tmp_path):
    if find_cublas() is None:
        pytest.skip("no cuBLAS headers/libraries (set CUDAL2_CUBLAS_HOME to a cuBLAS root to build the harness)")
    exe = harness_path("9.0", cache_root=tmp_path)
    assert exe.is_file() and os.access(exe, os.X_OK)
    assert harness_path("9.0", cache_root=tmp_path) == exe  # cached: the same sources build once


def test_the_generators_workspace_limit_is_the_harness_own():
    """MAX_WORKSPACE_BYTES mirrors harness.cu's MAX_WORKSPACE (the families refuse shapes by it): the two stay equal."""
    source = (Path(__file__).parents[2] / "cudal2/sandbox/harness/harness.cu").read_text()
    match = re.search(r"static const size_t MAX_WORKSPACE = (\d+)ull << (\d+);", source)
    assert match, "harness.cu no longer declares MAX_WORKSPACE as N << S"
    assert int(match[1]) << int(match[2]) == MAX_WORKSPACE_BYTES
