"""Weight-only int4 and int8 linear layers on PyTorch's own kernels, and quantizing a loaded model in place.

    quantize_model(model, "int4")          # every nn.Linear, the LM head included, becomes an Int4Linear
    quantize_head(draft_vocab, "int4")     # a drafter's (FR-Spec pruned) head, after its rows were selected

int4 is group-wise asymmetric: each run of `group_size` (default 32) input columns of a row has its own scale and
minimum, w = code * scale + minimum with codes 0..15. That is exactly a GGUF Q4_K sub-block (scale d*sc, minimum
-dmin*m), so GGUF weights convert without re-rounding (models/gguf_quant.py). int8 is per output channel and
symmetric, w = value * scale with values -127..127.

Activations stay in the model's float dtype; only the weights are quantized. From `quant_kernels.INT4_DEQUANT_ROWS`
(`INT8_DEQUANT_ROWS`) rows on, a prompt's prefill, a layer dequantizes its weight for the call and runs the float
GEMM, since the weight-only kernels slow down with rows (through fp32 where this machine's half GEMM is slow:
models/wide_linear.py; int4 then from `INT4_DEQUANT_ROWS_WIDENED`, `int4_dequantizes`). Speculative decoding stays
lossless relative to the quantized target: vanilla and speculative decoding prefill the same prompt alike, and every
decode forward (one row, or a draft's few rows to verify) runs the kernel, so greedy output with a draft equals the
quantized target's own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from frspec.errors import FrspecError
from frspec.models import quant_kernels as K
from frspec.models import wide_linear
from frspec.models.call_weight import call_weight
from frspec.vocab.draft_vocab import DraftVocab

log = logging.getLogger(__name__)  # the `frspec` command prints its records on stderr (cli.py)

QUANT_MODES = ("int4", "int8")
DEFAULT_GROUP_SIZE = 32  # a Q4_K sub-block; the smallest group the int4 kernels accept
# Rows of an int4 weight dequantized at a time for a prefill (a multiple of the CPU layout's 64-row blocks).
DEQUANT_BLOCK_ROWS = 1024


def parse_quant(quant: str | None) -> str | None:
    """"int4"/"int8", or None for no quantization ("none", "", None)."""
    if quant is None:
        return None
    name = str(quant).strip().lower()
    if name in ("", "none", "no", "off"):
        return None
    if name not in QUANT_MODES:
        raise FrspecError(f"unknown quantization {quant!r}: use int4, int8 or none")
    return name


@dataclass
class Int4Weight:
    """Device-neutral int4 weights: codes [N, K] (uint8, 0..15), scale and minimum [N, K / group_size] (fp32)."""

    codes: torch.Tensor
    scale: torch.Tensor
    minimum: torch.Tensor
    group_size: int

    def dequantize(self) -> torch.Tensor:
        n, k = self.codes.shape
        groups = self.codes.float().view(n, k // self.group_size, self.group_size)
        return (groups * self.scale[..., None] + self.minimum[..., None]).view(n, k)


@dataclass
class Int8Weight:
    """Device-neutral int8 weights: values [N, K] (int8) and one scale per row [N] (fp32)."""

    values: torch.Tensor
    scale: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        return self.values.float() * self.scale[:, None]


def int4_dequantizes(x2d: torch.Tensor) -> bool:
    """Whether a CPU int4 call over these rows dequantizes its weight and runs the float GEMM (module docstring):
    from quant_kernels.INT4_DEQUANT_ROWS rows on, or INT4_DEQUANT_ROWS_WIDENED where this machine widens such a call
    to fp32 (its half-precision GEMM is the slow one: models/wide_linear.py). Rows are counted first, so a decode
    step never asks for wide_linear's measurement."""
    rows = x2d.shape[0]
    if rows < K.INT4_DEQUANT_ROWS:
        return False
    return rows >= K.INT4_DEQUANT_ROWS_WIDENED or wide_linear.wide_rows(x2d.dtype, x2d.device) is None


def quantize_int4(weight: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE) -> Int4Weight:
    """Round a float weight [N, K] to int4 groups spanning each group's [min, max]."""
    n, k = weight.shape
    if k % group_size:
        raise FrspecError(f"int4 groups of {group_size} need a multiple of {group_size} input columns, got {k}")
    w = weight.detach().float().view(n, k // group_size, group_size)
    lo, hi = w.amin(-1), w.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=torch.finfo(torch.float32).tiny)
    codes = torch.round((w - lo[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.uint8)
    return Int4Weight(codes.view(n, k), scale, lo, group_size)


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Round a float weight [N, K] to int8 with one symmetric scale per row."""
    w = weight.detach().float()
    scale = (w.abs().amax(-1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
    values = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return Int8Weight(values, scale)


class Int4Linear(nn.Module):
    """y = x W^T + b with W in int4 groups, on the device's int4 kernel (quant_kernels.int4_kernel)."""

    def __init__(self, weight: Int4Weight, bias: torch.Tensor | None, dtype: torch.dtype, device: torch.device):
        super().__init__()
        device = torch.device(device)
        self.out_features, self.in_features = weight.codes.shape
        self.group_size = weight.group_size
        self.kernel = K.int4_kernel(device.type, dtype, self.in_features, self.group_size)
        self.register_buffer("bias", None if bias is None else bias.detach().to(device, dtype), persistent=False)
        if self.kernel == K.DEQUANT:
            self.register_buffer("dequantized", weight.dequantize().to(device, dtype), persistent=False)
            return
        codes, scale, minimum = weight.codes, weight.scale, weight.minimum
        if self.kernel == K.CPU_INT4 and self.out_features % K.CPU_INT4_ROW_MULTIPLE:
            pad = -self.out_features % K.CPU_INT4_ROW_MULTIPLE  # zero rows, cut off again after the matmul
            codes = torch.cat([codes, codes.new_zeros(pad, self.in_features)])
            scale = torch.cat([scale, scale.new_zeros(pad, scale.shape[1])])
            minimum = torch.cat([minimum, minimum.new_zeros(pad, minimum.shape[1])])
        pack = K.pack_int4_cpu if self.kernel == K.CPU_INT4 else K.pack_int4_cuda
        self.register_buffer("packed", pack(codes.to(device)), persistent=False)
        self.register_buffer("scales_and_zeros", K.scales_and_zeros(scale, minimum, dtype).to(device),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == K.DEQUANT:
            return wide_linear.linear(x, self.dequantized, self.bias)
        x2d = x.reshape(-1, self.in_features).contiguous()
        if self.kernel == K.CPU_INT4 and int4_dequantizes(x2d):
            # A prefill: the float GEMM over the weight dequantized for this call, straight to fp32 where the call
            # widens to fp32 anyway (models/wide_linear.py).
            dtype = torch.float32 if wide_linear.is_wide(x2d) else x2d.dtype
            y = wide_linear.linear(x2d, self._dequantized(dtype, x2d))
        else:
            y = K.int4_mm(self.kernel, x2d, self.packed, self.group_size, self.scales_and_zeros)
        if y.shape[-1] != self.out_features:
            y = y[:, : self.out_features]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def _dequantized(self, dtype: torch.dtype, x: torch.Tensor) -> torch.Tensor:
        """The CPU packing's weight (padding rows included) in `dtype`, as the kernel computes it, (code - 8) * scale
        + zero per group with its scale and zero in the activations' dtype, for one call with input `x`: in the
        reused buffer where autograd keeps no reference (models/call_weight.py). In blocks of DEQUANT_BLOCK_ROWS
        rows, whose temporaries stay small. In a half dtype one fused multiply-add rounded once (no fp32 copy); in
        fp32 (a call that widens, or an fp32 model) code * scale + (zero - 8 * scale) in place, two passes over the
        block instead of addcmul's broadcast over groups, which ran 5x slower on the AVX2 EPYC."""
        rows = int(self.packed.shape[0])
        out = call_weight((rows, self.in_features // self.group_size, self.group_size), dtype, x)
        for start in range(0, rows, DEQUANT_BLOCK_ROWS):
            end = min(start + DEQUANT_BLOCK_ROWS, rows)
            codes = K.unpack_int4_cpu(self.packed[start:end], self.in_features).view(end - start, -1, self.group_size)
            scale = self.scales_and_zeros[:, start:end, 0].t().to(dtype).contiguous()[..., None]
            zero = self.scales_and_zeros[:, start:end, 1].t().to(dtype).contiguous()[..., None]
            if dtype == torch.float32:
                out[start:end].copy_(codes).mul_(scale).add_(zero - 8 * scale)
            else:
                torch.addcmul(zero, codes.to(dtype).sub_(8), scale, out=out[start:end])  # -8..7: exact in any dtype
        return out.view(rows, self.in_features)

    def _unpacked(self) -> Int4Weight:
        """The weight the CPU packing holds (padding rows included), back as codes, scale and minimum: the kernels'
        zero is minimum + 8 * scale (quant_kernels.scales_and_zeros)."""
        scale, zero = self.scales_and_zeros[..., 0].t().float(), self.scales_and_zeros[..., 1].t().float()
        return Int4Weight(K.unpack_int4_cpu(self.packed, self.in_features), scale, zero - 8 * scale, self.group_size)

    def first_rows(self, k: int) -> Int4Linear:
        """A layer computing this one's first k outputs from the same packed weight: a view of its codes, nothing
        re-packed. The kernel reads the (scale, zero) table as contiguous, so the first k rows' part of it is copied
        (1/16 of the codes' bytes at group 32). The CPU layout stores rows in blocks (cpu_int4_row_block): the view
        covers k rounded up to a block and the output is cut to k, as for the padded rows."""
        k = _check_first_rows(k, self.out_features)
        layer = _sharing(self, out_features=k)
        if self.kernel == K.DEQUANT:
            layer.register_buffer("dequantized", self.dequantized[:k], persistent=False)
        else:
            block = K.cpu_int4_row_block() if self.kernel == K.CPU_INT4 else None
            if block is None:
                raise FrspecError(f"the {self.kernel} int4 layout cannot be cut to its first rows: a packed head "
                                  "here has one size (give a map size, not auto)")
            rows = min(-(-k // block) * block, int(self.packed.shape[0]))
            layer.register_buffer("packed", self.packed[:rows], persistent=False)
            layer.register_buffer("scales_and_zeros", self.scales_and_zeros[:, :rows].contiguous(), persistent=False)
        layer.register_buffer("bias", None if self.bias is None else self.bias[:k], persistent=False)
        return layer

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}, "
                f"kernel={self.kernel}, bias={self.bias is not None}")


class Int8Linear(nn.Module):
    """y = x W^T + b with W int8 per output channel, on `_weight_int8pack_mm` where the device has it."""

    def __init__(self, weight: Int8Weight, bias: torch.Tensor | None, dtype: torch.dtype, device: torch.device):
        super().__init__()
        device = torch.device(device)
        self.out_features, self.in_features = weight.values.shape
        self.kernel = K.int8_kernel(device.type, dtype)
        self.register_buffer("bias", None if bias is None else bias.detach().to(device, dtype), persistent=False)
        self.register_buffer("values", K.aligned(weight.values.to(device)), persistent=False)
        self.register_buffer("scale", K.aligned(weight.scale.to(device, dtype)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == K.DEQUANT or x.numel() >= K.INT8_DEQUANT_ROWS * self.in_features:
            # No weight-only int8 kernel on this device, or a prefill (quant_kernels.INT8_DEQUANT_ROWS): dequantize
            # per call, straight to fp32 where the call widens anyway (int8 values are exact in either), into the
            # reused buffer (models/call_weight.py).
            dtype = torch.float32 if wide_linear.is_wide(x) else x.dtype
            y = wide_linear.linear(x, call_weight(tuple(self.values.shape), dtype, x).copy_(self.values)) * self.scale
        else:
            x2d = x.reshape(-1, self.in_features).contiguous()
            y = K.int8_mm(x2d, self.values, self.scale).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def first_rows(self, k: int) -> Int8Linear:
        """A layer computing this one's first k outputs: views of its first k rows and scales (rows are stored one
        after another, so any k works and nothing is copied)."""
        k = _check_first_rows(k, self.out_features)
        layer = _sharing(self, out_features=k)
        layer.register_buffer("values", self.values[:k], persistent=False)
        layer.register_buffer("scale", self.scale[:k], persistent=False)
        layer.register_buffer("bias", None if self.bias is None else self.bias[:k], persistent=False)
        return layer

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel}, "
                f"bias={self.bias is not None}")


QuantizedLinear = (Int4Linear, Int8Linear)


def _check_first_rows(k: int, out_features: int) -> int:
    if isinstance(k, bool) or int(k) != k or not 1 <= int(k) <= out_features:
        raise FrspecError(f"a layer's first rows: k must be an integer in [1, {out_features}], got {k!r}")
    return int(k)


def _sharing(layer: nn.Module, **changes) -> nn.Module:
    """A new module of `layer`'s class with its plain attributes (kernel, sizes) and `changes`, no buffers yet: the
    caller registers views of `layer`'s."""
    new = type(layer).__new__(type(layer))
    nn.Module.__init__(new)
    for name, value in vars(layer).items():
        if not name.startswith("_") and name != "training":
            setattr(new, name, value)
    for name, value in changes.items():
        setattr(new, name, value)
    return new


def quantized_linear(weight: Int4Weight | Int8Weight, bias, dtype, device) -> nn.Module:
    """The module for already-quantized weights (from a GGUF's blocks or the cache)."""
    cls = Int4Linear if isinstance(weight, Int4Weight) else Int8Linear
    return cls(weight, bias, dtype, device)


def quantize_weight(weight: torch.Tensor, quant: str, group_size: int = DEFAULT_GROUP_SIZE):
    """int4 groups, or int8 per channel. A layer whose width is not a multiple of the group takes int8: int4 groups
    cannot cover it, and the precision only goes up."""
    if quant == "int4" and weight.shape[1] % group_size == 0:
        return quantize_int4(weight, group_size)
    return quantize_int8(weight)


def quantize_linear(linear: nn.Linear, quant: str, group_size: int = DEFAULT_GROUP_SIZE) -> nn.Module:
    w = linear.weight
    return quantized_linear(quantize_weight(w, quant, group_size), linear.bias, w.dtype, w.device)


def linear_names(model: nn.Module, head: bool = True) -> list[str]:
    """Qualified names of the model's nn.Linear modules; the output embedding (LM head) last, or left out."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and m is not out]
    if head and isinstance(out, nn.Linear):
        names += [n for n, m in model.named_modules() if m is out][:1]
    return names


def set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def quantize_model(
    model: nn.Module,
    quant: str | None,
    group_size: int = DEFAULT_GROUP_SIZE,
    head: bool = True,
    weights: dict[str, Int4Weight | Int8Weight] | None = None,
) -> nn.Module:
    """Replace every nn.Linear of `model` (attention, MLP and, with `head`, the LM head) by its quantized version.

    `weights` gives already-quantized weights by module name (a GGUF's converted blocks); the others are
    quantized from their float values. Embeddings and norms keep their float dtype. Returns `model`.
    A draft model keeps its head float (head=False) when a drafter still has to select FR-Spec rows from it;
    `quantize_head` then quantizes the drafter's head.
    """
    quant = parse_quant(quant)
    if quant is None:
        return model
    weights = weights or {}
    for name in linear_names(model, head):
        linear = model.get_submodule(name)
        if name in weights:
            w = linear.weight
            module = quantized_linear(weights[name], linear.bias, w.dtype, w.device)
        else:
            module = quantize_linear(linear, quant, group_size)
        set_submodule(model, name, module)
    slow = [m for m in model.modules() if isinstance(m, Int8Linear) and m.kernel == K.DEQUANT]
    if slow:
        # Said, not refused: int8 still halves the weights' memory. But every call dequantizes its weight, which on
        # an H200 made a 248k-row head 8.5x slower than bf16 (docs/head-costs.md).
        log.warning("int8 on %s has no weight-only kernel: %d layers dequantize their weights at every call, slower "
                    "than bf16 (int4 or bf16 are faster there)", slow[0].values.device.type, len(slow))
    model.frspec_quant = quant  # how the model was loaded, for reports
    return model


def quantize_head(head: nn.Module, quant: str | None, group_size: int = DEFAULT_GROUP_SIZE) -> nn.Module:
    """A drafter's LM head, quantized: an nn.Linear (a full head) is returned quantized; a DraftVocab (FR-Spec's
    pruned head: its `.head` is an nn.Linear over the kept rows) has that head quantized in place and is returned.
    The kept rows are a copy, so the source head (and a tied embedding) stays intact."""
    quant = parse_quant(quant)
    if quant is None or isinstance(head, QuantizedLinear):
        return head
    if isinstance(head, nn.Linear):
        return quantize_linear(head, quant, group_size)
    if isinstance(head, DraftVocab):
        head.quantize_head(lambda linear: quantize_linear(linear, quant, group_size))
        return head
    raise FrspecError(f"cannot quantize an LM head of type {type(head).__name__}")
