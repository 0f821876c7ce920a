"""One reused buffer for a weight that lives for a single call: a prefill's dequantized int4 weight, or a half-precision
weight widened to fp32 (models/quant.py, models/wide_linear.py).

A fresh tensor of tens of MB costs more to allocate than to fill: glibc serves it with mmap, and the kernel maps and
zero-fills every page at its first touch, every call again. On the 2-core AMD EPYC (AVX2 only, 2 threads) converting a
4864x896 uint8 tensor to fp32 took 8.2 ms into a fresh tensor and 0.8 ms into a reused one; 8960x1536, 30.6 against
3.4 ms (scripts/quant_prefill.py times whole layers). A prompt's prefill makes such a weight for every linear layer,
so the 0.5B drafter's int4 prefill paid about 1.5 s before its first token's GEMMs (scripts/quant_prefill.py
`--model`).

`call_weight` hands out a view of one buffer per (dtype, device) and thread, grown to the largest weight asked for up
to `MAX_BYTES`; a larger weight gets a fresh tensor, as before. The view is valid until the thread's next call: the
caller uses it for one matmul and drops it; models run from two threads at once never share one. Nothing is reused
where autograd may keep the weight for a backward pass (grad mode on, and the input or the weight requiring grad),
so training never sees it overwritten.
"""

from __future__ import annotations

import math
import threading

import torch

# The most a kept buffer may hold: an 8960x1536 fp32 weight is 55 MB, a 7B model's 18944x3584 one 272 MB. A kept
# buffer is memory the process holds until it exits, so larger weights (an LM head widened for a many-row call) stay
# one-off allocations.
MAX_BYTES = 320 << 20

_local = threading.local()  # .buffers: {(dtype, device): the kept buffer}, per thread


def _reusable(*tensors: torch.Tensor) -> bool:
    """Whether autograd keeps no reference to a weight multiplied with these tensors."""
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def call_weight(shape: tuple[int, ...], dtype: torch.dtype, x: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor of `shape` for the weight of one call with input `x` (on its device): a view of the
    kept buffer (overwritten by this thread's next call_weight of its dtype and device) or, past MAX_BYTES or where
    autograd could keep it, a fresh tensor. The buffer is a normal tensor even when made under inference mode: an
    inference tensor could not be written outside it (the engine decodes under inference mode, a user's code may
    not)."""
    numel = math.prod(shape)
    device = x.device
    if numel * dtype.itemsize > MAX_BYTES or not _reusable(x):
        return torch.empty(shape, dtype=dtype, device=device)
    buffers = _local.__dict__.setdefault("buffers", {})
    key = (dtype, device)
    buffer = buffers.get(key)
    if buffer is None or buffer.numel() < numel:
        buffers.pop(key, None)  # free the smaller one first: never both held at once
        with torch.inference_mode(False):  # a normal tensor, writable in and out of inference mode alike
            buffer = buffers[key] = torch.empty(numel, dtype=dtype, device=device)
    return buffer[:numel].view(shape)


def widened(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`weight` in fp32 for one call with input `x`: the weight itself where it is fp32, a differentiable copy where
    autograd needs one, else a copy into the kept buffer."""
    if weight.dtype == torch.float32:
        return weight
    if not _reusable(x, weight):
        return weight.float()
    return call_weight(tuple(weight.shape), torch.float32, x).copy_(weight)
