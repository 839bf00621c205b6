"""What the machine the workflow runs on has, read without importing torch (Snakemake imports
this when it builds the DAG)."""

from __future__ import annotations

import os
from pathlib import Path

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the NVIDIA driver sees


def gpu_visible() -> bool:
    """Whether this machine has an NVIDIA GPU that CUDA_VISIBLE_DEVICES does not hide."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "x") != "" and NVIDIA_GPUS.is_dir() and any(NVIDIA_GPUS.iterdir())
