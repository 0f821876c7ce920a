"""Where a benchmark ran: the commit and the machine, recorded beside every result so numbers stay comparable."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from frspec.decode.cost_measure import cpu_model, kernel_isa  # the cost cache names the CPU the same way
from frspec.models import one_row_linear, wide_linear
from frspec.models.dtypes import HALF_DTYPES


def git_commit(repo_dir: str | os.PathLike | None = None) -> str:
    """The checked-out commit (with "-dirty" if the tree has changes), or "unknown" outside a git checkout."""
    cwd = Path(repo_dir) if repo_dir is not None else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit}-dirty" if dirty else commit or "unknown"


def machine_info(cpu_dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Platform, CPU, core count, torch build and accelerator, as plain JSON-able values; for a run of half-precision
    models on the CPU (`cpu_dtype`), which kernels this process chose for them (models/wide_linear.py,
    models/one_row_linear.py: measured once per process, so a mis-measurement shows here)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "kernel_isa": kernel_isa(),  # e.g. lowered to AVX2 to stand in for an AVX2-only CPU
    }
    if cpu_dtype in HALF_DTYPES:
        cpu = torch.device("cpu")
        info["half_kernels"] = {"dtype": str(cpu_dtype).removeprefix("torch."),
                                "fp32_from_rows": wide_linear.wide_rows(cpu_dtype, cpu),
                                "one_row_native": one_row_linear.on_this_machine(cpu_dtype, cpu)}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info
