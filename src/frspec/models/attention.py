"""Attention masks in the form HF attention takes, and which attention implementations can apply them.

A token tree replaces a model's causal mask with an arbitrary one (each node sees the committed prefix and its own
ancestors). Only implementations that add a 4D float mask to the attention scores apply such a mask as given;
flash-attention and friends build their own causal or varlen masks and would silently attend to the wrong tokens.
"""

from __future__ import annotations

import torch

from frspec.errors import FrspecError

# Attention implementations that apply an arbitrary additive 4D float mask exactly as given.
ARBITRARY_MASK_ATTENTION = ("eager", "sdpa")


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Turn a bool [q, kv] visibility matrix into the 4D additive float mask HF attention takes (0 or -inf)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed.to(device=mask.device), float("-inf"))
    return mask[None, None]


def causal_mask(q_len: int, past_len: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """The ordinary causal mask [1, 1, q_len, past_len + q_len] for q_len new tokens after past_len cached ones."""
    allowed = torch.ones(q_len, past_len + q_len, dtype=torch.bool).tril(diagonal=past_len)
    return additive_mask(allowed, dtype=dtype, device=device)


def check_arbitrary_masks(config, what: str = "the model") -> None:
    """Refuse models whose layers cannot all take an arbitrary 4D mask: non-full attention layers (sliding window,
    linear attention), whose caches and masks are not the tree's, and attention implementations other than
    eager/sdpa (ARBITRARY_MASK_ATTENTION), which do not apply a given mask."""
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        other = sorted(kinds - {"full_attention"})
        raise FrspecError(f"token trees need full attention in every layer, but {what} has {', '.join(other)} layers")
    impl = getattr(config, "_attn_implementation", None)
    if impl is not None and impl not in ARBITRARY_MASK_ATTENTION:
        raise FrspecError(
            f"token trees need an attention implementation that applies a 4D mask ({', '.join(ARBITRARY_MASK_ATTENTION)}),"
            f" but {what} uses {impl!r}: load it with attn_implementation='sdpa'"
        )
