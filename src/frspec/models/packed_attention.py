"""Grouped-query attention over a few query rows on CPU, with the heads that share a key/value head packed into
query rows of that head.

transformers' SDPA path (`integrations/sdpa_attention.py`) hands a decode step's one query, which has no mask, to
PyTorch's SDPA with `enable_gqa=True`. It hands a step of a few rows with a mask (verifying a draft, a token tree) to
`repeat_kv`, which copies every cached key and value once per query head. On CPU both are slow for a few rows against
a long cache. PyTorch's flash kernel then runs a one-row query per head, reading the whole cache each time.

Packed, the `g` query heads that share a key/value head become `g * q` query rows of that head: [B, H, q, D] turns
into [B, H / g, g * q, D], and a mask shared by the heads is repeated g times along its rows. The kernel reads each
cached key and value once per group. Every score is the same dot product as before, so the result is the same
attention up to summation order inside the kernel, and the target alone and its verifier both run it.

Measured on the AVX2-only EPYC (`scripts/packed_attention.py`, 12 query heads on 2 key/value heads, head dim 128, as
in the 1.5B target; docs/quantization.md), ms per layer against 1,300 cached tokens:
- one bf16 row: 2.57 ms, packed 0.27 ms;
- two rows: 1.72 ms, packed 0.37 ms;
- 64 rows: 8.57 ms, packed 4.89 ms;
- fp32 gains 1.5-6x there, and at least 1.2x everywhere but one row over 64 tokens (0.04 ms either way).
The int4 target's decode step at 1,300 tokens of context spent 90 of its 301 ms in attention
(`scripts/profile_decode.py`). Beyond `PACKED_ROWS` rows (a prefill), transformers' own path runs: there the kernel
already has rows to share.

`load_model` switches a CPU model on `sdpa` to this path (`use_packed_attention`), under its own name, which
transformers' attention and mask registries map to this function and to `sdpa`'s masks. `FRSPEC_PACKED_ATTENTION=0`
keeps transformers' path (an A/B of the two).
"""

from __future__ import annotations

import os

import torch
from torch.nn import functional as F

# The name a model's config carries for this path (registered with transformers on first use).
PACKED_SDPA = "frspec_packed_sdpa"
# Query rows up to which a call is packed: decode steps, drafts verified, token trees. A prefill has its own rows.
PACKED_ROWS = 64
ENV = "FRSPEC_PACKED_ATTENTION"


def packed_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [B, H, q, D], key/value [B, H_kv, kv, D(v)], the mask
    [B, 1, q, kv] (additive or bool) or None; returns the output [B, q, H, Dv] and no weights. Calls this cannot pack
    go to transformers' `sdpa_attention_forward` unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    rows = query.shape[2]
    packable = (
        query.device.type == "cpu"
        and groups > 1
        and rows <= PACKED_ROWS
        and dropout == 0.0
        # A query of several rows without a mask would be causal in SDPA's top-left sense: transformers decides that.
        and (attention_mask is not None or rows == 1)
        # A mask shared by the heads, with a row per query (not one broadcast over them), as the rows it repeats.
        and (attention_mask is None or (attention_mask.shape[1] == 1 and attention_mask.shape[2] == rows))
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
        and not kwargs.get("output_attentions", False)
    )
    if not packable:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    batch, heads, _, _ = query.shape
    kv_heads = key.shape[1]
    packed = query.reshape(batch, kv_heads, groups * rows, query.shape[-1])  # row r * q + i: head r's query i
    mask = None if attention_mask is None else attention_mask.repeat(1, 1, groups, 1)
    out = F.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, rows, value.shape[-1]).transpose(1, 2).contiguous(), None


def use_packed_attention(model: torch.nn.Module) -> bool:
    """Switch a CPU model whose attention is `sdpa` to the packed path; returns whether it did. Other models (eager,
    flash, an accelerator) are left as they are, and every model where `FRSPEC_PACKED_ATTENTION=0`."""
    if os.environ.get(ENV, "").strip() == "0":
        return False
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if any(p.device.type != "cpu" for p in model.parameters()):
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PACKED_SDPA, packed_sdpa_forward)
    AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)
    model.set_attn_implementation(PACKED_SDPA)
    return True
