"""The timer every kernel choice of the models is measured with (models/wide_linear.py, models/one_row_linear.py):
once per process, on a small weight, before any model runs.

A choice is made for the whole process, so one noisy measurement costs every forward of a run: on the 2-core AVX-512
EPYC (native bf16), a bench run's check of wide bf16 calls (then three calls of each kernel, one after the other)
found fp32 faster, and its 0.5B drafter then prefilled 32 rows in 0.59 s where 31 took 0.14 s (bf16 greedy mix,
`6b4c17a`, docs/bench-auto/epyc-avx512-bf16mix9-128r2-greedy-6b4c17a: drafter prefills 1.8-2.0x another run's);
timed apart, the bf16 kernel there is 3-6x the faster. So the two kernels are timed alternately over several rounds
(`alternated_medians`): a stretch of a shared machine's noise weighs on both alike, and the median ignores a few
stalled calls."""

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


def alternated_medians(first, second, rounds: int = 9) -> tuple[float, float]:
    """Median seconds of `first` and of `second` over `rounds` rounds, each a warm-up and a timed call of the one,
    then of the other (module docstring)."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for fn, out in zip((first, second), times):
            out.append(median_s(fn, repeats=1))
    return tuple(sorted(out)[len(out) // 2] for out in times)
