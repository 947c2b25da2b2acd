"""Which GPU (if any) this machine has, and which nvcc target it needs.

Read through `nvidia-smi` so that the parent process never initialises CUDA itself: every CUDA context lives
in a sandboxed child (see cudal2.sandbox.runner).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

# Compile target when there is no GPU to ask: the lent H200.
DEFAULT_ARCH = "sm_90a"


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    compute_capability: str  # e.g. "9.0"
    memory_mib: int

    @property
    def arch(self) -> str:
        return arch_for(self.compute_capability)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.arch})"


# Streaming multiprocessors per GPU, by a part of nvidia-smi's name (which cannot report the count); first match wins,
# so longer names come before their prefixes. Used only to rank work decompositions (`cudal2 tune --strategy fill`).
SM_COUNTS = (("H100 PCIe", 114), ("H200", 132), ("H100", 132), ("H800", 132), ("A100", 108), ("A800", 108),
             ("L40S", 142), ("L40", 142), ("L4", 58), ("A10", 72), ("RTX 4090", 128), ("RTX 3090", 82))


def sm_count(gpu: GpuInfo | None, arch: str) -> int:
    """The GPU's SM count from SM_COUNTS; unknown (or no GPU): an H100/H200's 132 on sm_90a, an A100's 108 else."""
    for part, sms in SM_COUNTS:
        if gpu is not None and part.lower() in gpu.name.lower():
            return sms
    return 132 if arch == "sm_90a" else 108


def arch_for(compute_capability: str) -> str:
    """nvcc target per the evaluator contract: sm_90a on Hopper, sm_80 (plus its PTX) otherwise."""
    return "sm_90a" if compute_capability.strip() == "9.0" else "sm_80"


def detect_gpu(index: int = 0) -> GpuInfo | None:
    """The GPU at `index` as nvidia-smi sees it, or None on a machine without a usable GPU."""
    if os.environ.get("CUDAL2_NO_GPU"):  # lets a user (or a test) force the CPU path on a GPU machine
        return None
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, f"--id={index}", "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    name, cc, mem = (part.strip() for part in out.stdout.strip().splitlines()[0].split(","))
    try:
        memory = int(float(mem))
    except ValueError:
        memory = 0
    return GpuInfo(index=index, name=name, compute_capability=cc, memory_mib=memory)


def visible_gpus() -> list[GpuInfo]:
    """Every GPU nvidia-smi lists (respecting CUDAL2_NO_GPU), in index order."""
    gpus = []
    for index in range(64):
        gpu = detect_gpu(index)
        if gpu is None:
            break
        gpus.append(gpu)
    return gpus
