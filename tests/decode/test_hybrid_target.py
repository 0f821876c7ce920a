"""decode/hybrid_target.py directly: the per-node Gated DeltaNet forward against the layer's own forward.

Over a chain, every node's output, convolution window and recurrent state must be what the target's own layer
computes decoding those tokens one at a time; over a branching tree, each node's must be what the layer computes
for that node's path alone (its siblings never leak into it)."""

from __future__ import annotations

import pytest
import torch

from frspec.decode.hybrid_target import LinearStates, _linear_modules, per_node_linear_attention
from frspec.decode.kv_cache import new_cache
from tests.decode.mtp_tiny import HYBRID_FAMILIES, load_target, save_mtp_checkpoint

PROMPT = [4, 8, 15, 16, 23, 42]


@pytest.fixture(scope="module", params=HYBRID_FAMILIES)
def target(request, tmp_path_factory):
    path = save_mtp_checkpoint(tmp_path_factory.mktemp(request.param) / "ckpt", request.param, context_scale=1.0)
    return load_target(path)


def _layer_run(target, prefix: list[int], tokens: list[int], parents: list[int] | None):
    """(layer-0 input, the linear layer's output, per-node windows/states) with the cache after `prefix`:
    per node when `parents` is given, else the layer's own forward one token at a time."""
    idx, module = _linear_modules(target)[0]
    cache = new_cache(target)
    target(input_ids=torch.tensor([prefix]), cache=cache, use_cache=True)
    hidden = target.get_input_embeddings()(torch.tensor([tokens]))
    if parents is not None:
        record = LinearStates()
        with per_node_linear_attention(target, parents, record):
            out = module(hidden_states=hidden, cache=cache)
        return out, record.windows[idx], record.states[idx]
    outs, windows, states = [], [], []
    for t in range(len(tokens)):
        outs.append(module(hidden_states=hidden[:, t : t + 1], cache=cache))
        windows.append(cache.get_conv_state(idx)[0, :, -module.conv_kernel_size:].clone())
        states.append(cache.get_recurrent_state(idx)[0].clone())
    return torch.cat(outs, dim=1), torch.stack(windows), torch.stack(states)


@torch.no_grad()
def test_chain_matches_the_layer_decoding_token_by_token(target):
    tokens = [7, 3, 9, 1]
    got = _layer_run(target, PROMPT, tokens, parents=[-1, 0, 1, 2])
    want = _layer_run(target, PROMPT, tokens, parents=None)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@torch.no_grad()
def test_tree_nodes_see_only_their_own_path(target):
    # root 7 with children 3 and 9; 9 has child 1. Node order: 7, 3, 9, 1.
    tokens, parents = [7, 3, 9, 1], [-1, 0, 0, 2]
    out, windows, states = _layer_run(target, PROMPT, tokens, parents)
    path_out, path_windows, path_states = _layer_run(target, PROMPT, [7, 9, 1], parents=None)
    for node, step in ((0, 0), (2, 1), (3, 2)):
        torch.testing.assert_close(out[:, node], path_out[:, step], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(windows[node], path_windows[step], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(states[node], path_states[step], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(states[1], states[2])  # siblings differ: the test compares something


@torch.no_grad()
def test_dropping_the_nodes_leaves_the_cache_as_it_was(target):
    """drop_hybrid_nodes (how the step-cost measurement undoes a timed forward) restores the cache: a chain verified
    after a dropped one gets the logits it gets on the untouched cache."""
    from frspec.decode.hybrid_target import drop_hybrid_nodes, hybrid_target_forward
    from frspec.decode.kv_cache import enable_rollback
    from frspec.decode.token_tree import TokenTree

    def cache_after_prompt():
        cache = new_cache(target)
        target(input_ids=torch.tensor([PROMPT]), cache=cache, use_cache=True)
        enable_rollback(cache)
        return cache

    past = len(PROMPT)
    chain = TokenTree.chain(7, [3, 9, 1])
    want, _ = hybrid_target_forward(target, chain, cache_after_prompt(), past, None)
    cache = cache_after_prompt()
    _, record = hybrid_target_forward(target, TokenTree.chain(2, [5, 11]), cache, past, None)
    drop_hybrid_nodes(cache, past, record)
    got, _ = hybrid_target_forward(target, chain, cache, past, None)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-6)
