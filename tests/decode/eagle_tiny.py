"""Tiny EAGLE heads that agree with a tiny target often, so engine tests see accepted, rejected and partial paths.

A random head almost never agrees with a random target. Here the target is made "mostly bigram" (its attention and
MLP outputs are scaled down, so its next token depends mostly on the current one, a little on the context), and
the heads are built to compute roughly the current token's embedding, which the target's LM head then scores like
the target does. Noise on the heads' weights makes them wrong some of the time.
"""

from __future__ import annotations

import torch

from frspec.models.eagle import EagleHead
from frspec.models.eagle_loading import build_head


def mostly_bigram(model: torch.nn.Module, context_scale: float = 0.01) -> torch.nn.Module:
    """Scale every layer's attention output and MLP output by `context_scale` (in place)."""
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(context_scale)
            layer.mlp.down_proj.weight.mul_(context_scale)
    return model


def _noisy(t: torch.Tensor, noise: float, gen: torch.Generator) -> torch.Tensor:
    return t + noise * torch.randn(t.shape, generator=gen, dtype=t.dtype)


def _config(target, kv_heads: int, **extra) -> dict:
    c = target.config
    return {"hidden_size": c.hidden_size, "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": kv_heads, "intermediate_size": c.intermediate_size, "num_hidden_layers": 1,
            "rms_norm_eps": c.rms_norm_eps, "vocab_size": c.vocab_size, **extra}


def oracle_eagle2_head(target, noise: float = 0.05, seed: int = 0) -> EagleHead:
    """EAGLE-1/2 head: fc([e, h]) ~ e, the layer adds almost nothing, so features ~ the current token's embedding."""
    config, state = oracle_eagle2_checkpoint(target, noise, seed)
    return build_head(config, state, target, "oracle EAGLE-2 head")


def oracle_eagle2_checkpoint(target, noise: float = 0.05, seed: int = 0) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json dict, tensors by their published names) of `oracle_eagle2_head`."""
    h, heads, kv = target.config.hidden_size, target.config.num_attention_heads, target.config.num_key_value_heads
    hd = h // heads
    gen = torch.Generator().manual_seed(seed)
    dtype = target.get_input_embeddings().weight.dtype
    noise = noise * float(target.get_input_embeddings().weight.detach().std())  # relative to the embeddings it copies
    z = lambda *s: torch.zeros(*s, dtype=dtype)  # noqa: E731
    state = {
        "fc.weight": _noisy(torch.cat([torch.eye(h, dtype=dtype), z(h, h)], 1), noise, gen),
        "fc.bias": z(h),
        "layers.0.self_attn.q_proj.weight": _noisy(z(heads * hd, h), noise, gen),
        "layers.0.self_attn.k_proj.weight": _noisy(z(kv * hd, h), noise, gen),
        "layers.0.self_attn.v_proj.weight": _noisy(z(kv * hd, h), noise, gen),
        "layers.0.self_attn.o_proj.weight": _noisy(z(h, heads * hd), noise, gen),
        "layers.0.mlp.gate_proj.weight": _noisy(z(2 * h, h), noise, gen),
        "layers.0.mlp.up_proj.weight": _noisy(z(2 * h, h), noise, gen),
        "layers.0.mlp.down_proj.weight": _noisy(z(h, 2 * h), noise, gen),
        "layers.0.post_attention_layernorm.weight": torch.ones(h, dtype=dtype),
    }
    if getattr(target.config, "model_type", "") == "qwen2":
        for name, rows in (("q", heads * hd), ("k", kv * hd), ("v", kv * hd)):
            state[f"layers.0.self_attn.{name}_proj.bias"] = z(rows)
    return _config(target, kv, intermediate_size=2 * h), state


def oracle_eagle3_head(target, draft_ids: torch.Tensor | None = None, noise: float = 0.05, seed: int = 0,
                       focus: float = 3.0) -> EagleHead:
    """EAGLE-3 head: fc ~ 0, attention focused on the query's own position (q = k = focus * norm(e)) copies the
    current token's normed embedding through v = o = identity, so features ~ it; the own LM head holds the target's
    rows for the draft vocabulary (`draft_ids`, sorted; None = the whole vocabulary)."""
    h, heads = target.config.hidden_size, target.config.num_attention_heads
    vocab = target.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    dtype = target.get_input_embeddings().weight.dtype
    eye, zero = torch.eye(h, dtype=dtype), torch.zeros(h, h, dtype=dtype)
    read_embed = torch.cat([eye, zero], 1)  # [H, 2H]: the embedding half of [norm(e), norm(hidden)]
    lm = target.get_output_embeddings().weight.detach()
    ids = torch.arange(vocab) if draft_ids is None else draft_ids
    state = {
        "fc.weight": _noisy(torch.zeros(h, 3 * h, dtype=dtype), noise, gen),
        "midlayer.self_attn.q_proj.weight": _noisy(focus * read_embed, noise, gen),
        "midlayer.self_attn.k_proj.weight": _noisy(focus * read_embed, noise, gen),
        "midlayer.self_attn.v_proj.weight": _noisy(read_embed, noise, gen),
        "midlayer.self_attn.o_proj.weight": _noisy(eye, noise, gen),
        "midlayer.mlp.gate_proj.weight": torch.zeros(2 * h, h, dtype=dtype),
        "midlayer.mlp.up_proj.weight": torch.zeros(2 * h, h, dtype=dtype),
        "midlayer.mlp.down_proj.weight": torch.zeros(h, 2 * h, dtype=dtype),
        "midlayer.input_layernorm.weight": torch.ones(h, dtype=dtype),
        "midlayer.hidden_norm.weight": torch.ones(h, dtype=dtype),
        "midlayer.post_attention_layernorm.weight": torch.ones(h, dtype=dtype),
        "norm.weight": torch.ones(h, dtype=dtype),
        "lm_head.weight": lm[ids].clone(),
    }
    if draft_ids is not None:
        state["d2t"] = draft_ids - torch.arange(draft_ids.numel())
    config = _config(target, heads, intermediate_size=2 * h, draft_vocab_size=int(ids.numel()))
    n = target.config.num_hidden_layers
    if n < 3:  # the default layers 2, N/2, N-3 need N >= 3; small test targets name their own
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [0, n // 2, n]}
    return build_head(config, state, target, "oracle EAGLE-3 head")
