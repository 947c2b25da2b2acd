"""Test-suite rules.

CPU vs GPU: a test that needs a CUDA GPU carries `@pytest.mark.gpu` and is skipped where none is visible;
scripts/gpu_check.sh runs them on the device. A test that needs nvcc carries `@pytest.mark.nvcc`: it is skipped
with a stated reason where nvcc is absent (a laptop), but under CI=true a missing nvcc is a failure.
"""

from __future__ import annotations

import os
import shutil

import pytest

from cudal2.sandbox.gpu import detect_gpu


def _shard(spec: str) -> tuple[int, int]:
    """CUDAL2_SHARD "i/n" (1 <= i <= n) as (i, n); anything else stops the run with a one-line reason."""
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        i = n = 0
    if not 1 <= i <= n:
        raise pytest.UsageError(f"CUDAL2_SHARD must be i/n with 1 <= i <= n, got {spec!r}")
    return i, n


def pytest_collection_modifyitems(config, items):
    # CUDAL2_SHARD=i/n keeps every n-th collected test from the i-th on (scripts/gpu_check.sh's GPU_TESTS_SHARD): the
    # whole GPU suite takes longer than one device call may run (600 s), so it runs as shards over several calls.
    spec = os.environ.get("CUDAL2_SHARD")
    if spec:
        i, n = _shard(spec)
        config.hook.pytest_deselected(items=[item for k, item in enumerate(items) if k % n != i - 1])
        items[:] = items[i - 1::n]
    have_nvcc = shutil.which("nvcc") is not None
    gpu = detect_gpu()
    for item in items:
        if "nvcc" in item.keywords and not have_nvcc:
            if os.environ.get("CI"):
                pytest.exit("nvcc is required under CI=true (tests marked nvcc must run there)", returncode=1)
            else:
                item.add_marker(pytest.mark.skip(reason="nvcc not on PATH (install the CUDA toolkit to run)"))
        if "gpu" in item.keywords and gpu is None:
            item.add_marker(pytest.mark.skip(reason="no CUDA GPU visible (run scripts/gpu_check.sh on the device)"))


def pytest_runtest_logreport(report):
    """With CUDAL2_FAILURE_LOG set (scripts/gpu_check.sh sets it), each failure's test id and traceback go to that
    file as it happens: a device call cut off by its time limit still tells which test failed and why (pytest's
    own summary comes only at the end, which such a call never reaches)."""
    path = os.environ.get("CUDAL2_FAILURE_LOG")
    if path and report.failed:
        with open(path, "a") as f:
            f.write(f"FAILED ({report.when}) {report.nodeid}\n{report.longreprtext}\n\n")
