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


def pytest_collection_modifyitems(config, items):
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
