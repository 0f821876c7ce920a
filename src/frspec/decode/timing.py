"""Wall-clock readings that mean the same on CPU and GPU."""

from __future__ import annotations

import time

import torch


def now(device: torch.device | None = None) -> float:
    """perf_counter() after the device has finished its queued work, so an interval covers the kernels it launched."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
