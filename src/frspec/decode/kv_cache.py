"""The one place caches are touched: create one, enable rollback, crop to a length, keep a tree path.

The engine never recomputes a prefix: after verification it cuts each cache back to the tokens that were accepted,
so the next forward only processes tokens the model has not yet seen. After a forward over a token tree the cache
holds the committed prefix and then one entry per tree node; `keep_path` keeps the accepted path's entries. When
that path is a prefix of node order (always, for a chain) this is a crop, which every cache layer supports;
otherwise the entries are gathered, which plain full-attention layers (`DynamicLayer`) and sliding-window layers
(`DynamicSlidingWindowLayer`, Gemma 2/3, with rollback enabled) understand.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from typing import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from frspec.errors import FrspecError


def new_cache(model: torch.nn.Module) -> DynamicCache:
    """An empty cache laid out for `model` (full, sliding-window and linear-attention layers as its config says)."""
    return DynamicCache(config=model.config)


def enable_rollback(cache: DynamicCache) -> None:
    """Make fixed-size layers (sliding window, linear attention) keep enough past state to be truncated.

    Call after the prefill, as transformers' own assisted decoding does: turning it on earlier would keep the whole
    prompt's states in layers that would otherwise drop most of them. A no-op for plain full-attention caches.

    Linear-attention layers are asked to keep no intermediate recurrent states: a hybrid target's verification
    forward records its own per-node states and restores the accepted one (hybrid_target.py). transformers 5.25
    added that count (`recurrent_states_to_keep`) and reads it in every multi-token forward once recording is on; its
    default, None, fails there, so it is set to 0 wherever the installed transformers takes it.
    """
    params = inspect.signature(cache.activate_past_recording).parameters.values()
    if any(p.name == "recurrent_states_to_keep" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        cache.activate_past_recording(recurrent_states_to_keep=0)
    else:
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


def is_prefix_path(path: Sequence[int]) -> bool:
    """True when `path` is nodes 0, 1, ..., m: the accepted path is the first entries in node order."""
    return all(node == i for i, node in enumerate(path))


def keep_path(cache, start: int, path: Sequence[int]) -> None:
    """Keep entries [0, start) and then the tree-node entries start + path, in that order (crop when possible)."""
    if is_prefix_path(path):
        truncate_cache(cache, start + len(path))
    else:
        keep_cache_entries(cache, start, path)


def keep_cache_entries(cache, start: int, keep: torch.Tensor | Sequence[int]) -> None:
    """In every layer of a DynamicCache, keep entries [0, start) and then only entries start + keep, in that order.

    After a tree forward the cache holds the committed prefix followed by one entry per tree node; keeping the
    accepted path's node slots makes it identical to a cache built by running that path alone (same keys, same
    positions), because each node was computed seeing exactly its ancestors. Full-attention layers are gathered; a
    sliding-window layer (which stores only the prefix's last entries, then the nodes) is gathered the same way and
    then cut to its working size, as its own crop would; any other layer type (linear attention, quantized, indexed)
    is refused.
    """
    keep = torch.as_tensor(keep, dtype=torch.long)
    for i, layer in enumerate(cache.layers):  # every layer checked before any is changed
        if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
            raise FrspecError(
                f"cache layer {i} ({type(layer).__name__}) cannot drop tree entries; trees need full or "
                "sliding-window attention layers"
            )
    for layer in cache.layers:
        sliding = type(layer) is DynamicSlidingWindowLayer
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        total = layer.keys.shape[-2]
        # Stored prefix entries before the nodes: all of them in a full layer, the last few in a sliding one.
        stored = total - (layer.cumulative_length - start) if sliding else start
        if keep.numel() and (int(keep.max()) >= total - stored or int(keep.min()) < 0):
            raise ValueError(f"keep indices {keep.tolist()} out of range for {total - stored} tree entries")
        idx = torch.cat([torch.arange(stored), stored + keep]).to(layer.keys.device)
        layer.keys = layer.keys.index_select(-2, idx)
        layer.values = layer.values.index_select(-2, idx)
        if sliding:
            layer.cumulative_length = start + keep.numel()
            if layer.cumulative_length >= layer.sliding_window:  # back to its working size (window - 1 entries)
                layer.keys = layer.keys[:, :, -layer.sliding_window + 1:, :]
                layer.values = layer.values[:, :, -layer.sliding_window + 1:, :]


@contextmanager
def sliding_layers_keep_everything(cache):
    """Within the block, sliding-window layers hand attention every entry they store, not only the last window - 1.

    A drafter growing a tree appends each level to its cache: the nodes already cached take slots of the window,
    so a layer handing only its last window - 1 entries would hide prefix keys a deeper node must see (the masks
    then restrict keys by position, models/attention.layer_masks). With rollback enabled the layer stores every
    entry since its last crop; the window is restored before the caller crops.
    """
    layers = [layer for layer in cache.layers if type(layer) is DynamicSlidingWindowLayer]
    windows = [layer.sliding_window for layer in layers]
    for layer in layers:
        layer.sliding_window = 1 << 30
    try:
        yield
    finally:
        for layer, window in zip(layers, windows):
            layer.sliding_window = window
