"""Attention masks in the form HF attention takes, and which attention implementations can apply them.

A token tree replaces a model's causal mask with an arbitrary one (each node sees the committed prefix and its own
ancestors). Only implementations that add a 4D float mask to the attention scores apply such a mask as given;
flash-attention and friends build their own causal or varlen masks and would silently attend to the wrong tokens.

Sliding-window layers (Gemma 2/3) take a mask of their own (`layer_masks`): the tree's visibility restricted to the
keys less than a window behind the query's position, over the keys their cache layer actually hands attention
(a DynamicSlidingWindowLayer keeps only its last window - 1 entries, not the whole prefix).
"""

from __future__ import annotations

import torch

from frspec.errors import FrspecError
from frspec.models.packed_attention import PACKED_SDPA

# Attention implementations that apply an arbitrary additive 4D float mask exactly as given.
ARBITRARY_MASK_ATTENTION = ("eager", "sdpa", PACKED_SDPA)
# Layer kinds a tree mask can be given to: full attention, and sliding windows through their own mask (layer_masks).
TREE_LAYER_KINDS = {"full_attention", "sliding_attention"}


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Turn a bool [q, kv] visibility matrix into the 4D additive float mask HF attention takes (0 or -inf)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed.to(device=mask.device), float("-inf"))
    return mask[None, None]


def causal_mask(q_len: int, past_len: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """The ordinary causal mask [1, 1, q_len, past_len + q_len] for q_len new tokens after past_len cached ones."""
    allowed = torch.ones(q_len, past_len + q_len, dtype=torch.bool).tril(diagonal=past_len)
    return additive_mask(allowed, dtype=dtype, device=device)


def _text_config(config):
    """The decoder's own config (a multimodal model's text config holds its layer types)."""
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if get is not None else config


def check_arbitrary_masks(config, what: str = "the model") -> None:
    """Refuse models whose layers cannot all take an arbitrary 4D mask: non-full attention layers (sliding window,
    linear attention), whose caches and masks are not the tree's, and attention implementations other than
    eager, sdpa and sdpa with packed heads (ARBITRARY_MASK_ATTENTION), which do not apply a given mask."""
    config = _text_config(config)
    if getattr(config, "layer_types", None) is None and getattr(config, "sliding_window", None) is not None:
        # Mistral-style: a window on every layer, applied through the causal mask a given tree mask replaces.
        raise FrspecError(f"token trees need per-layer attention types, but {what} applies a sliding window to every "
                          "layer without naming them (layer_types)")
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if not kinds <= TREE_LAYER_KINDS:
        other = sorted(kinds - TREE_LAYER_KINDS)
        raise FrspecError(f"token trees need full or sliding-window attention in every layer, but {what} has "
                          f"{', '.join(other)} layers")
    check_mask_implementation(config, what)


def check_mask_implementation(config, what: str = "the model") -> None:
    """Refuse a `config` whose attention implementation does not apply a given 4D mask (ARBITRARY_MASK_ATTENTION)."""
    impl = getattr(config, "_attn_implementation", None)
    if impl is not None and impl not in ARBITRARY_MASK_ATTENTION:
        raise FrspecError(
            f"token trees need an attention implementation that applies a 4D mask ({', '.join(ARBITRARY_MASK_ATTENTION)}),"
            f" but {what} uses {impl!r}: load it with attn_implementation='sdpa'"
        )


def sliding_window_of(config) -> int | None:
    """The window of a model whose layers include sliding-window attention (Gemma 2/3), else None."""
    config = _text_config(config)
    if "sliding_attention" not in set(getattr(config, "layer_types", None) or ()):
        return None
    return int(config.sliding_window)


def _sliding_layer(cache):
    from transformers.cache_utils import DynamicSlidingWindowLayer

    return next((layer for layer in getattr(cache, "layers", ()) if isinstance(layer, DynamicSlidingWindowLayer)),
                None)


def layer_masks(config, cache, allowed: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor,
                dtype: torch.dtype = torch.float32, device=None):
    """The mask(s) a forward over queries at `query_positions` takes, given which keys each may see.

    `allowed` is bool [q, kv] over every key the cache logically holds followed by the new queries' own entries
    (`key_positions` [kv] their positions). Without sliding-window layers: the additive mask. With them: a dict by
    layer type, the sliding layers' mask also requiring query position - key position < window (transformers'
    sliding window) and cut to the keys their cache layer hands attention: its last min(stored, window - 1) cached
    entries, then the new ones. Every key a sliding query may see must be among those (else RuntimeError: the
    answer would be silently wrong); a caller whose cache holds more than the window behind its queries widens the
    layers' window first (kv_cache.sliding_layers_keep_everything).
    """
    window = sliding_window_of(config)
    full = additive_mask(allowed, dtype=dtype, device=device)
    if window is None:
        return full
    near = (query_positions.view(-1, 1).cpu() - key_positions.view(1, -1).cpu()) < window
    sliding = allowed.cpu() & near
    layer = _sliding_layer(cache)
    first = 0
    if layer is not None and getattr(layer, "keys", None) is not None and layer.keys.numel():
        handed = min(layer.keys.shape[-2], layer.sliding_window - 1)
        first = layer.cumulative_length - handed
    if bool(sliding[:, :first].any()):
        raise RuntimeError("a sliding-window query may see a key its cache layer no longer hands attention")
    return {"full_attention": full, "sliding_attention": additive_mask(sliding[:, first:], dtype=dtype, device=device)}
