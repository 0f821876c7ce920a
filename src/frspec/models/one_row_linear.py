"""One-row half-precision linear calls on PyTorch's own GEMV where oneDNN's is the slower kernel.

Every decode step's calls but the verifier's have one row: vanilla decoding, a draft model's step, an EAGLE or MTP
step. On a CPU with native bf16 (AVX512_BF16), PyTorch sends every bf16 linear to oneDNN, whose kernel costs about
the same for 1 to 8 rows: right for verifying k + 1 rows, but for one row PyTorch's own kernel (what runs with oneDNN
off) streams the weight up to 2.7x faster. Measured on the 2-core AVX-512 EPYC (docs/quantization.md, the table): an
8960x1536 bf16 weight 0.64 ms against 1.10 ms, the 151936x1536 LM head 10.9 against 29.3 ms; from two rows on oneDNN
is the faster (0.81 against 1.22 ms). The 1.5B target's one-row forward went from 199 to 121 ms; its 2-row forward
stays 178-181 ms. So a one-row call runs with oneDNN switched off for that call alone: the models' linear layers
through `linear` (models/wide_linear.py), a drafter's LM head over its vocabulary's rows inside `kernel_for`.

Whether this machine gains is measured once per process and dtype (`native_is_faster`), never assumed from the CPU's
name: where oneDNN does not take bf16 (measured here under `ONEDNN_MAX_CPU_ISA=AVX2`: one kernel either way) nothing
changes.
`FRSPEC_ONE_ROW_NATIVE=0` (or 1) overrides the measurement. The two kernels accumulate in fp32 and differ only in
summation order, as one-row and k + 1-row calls always have in bf16; fp32 models are untouched, so the fp32
identity tests hold as before.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Iterator

import torch
from torch.nn import functional as F

from frspec.models.dtypes import HALF_DTYPES
from frspec.models.kernel_timing import alternated_medians

ENV = "FRSPEC_ONE_ROW_NATIVE"


@functools.cache
def native_is_faster(dtype: torch.dtype) -> bool:
    """Whether a one-row CPU linear in `dtype` runs faster with oneDNN off on this machine (one measurement per
    process: an 8192x2048 weight, larger than the caches as a model's are; nine alternated rounds of the two kernels,
    the medians compared: kernel_timing.alternated_medians; about 0.15 s)."""
    override = os.environ.get(ENV, "").strip()
    if override in ("0", "1"):
        return override == "1"
    if not torch.backends.mkldnn.is_available():
        return False
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(8192, 2048, generator=gen).to(dtype)
    x = torch.randn(1, 2048, generator=gen).to(dtype)
    default, native = alternated_medians(lambda: F.linear(x, weight), lambda: linear(x, weight))
    return native < 0.8 * default  # a clear gain only: near a tie the default kernel stays


def on_this_machine(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether one-row calls in `dtype` on `device` run on the native kernel here."""
    return dtype in HALF_DTYPES and device.type == "cpu" and native_is_faster(dtype)


def applies(x: torch.Tensor) -> bool:
    """A one-row half-precision CPU input on a machine where the native kernel is the faster for it. Rows are
    counted first, so a call of several rows never asks for the measurement."""
    if x.dim() == 0 or x.shape[-1] == 0 or x.numel() != x.shape[-1]:
        return False
    return on_this_machine(x.dtype, x.device)


def kernel_for(x: torch.Tensor) -> contextlib.AbstractContextManager:
    """Within it, linear calls run on the kernel `x`'s rows are faster on: oneDNN off where `applies(x)`, as it was
    otherwise. For calls that do not go through `linear`: a drafter's LM head over its vocabulary's rows (vocab/, below
    the models' layer)."""
    return _onednn_off() if applies(x) else contextlib.nullcontext()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear with oneDNN switched off for this call."""
    with _onednn_off():
        return F.linear(x, weight, bias)


@contextlib.contextmanager
def _onednn_off() -> Iterator[None]:
    """oneDNN switched off, and back to what it was after, whatever happens (the switch is process-wide; the engine
    runs one call at a time)."""
    previous = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = previous
