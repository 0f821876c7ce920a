"""Hybrid targets: verifying drafts with models whose layers mix attention and Gated DeltaNet (Qwen3-Next, Qwen3.5).

A linear-attention layer keeps a recurrent state and a convolution window instead of per-token keys and values, so
its cache cannot be cropped back to an accepted prefix (transformers' `crop` only rewinds the convolution window)
and cannot read a token tree in one pass (its recurrence would run through the tree's nodes in node order, each
node seeing its siblings). So during a verification forward every Gated DeltaNet layer runs per node:

    window_i = the parent's convolution window shifted by node i's input   (the root's parent: the cache's window)
    state_i  = one gated-delta-rule step from the parent's recurrent state  (the root's parent: the cache's state)

and the window and state after every node are kept (`LinearStates`). That is the same arithmetic as the target
alone decoding those tokens one at a time along the node's path (transformers' own single-token functions,
`causal_conv1d_update` and `torch_recurrent_gated_delta_rule`, do each step), so the logits at every node are the
target's logits for its path. After verification the cache's linear layers take the window and state of the
accepted path's last node (`keep_hybrid_path`) and the attention layers keep the path's entries as usual: the
accepted path's state is restored without a second target forward. A chain is the tree of width 1.

Cost per step, for T verified nodes: memory T x (recurrent state + conv window) per linear layer, kept until the
verdict (Qwen3.5-27B: 48 linear layers x 48 value heads x 128 x 128 fp32 = 144 MiB per node; the bf16 conv
windows, 10,240 channels x 4, add 3.75 MiB), and time T sequential single-token recurrence steps per linear layer,
which is how the target alone decodes them too (no chunked kernel over the tree). The forward of each Gated
DeltaNet module is replaced for the duration of one verification forward only (`per_node_linear_attention`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn.functional as F

from frspec.decode.kv_cache import is_prefix_path
from frspec.errors import FrspecError
from frspec.models.attention import check_mask_implementation


def is_hybrid(model: torch.nn.Module) -> bool:
    """True when the target has linear-attention (Gated DeltaNet) layers."""
    config = model.config.get_text_config(decoder=True)
    return "linear_attention" in (getattr(config, "layer_types", None) or ())


def check_hybrid_tree_support(model: torch.nn.Module, what: str = "the target") -> None:
    """Trees on a hybrid target: its attention layers must apply a 4D mask as given (ARBITRARY_MASK_ATTENTION)."""
    check_mask_implementation(model.config, what)


def _linear_modules(model: torch.nn.Module) -> list[tuple[int, torch.nn.Module]]:
    """(layer index, Gated DeltaNet module) for every linear-attention layer."""
    layers = model.get_decoder().layers
    found = [(i, layer.linear_attn) for i, layer in enumerate(layers) if hasattr(layer, "linear_attn")]
    for _, module in found:
        if not hasattr(module, "A_log") or not hasattr(module, "conv1d"):
            raise FrspecError(f"linear-attention layers of type {type(module).__name__} are not supported as targets")
    return found


@dataclass
class LinearStates:
    """The convolution window [T, C, K] and recurrent state [T, H, dk, dv] after each of a forward's T nodes, per
    linear layer index."""

    windows: dict[int, torch.Tensor] = field(default_factory=dict)
    states: dict[int, torch.Tensor] = field(default_factory=dict)


def _projections(module, hidden: torch.Tensor):
    """Pre-convolution qkv [1, C, T], gate z [1, T, Hv, dv], b and a [1, T, Hv] of a Gated DeltaNet module
    (Qwen3-Next's fused qkvz / ba projections, or Qwen3.5's separate ones)."""
    if hasattr(module, "in_proj_qkvz"):
        q, k, v, z, b, a = module.fix_query_key_value_ordering(module.in_proj_qkvz(hidden), module.in_proj_ba(hidden))
        mixed = torch.cat([x.reshape(x.shape[0], x.shape[1], -1) for x in (q, k, v)], dim=-1)
        return mixed.transpose(1, 2), z, b, a
    t = hidden.shape[1]
    z = module.in_proj_z(hidden).reshape(1, t, -1, module.head_v_dim)
    return module.in_proj_qkv(hidden).transpose(1, 2), z, module.in_proj_b(hidden), module.in_proj_a(hidden)


def _per_node_forward(module, layer_idx: int, parents: Sequence[int], record: LinearStates, hidden_states,
                      cache=None, attention_mask=None, **kwargs):
    """The Gated DeltaNet layer over tree nodes (parents[i] < i, parents[0] == -1 for the root), each node from
    its parent's window and state (module docstring). Reads but never updates the cache."""
    from transformers.models.qwen3_next.modeling_qwen3_next import (
        causal_conv1d_update,
        torch_recurrent_gated_delta_rule,
    )

    t = hidden_states.shape[1]
    if hidden_states.shape[0] != 1:
        raise FrspecError("hybrid-target verification runs one sequence at a time")
    conv0 = cache.get_conv_state(layer_idx, state_idx=0)
    state0 = cache.get_recurrent_state(layer_idx, state_idx=0)
    if conv0 is None or state0 is None:
        raise FrspecError("a hybrid target's verification needs its linear-attention states from the prefill")
    conv0 = conv0[..., -module.conv_kernel_size:]
    mixed, z, b, a = _projections(module, hidden_states)
    weight = module.conv1d.weight.squeeze(1)
    windows = torch.empty((t, *conv0.shape[1:]), dtype=conv0.dtype, device=conv0.device)
    conv_out = torch.empty_like(mixed)
    for i in range(t):
        window = (conv0 if parents[i] < 0 else windows[parents[i]][None]).clone()
        conv_out[:, :, i : i + 1] = causal_conv1d_update(mixed[:, :, i : i + 1], window, weight, module.conv1d.bias,
                                                         module.activation)
        windows[i] = window[0]
    qkv = conv_out.transpose(1, 2)
    query, key, value = torch.split(qkv, [module.key_dim, module.key_dim, module.value_dim], dim=-1)
    query = query.reshape(1, t, -1, module.head_k_dim)
    key = key.reshape(1, t, -1, module.head_k_dim)
    value = value.reshape(1, t, -1, module.head_v_dim)
    beta = b.sigmoid()
    g = -module.A_log.float().exp() * F.softplus(a.float() + module.dt_bias)
    states = torch.empty((t, *state0.shape[1:]), dtype=state0.dtype, device=state0.device)
    core = []
    for i in range(t):
        start = state0 if parents[i] < 0 else states[parents[i]][None]
        out, final = torch_recurrent_gated_delta_rule(
            query[:, i : i + 1], key[:, i : i + 1], value[:, i : i + 1], g=g[:, i : i + 1], beta=beta[:, i : i + 1],
            initial_state=start, output_final_state=True, use_qk_l2norm_in_kernel=True,
        )
        states[i] = final[0].to(states.dtype)
        core.append(out)
    record.windows[layer_idx], record.states[layer_idx] = windows, states
    core = torch.cat(core, dim=1)
    core = module.norm(core.reshape(-1, module.head_v_dim), z.reshape(-1, module.head_v_dim))
    return module.out_proj(core.reshape(1, t, -1))


@contextlib.contextmanager
def per_node_linear_attention(model: torch.nn.Module, parents: Sequence[int], record: LinearStates):
    """Within the block, the model's Gated DeltaNet layers run per tree node (parents as in `_per_node_forward`)
    and record their windows and states in `record`; their own forward is back afterwards."""
    modules = _linear_modules(model)
    for idx, module in modules:
        def forward(hidden_states=None, cache=None, attention_mask=None, *, _m=module, _i=idx, **kwargs):
            return _per_node_forward(_m, _i, parents, record, hidden_states, cache, attention_mask, **kwargs)

        module.forward = forward  # an instance attribute shadows the class's forward
    try:
        yield
    finally:
        for _, module in modules:
            del module.forward


def hybrid_target_forward(target: torch.nn.Module, tree, cache, past: int, hidden_layers):
    """The target over every tree node (a chain included), with per-node linear-attention states.

    Returns (output, LinearStates); the cache's attention layers get one entry per node appended, its linear
    layers are left as they were until `keep_hybrid_path`."""
    param = next(target.parameters())
    kwargs = {}
    if hidden_layers is not None:
        kwargs["output_hidden_states"] = hidden_layers
    parents = [-1] + [int(p) for p in tree.parents[1:]]
    # Attention layers see the committed prefix and their own ancestors; the linear ones follow `parents`.
    kwargs["attention_mask"] = {"full_attention": tree.attention_mask(past, dtype=param.dtype, device=param.device),
                                "linear_attention": None}
    kwargs["position_ids"] = tree.position_ids(past, device=param.device)
    record = LinearStates()
    with per_node_linear_attention(target, parents, record):
        out = target(input_ids=tree.tokens_tensor(param.device)[None], cache=cache, use_cache=True, **kwargs)
    return out, record


def keep_hybrid_path(cache, start: int, path: Sequence[int], record: LinearStates) -> None:
    """Keep the accepted path: attention layers keep entries [0, start) then start + path; linear layers take the
    window and state after the path's last node."""
    last = path[-1]
    for i, layer in enumerate(cache.layers):
        if i in record.states:
            layer.conv_states[0] = record.windows[i][last][None].clone()
            layer.recurrent_states[0].copy_(record.states[i][last][None])
    _keep_attention_entries(cache, start, path, record)


def drop_hybrid_nodes(cache, start: int, record: LinearStates) -> None:
    """Undo `hybrid_target_forward` (the step-cost measurement times it, decode/step_costs.py): attention layers
    back to their first `start` entries; the linear layers, which it left as they were, keep their state."""
    _keep_attention_entries(cache, start, [], record)


def _keep_attention_entries(cache, start: int, path: Sequence[int], record: LinearStates) -> None:
    """Attention layers keep entries [0, start) then start + path; the linear layers (in `record`) are skipped."""
    keep = torch.as_tensor(list(path), dtype=torch.long)
    for i, layer in enumerate(cache.layers):
        if i in record.states or getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        if is_prefix_path(path):
            layer.keys = layer.keys[:, :, : start + len(path)]
            layer.values = layer.values[:, :, : start + len(path)]
        else:
            idx = torch.cat([torch.arange(start), start + keep]).to(layer.keys.device)
            layer.keys = layer.keys.index_select(-2, idx)
            layer.values = layer.values.index_select(-2, idx)
