"""KV-cache bookkeeping shared by the target and every drafter: one way to create a cache and one way to roll it back.

The engine never recomputes a prefix: after verification it truncates each cache to the tokens that were accepted,
so the next forward only processes tokens the model has not yet seen.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache(model: torch.nn.Module) -> DynamicCache:
    """An empty cache laid out for `model` (full, sliding-window and linear-attention layers as its config says)."""
    return DynamicCache(config=model.config)


def enable_rollback(cache: DynamicCache) -> None:
    """Make fixed-size layers (sliding window, linear attention) keep enough past state to be truncated.

    Call after the prefill, as transformers' own assisted decoding does: turning it on earlier would keep the whole
    prompt's states in layers that would otherwise drop most of them. A no-op for plain full-attention caches.
    """
    cache.activate_past_recording()


def cache_length(cache: DynamicCache) -> int:
    """How many tokens the cache holds."""
    return cache.get_seq_length()


def truncate_cache(cache: DynamicCache, length: int) -> None:
    """Drop every cached token after the first `length`; a cache already that short is left as it is.

    `crop(0)` is still called then, because fixed-size layers use it to shrink back to their working size.
    """
    extra = max(cache.get_seq_length() - length, 0)
    cache.crop(-extra)
