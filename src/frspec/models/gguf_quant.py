"""GGUF tensors as frspec's int4/int8 weights, converting 4-bit blocks directly instead of dequantize + requantize.

A Q4_K super-block of 256 weights holds 8 sub-blocks of 32, each with 4-bit codes q, a 6-bit scale sc and a 6-bit
minimum m under the super-block's fp16 d and dmin: w = d*sc * q - dmin*m. That is one asymmetric int4 group of 32
(scale d*sc, minimum -dmin*m), so the codes are kept as they are and only the per-group scale and minimum are
computed: the int4 weight is the GGUF's own values, not a second rounding of them. Q4_0 (w = d*(q-8)) and Q4_1
(w = d*q + m) are groups of 32 too and convert the same way.

Everything else is dequantized with the `gguf` package's own code and quantized afresh:
- int4 mode: Q5_0/Q5_1/Q6_K/Q8_0 (and float) matrices are re-rounded to int4 groups of 32. These carry more than 4
  bits (llama.cpp's Q4_K_M keeps attn_v, half the ffn_down and the output head at Q6_K; the 0.5B file is mostly
  Q5_0, its rows being 896 wide, not a multiple of 256), so this loses what the extra bits held; the alternative,
  int8 for them, doubles their bytes and costs a 4-bit model much of its speed. Fidelity is measured, not assumed:
  scripts/quant_fidelity.py.
- int8 mode: every matrix, Q4_K included, becomes int8 per output channel. Q8_0 is not exact either: its scale is
  per block of 32, int8's per row.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from frspec.models.quant import DEFAULT_GROUP_SIZE, Int4Weight, Int8Weight, quantize_weight

# llama.cpp's tensor names inside block i -> the Hugging Face module name (Llama/Qwen2-family layouts).
BLOCK_LINEARS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
HEAD = "lm_head"
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")


def hf_linear_name(gguf_name: str) -> str | None:
    """The HF module a GGUF matrix belongs to ("blk.3.ffn_up.weight" -> "model.layers.3.mlp.up_proj"), or None."""
    if gguf_name == "output.weight":
        return HEAD
    match = _BLOCK.match(gguf_name)
    if match and match.group(2) in BLOCK_LINEARS:
        return f"model.layers.{match.group(1)}.{BLOCK_LINEARS[match.group(2)]}"
    return None


def _nibbles(qs: np.ndarray, n_blocks: int) -> np.ndarray:
    """gguf's Q4_K code layout: each 32 bytes hold two sub-blocks of 32, the first in the low nibbles."""
    q = qs.reshape(n_blocks, -1, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(0x0F)).reshape(n_blocks, -1)


def int4_from_q4_k(blocks: np.ndarray, n: int, k: int) -> Int4Weight:
    """Q4_K blocks of an [n, k] matrix (uint8, 144 bytes per 256 weights) as int4 groups of 32, exactly."""
    from gguf.quants import Q4_K

    b = np.ascontiguousarray(blocks).reshape(-1, 144)
    d = b[:, 0:2].view(np.float16).astype(np.float32)
    dmin = b[:, 2:4].view(np.float16).astype(np.float32)
    sc, m = Q4_K.get_scale_min(b[:, 4:16])
    codes = _nibbles(b[:, 16:], b.shape[0])
    scale = d * sc.astype(np.float32)
    minimum = -(dmin * m.astype(np.float32))
    return _int4(codes, scale, minimum, n, k)


def _int4_from_32_blocks(blocks: np.ndarray, n: int, k: int, with_min: bool) -> Int4Weight:
    """Q4_0 (2-byte d, 16 bytes of codes: w = d*(q-8)) or Q4_1 (d, m, codes: w = d*q + m)."""
    width = 20 if with_min else 18
    b = np.ascontiguousarray(blocks).reshape(-1, width)
    d = b[:, 0:2].view(np.float16).astype(np.float32)
    minimum = b[:, 2:4].view(np.float16).astype(np.float32) if with_min else -8 * d
    codes = b[:, width - 16 :].reshape(-1, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)
    codes = (codes & np.uint8(0x0F)).reshape(b.shape[0], 32)
    return _int4(codes, d, minimum, n, k)


def _int4(codes: np.ndarray, scale: np.ndarray, minimum: np.ndarray, n: int, k: int) -> Int4Weight:
    groups = k // 32
    return Int4Weight(
        codes=torch.from_numpy(np.ascontiguousarray(codes.reshape(n, k))),
        scale=torch.from_numpy(np.ascontiguousarray(scale.reshape(n, groups))),
        minimum=torch.from_numpy(np.ascontiguousarray(minimum.reshape(n, groups))),
        group_size=32,
    )


def exact_int4_types():
    from gguf import GGMLQuantizationType as T

    return {T.Q4_K: int4_from_q4_k,
            T.Q4_0: lambda b, n, k: _int4_from_32_blocks(b, n, k, with_min=False),
            T.Q4_1: lambda b, n, k: _int4_from_32_blocks(b, n, k, with_min=True)}


def convert_tensor(tensor, quant: str, group_size: int = DEFAULT_GROUP_SIZE) -> tuple[Int4Weight | Int8Weight, bool]:
    """A GGUF reader tensor of a matrix [n, k] as int4/int8 weights; True when the conversion kept its exact
    values (4-bit blocks into int4 groups of 32)."""
    from gguf.quants import dequantize

    k, n = (int(x) for x in tensor.shape)  # GGUF lists dimensions innermost first
    exact = exact_int4_types().get(tensor.tensor_type)
    if quant == "int4" and exact is not None and group_size == 32:
        return exact(np.asarray(tensor.data), n, k), True
    values = dequantize(np.asarray(tensor.data), tensor.tensor_type).reshape(n, k)
    return quantize_weight(torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)), quant, group_size), False


def read_gguf_linears(gguf_path, quant: str, group_size: int = DEFAULT_GROUP_SIZE, tied_head: bool = False):
    """{HF module name: weights} for every linear matrix of a GGUF, and the names converted exactly.

    With `tied_head` (a model whose LM head is its input embedding) and no `output.weight` in the file, the head
    is converted from `token_embd.weight`, as llama.cpp itself uses it.
    """
    from gguf import GGUFReader

    reader = GGUFReader(gguf_path)
    tensors = {t.name: t for t in reader.tensors}
    weights, exact = {}, set()
    sources = [(hf_linear_name(name), t) for name, t in tensors.items()]
    if tied_head and "output.weight" not in tensors and "token_embd.weight" in tensors:
        sources.append((HEAD, tensors["token_embd.weight"]))
    for hf_name, tensor in sources:
        if hf_name is None:
            continue
        weights[hf_name], is_exact = convert_tensor(tensor, quant, group_size)
        if is_exact:
            exact.add(hf_name)
    return weights, exact
