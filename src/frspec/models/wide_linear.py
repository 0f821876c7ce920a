"""Wide bf16/fp16 linear layers computed through fp32 on CPUs whose half-precision GEMM is slow.

On a CPU without native bf16 arithmetic (the AVX2 EPYC: no AVX512_BF16, no AMX), PyTorch's bf16 GEMM over many
rows runs several times slower than MKL's fp32 GEMM over the same rows, and a prompt's prefill is all such calls:
the 1.5B target prefills 512 tokens at 7.9 tokens/s in bf16 there, 46.1 through fp32. A wide call (`WIDE_ROWS` rows
or more: a prefill, a draft model catching up on tokens it missed, a large tree) therefore widens its input and
weight to fp32 for the call, runs the fp32 GEMM and rounds the output back; narrow calls (decode steps, verifying
k + 1 rows) keep the half kernel, which is the cheaper one for a row or two. Widening is exact, so the result
differs from the half GEMM's (which accumulates in fp32 too) only in summation order, as two half kernels would.
The weight's fp32 copy lives for one call, in one buffer reused by every layer (models/call_weight.py: fresh pages
cost more than the copy): memory stays one half-precision copy of the model and that buffer.

Whether this machine gains is measured once per process and dtype (`fp32_is_faster`), never assumed from the
CPU's name: on a CPU with native bf16 the half GEMM stays. `FRSPEC_WIDE_FP32=0` (or 1) overrides the
measurement.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import nn
from torch.nn import functional as F

from frspec.models import one_row_linear
from frspec.models.call_weight import widened
from frspec.models.dtypes import HALF_DTYPES
from frspec.models.kernel_timing import alternated_medians

# Rows from which a call goes through fp32 where that is faster (`fp32_is_faster`): where the two cost lines cross
# on the AVX2 EPYC (scripts/wide_linear_rows.py, docs/quantization.md). An 8960x1536 bf16 weight costs 20.8 / 41.2
# / 84.3 ms over 16 / 32 / 64 rows in bf16 and 33.6 / 37.8 / 43.0 ms widened (24 ms of which convert the weight).
WIDE_ROWS = 32
ENV = "FRSPEC_WIDE_FP32"


@functools.cache
def fp32_is_faster(dtype: torch.dtype) -> bool:
    """Whether a wide CPU linear in `dtype` runs faster widened to fp32 on this machine (one measurement per
    process: a 2048x2048 weight over 2 * WIDE_ROWS rows, nine alternated rounds of the two kernels, the medians
    compared: kernel_timing.alternated_medians; about 0.1 s)."""
    override = os.environ.get(ENV, "").strip()
    if override in ("0", "1"):
        return override == "1"
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(2048, 2048, generator=gen).to(dtype)
    x = torch.randn(2 * WIDE_ROWS, 2048, generator=gen).to(dtype)
    half, wide = alternated_medians(lambda: F.linear(x, weight),
                                    lambda: F.linear(x.float(), weight.float()).to(dtype))
    return wide < 0.8 * half  # a clear gain only: near a tie the half kernel stays


def wide_rows(dtype: torch.dtype, device: torch.device) -> int | None:
    """From how many rows a call in `dtype` on `device` goes through fp32 here; None where it never does."""
    return WIDE_ROWS if dtype in HALF_DTYPES and device.type == "cpu" and fp32_is_faster(dtype) else None


def is_wide(x: torch.Tensor) -> bool:
    """An input of at least `wide_rows` rows for its dtype and device on this machine. Rows are counted first, so a
    narrow call never asks for the measurement."""
    if x.dim() == 0 or x.shape[-1] == 0 or x.numel() // x.shape[-1] < WIDE_ROWS:
        return False
    return wide_rows(x.dtype, x.device) is not None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through fp32 for a wide half-precision call on a machine where that is faster (`is_wide`), and a
    one-row call on PyTorch's own kernel where oneDNN's is the slower (models/one_row_linear.py)."""
    if is_wide(x):
        # The fp32 weight lives for this call: in the reused buffer (models/call_weight.py), not fresh pages.
        y = F.linear(x.float(), widened(weight, x), None if bias is None else bias.float())
        return y.to(x.dtype)
    if one_row_linear.applies(x):
        return one_row_linear.linear(x, weight, bias)
    return F.linear(x, weight, bias)


class WideLinear(nn.Linear):
    """An nn.Linear whose calls go through `linear` (wide ones through fp32, one-row ones on the faster kernel); the
    same parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def use_wide_linears(model: nn.Module) -> int:
    """Make every plain nn.Linear of a half-precision CPU model a WideLinear sharing its parameters (tied weights
    stay tied); returns how many. Other dtypes and devices are left as they are."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear or child.weight.dtype not in HALF_DTYPES:
                continue
            if child.weight.device.type != "cpu":
                continue
            wide = WideLinear(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
            wide.weight = child.weight
            wide.bias = child.bias
            setattr(parent, name, wide)
            swapped += 1
    return swapped
