"""The timer every kernel choice of the models is measured with (models/wide_linear.py, models/one_row_linear.py):
once per process, on a small weight, before any model runs."""

from __future__ import annotations

import time

import torch


def median_s(fn, repeats: int = 3) -> float:
    """Median seconds of `repeats` calls of `fn` after one warm-up call, under inference mode."""
    with torch.inference_mode():
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]
