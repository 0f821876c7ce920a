"""Which PyTorch weight-only kernel runs a quantized matmul on which device, and the weight layout each one needs.

PyTorch ships two int4 kernels with different packed layouts, and one int8 kernel:

    CPU   int4  torch._weight_int4pack_mm_for_cpu   packed by _convert_weight_to_int4pack_for_cpu (int32 codes)
          int8  torch._weight_int8pack_mm           plain int8 [N, K] and one scale per row
    CUDA  int4  torch._weight_int4pack_mm           packed by _convert_weight_to_int4pack (uint8 nibble pairs),
                                                    bf16 activations only (tinygemm)
          int8  no weight-only kernel in ATen: the weight is dequantized per call (saves memory, not time)

Both int4 kernels compute w = (code - 8) * scale + zero per group of `group_size` input columns, from a
[K / group_size, N, 2] tensor of (scale, zero) in the activation dtype. Anything a kernel cannot take (a device or
dtype it lacks, shapes it refuses) falls back to a dequantized weight and F.linear: slower, never wrong.

The CUDA paths were written from PyTorch's documented layouts; tests/cuda checks them on a device (they passed on
an H200, docs/head-costs.md), the dispatch logic is tested on the CPU too. int8 on CUDA costs time: the 248k x 5120
head took 5.6 ms against bf16's 0.66 there.
"""

from __future__ import annotations

from functools import cache

import torch

INT4_GROUP_SIZES = (32, 64, 128, 256)  # what both int4 kernels accept
CPU_INT4_ROW_MULTIPLE = 16  # _convert_weight_to_int4pack_for_cpu packs rows in blocks of 16
CPU_ACT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

CPU_INT4 = "cpu-int4pack"
CUDA_INT4 = "cuda-int4pack"
INT8 = "int8pack"
DEQUANT = "dequantized"


def has_kernel(op: str, device_type: str) -> bool:
    """Whether this torch build registers an implementation of aten::`op` for `device_type` ("cpu", "cuda")."""
    key = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS", "xpu": "XPU"}.get(device_type)
    if key is None or not hasattr(torch.ops.aten, op):
        return False
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", key)


def int4_kernel(device_type: str, dtype: torch.dtype, in_features: int, group_size: int,
                available=has_kernel) -> str:
    """The int4 path for a [*, in_features] x int4 [N, in_features] matmul: CPU_INT4, CUDA_INT4 or DEQUANT.

    `available(op, device_type)` is injectable so the CUDA branch can be tested on a CPU-only machine.
    """
    if group_size not in INT4_GROUP_SIZES or in_features % group_size:
        return DEQUANT
    if device_type == "cpu" and dtype in CPU_ACT_DTYPES and available("_weight_int4pack_mm_for_cpu", "cpu"):
        return CPU_INT4
    if (
        device_type == "cuda"
        and dtype == torch.bfloat16
        and cuda_inner_k_tiles(in_features) is not None
        and available("_weight_int4pack_mm", "cuda")
    ):
        return CUDA_INT4
    return DEQUANT


def int8_kernel(device_type: str, dtype: torch.dtype, available=has_kernel) -> str:
    """INT8 where this build has `_weight_int8pack_mm` for the device (CPU; not CUDA in 2.13), else DEQUANT."""
    if dtype in CPU_ACT_DTYPES and available("_weight_int8pack_mm", device_type):
        return INT8
    return DEQUANT


def cuda_inner_k_tiles(in_features: int) -> int | None:
    """tinygemm's innerKTiles for K input columns: the largest of 8, 4, 2 with K % (16 * tiles) == 0."""
    for tiles in (8, 4, 2):
        if in_features % (16 * tiles) == 0:
            return tiles
    return None


def scales_and_zeros(scale: torch.Tensor, minimum: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The kernels' [K / g, N, 2] (scale, zero) tensor for groups dequantized as code * scale + minimum.

    The kernels subtract 8 from each code, so their zero is minimum + 8 * scale.
    """
    zero = minimum.float() + 8 * scale.float()
    return torch.stack([scale.float().t(), zero.t()], dim=-1).to(dtype).contiguous()


def pack_int4_cpu(codes: torch.Tensor) -> torch.Tensor:
    """CPU layout of int4 codes [N, K] (0..15, N a multiple of 16)."""
    return torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)


# From this many rows on (a prompt's prefill, a drafter's window of it), a quantized matmul dequantizes its weight and
# runs the float GEMM: the weight-only kernels are built for a few rows and their cost grows with them, while
# dequantizing costs a fixed time per weight. int4: unpacking the packing (`unpack_int4_cpu`) and one fused
# multiply-add, 6 ms per 4864 x 896 weight and 19 ms per 8960 x 1536 on the AVX-512 EPYC (from 28 and 90 ms with the
# general gather), so the dequantized GEMM wins from about 200-256 rows there (scripts/quant_prefill.py,
# docs/quantization.md "Prefill"); int8: a cast, ~4 ms, from 128 rows (the 2-core Xeon). Where this machine's half
# GEMM is slow and wide calls go through fp32 (the AVX2 EPYC: models/wide_linear.py), int4 dequantizes straight to
# fp32 into a reused buffer (models/call_weight.py), and whole int4 prefills there run faster dequantized from about
# 100 rows (the 1.5B target) and 140 (the 0.5B drafter): 128 (scripts/quant_prefill.py --model, docs/quantization.md).
# All stay above the rows a decode step verifies.
INT4_DEQUANT_ROWS = 256
INT4_DEQUANT_ROWS_WIDENED = 128
INT8_DEQUANT_ROWS = 128


def nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Each byte of a uint8 tensor as its two 4-bit halves, low then high, along a new last dim."""
    return torch.stack([packed & 15, packed >> 4], dim=-1)


@cache
def _cpu_int4_gather(rows: int, in_features: int) -> torch.Tensor:
    """For a [rows, in_features] weight packed by pack_int4_cpu: for each code, in row-major order, the position of
    its nibble among the packing's nibbles (`nibbles` order). Found by packing the row and column numbers
    themselves, 4 bits at a time, since the layout is the build's, not a documented one."""
    n = torch.arange(rows, dtype=torch.int32)[:, None].expand(rows, in_features)
    k = torch.arange(in_features, dtype=torch.int32)[None, :].expand(rows, in_features)
    source = torch.zeros(rows * in_features, dtype=torch.long)  # nibble i holds the code at flat position source[i]
    for index, scale in ((n, in_features), (k, 1)):
        for shift in range(0, max(int(index.max()).bit_length(), 1), 4):
            part = nibbles(pack_int4_cpu(((index >> shift) & 15).contiguous())).flatten().to(torch.long)
            source += (part << shift) * scale
    return torch.argsort(source)


def unpack_int4_cpu(packed: torch.Tensor, in_features: int) -> torch.Tensor:
    """The int4 codes [N, in_features] (uint8, 0..15) a pack_int4_cpu packing holds (N: its rows, padding
    included): its blocks of cpu_int4_row_block rows, then a last, shorter one. Full blocks are read as
    `_unpack_split_halves` does where that is this build's layout (`cpu_int4_split_halves`), else, like a last
    shorter block, gathered by the positions `_cpu_int4_gather` found for its size."""
    block = cpu_int4_row_block()
    if block is None:
        raise RuntimeError("the CPU int4 layout has no row block: it cannot be unpacked")
    rows = int(packed.shape[0])
    full = rows // block * block
    parts = []
    for start, end in ((0, full), (full, rows)):
        if end > start:
            size = min(block, end - start)
            if size == block and cpu_int4_split_halves():
                parts.append(_unpack_split_halves(packed[start:end], in_features, block))
                continue
            order = _cpu_int4_gather(size, in_features).to(packed.device)
            flat = nibbles(packed[start:end]).reshape(-1, size * in_features)
            parts.append(flat.index_select(1, order).view(end - start, in_features))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _unpack_split_halves(packed: torch.Tensor, in_features: int, block: int) -> torch.Tensor:
    """Codes [N, in_features] of full blocks of `block` rows packed as the AVX-512 and AVX2 builds measured do: in
    each block, byte (k, n) holds row n's code at column k in its low nibble and row n + block / 2's in its high
    one. A reshape and one transposing copy, where the general gather indexes every nibble: 4.5x faster on a
    4864 x 896 weight (the 0.5B drafter's MLP), which makes a prefill's dequantized GEMM pay from fewer rows."""
    blocks = packed.view(-1, in_features, block // 2)  # [blocks, column, row within the half]
    halves = torch.stack([blocks & 15, blocks >> 4], dim=1)  # [blocks, half, column, row]
    return halves.transpose(2, 3).reshape(-1, in_features)


@cache
def cpu_int4_split_halves() -> bool:
    """Whether this build's CPU int4 layout is the one `_unpack_split_halves` reads: checked once per process by
    packing random codes and reading them back (the layout is the build's, not a documented one)."""
    block = cpu_int4_row_block()
    if block is None or block % 2:
        return False
    codes = torch.randint(0, 16, (2 * block, 96), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    try:
        return torch.equal(_unpack_split_halves(pack_int4_cpu(codes), 96, block), codes.to(torch.uint8))
    except RuntimeError:  # a packing of another shape than [rows, in_features / 2] bytes
        return False


@cache
def cpu_int4_row_block() -> int | None:
    """Rows per block of the CPU int4 layout, or None when no block size works: for k a multiple of it, the first k
    rows of a packed weight are exactly the packing of the weight's first k rows (so one packed head serves every
    such k, models/quant.py `first_rows`). The layout is the build's (64 rows on the AVX-512 and AVX2 builds
    measured), not a documented constant, so it is found once per process by packing both ways."""
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (256, 64), generator=gen, dtype=torch.int32)
    whole = pack_int4_cpu(codes)
    for block in (16, 32, 64, 128):
        if all(torch.equal(pack_int4_cpu(codes[:m]), whole[:m]) for m in range(block, 256, block)):
            return block
    return None


def pack_int4_cuda(codes: torch.Tensor) -> torch.Tensor:
    """CUDA (tinygemm) layout of int4 codes [N, K] on a CUDA device: nibble pairs (even << 4 | odd), then packed."""
    codes = codes.to(torch.int32)
    pairs = ((codes[:, ::2] << 4) | codes[:, 1::2]).to(torch.uint8).contiguous()
    return torch._convert_weight_to_int4pack(pairs, cuda_inner_k_tiles(codes.shape[1]))


KERNEL_ALIGNMENT = 64  # bytes: one AVX-512 vector, what torch's own CPU allocator guarantees


def aligned(t: torch.Tensor) -> torch.Tensor:
    """`t`, copied if its data does not start on a KERNEL_ALIGNMENT boundary.

    `_weight_int8pack_mm`'s CPU kernel segfaults on a weight at an unaligned address for prompts of ~100+ rows (seen
    with the cached 1.5B model, whose int8 matrices are slices of the safetensors file buffer at offsets like 792
    mod 4096); a tensor torch allocated itself is always aligned.
    """
    t = t.contiguous()
    return t if t.data_ptr() % KERNEL_ALIGNMENT == 0 else t.clone()


def int4_mm(kernel: str, x2d: torch.Tensor, packed: torch.Tensor, group_size: int, sz: torch.Tensor) -> torch.Tensor:
    if kernel == CPU_INT4:
        return torch._weight_int4pack_mm_for_cpu(x2d, packed, group_size, sz)
    return torch._weight_int4pack_mm(x2d, packed, group_size, sz)


def int8_mm(x2d: torch.Tensor, values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch._weight_int8pack_mm(x2d, values, scale)
