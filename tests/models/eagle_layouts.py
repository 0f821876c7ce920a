"""Write tiny EAGLE heads in the published checkpoint layouts (tensor names spelled out, independent of frspec).

EAGLE-1/2 (yuhuili/EAGLE-*): config.json (a Llama-style config, num_hidden_layers = head layers) and
pytorch_model.bin or model.safetensors with fc.*, layers.{i}.* (layer 0 without input_layernorm), optionally
embed_tokens.weight. EAGLE-3 (yuhuili/EAGLE3-*): config.json with draft_vocab_size, and midlayer.*, fc.weight,
norm.weight, lm_head.weight, d2t, t2d, optionally embed_tokens.weight.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

HEADS, KV_HEADS, FFN = 4, 2, 48


def _rand(gen, *shape, scale=0.2):
    return torch.randn(*shape, generator=gen) * scale


def _norm(gen, h):
    return 1.0 + _rand(gen, h, scale=0.1)


def attention_and_mlp(gen, prefix: str, h: int, in_dim: int, qkv_bias: bool) -> dict[str, torch.Tensor]:
    hd = h // HEADS
    t = {
        f"{prefix}self_attn.q_proj.weight": _rand(gen, HEADS * hd, in_dim),
        f"{prefix}self_attn.k_proj.weight": _rand(gen, KV_HEADS * hd, in_dim),
        f"{prefix}self_attn.v_proj.weight": _rand(gen, KV_HEADS * hd, in_dim),
        f"{prefix}self_attn.o_proj.weight": _rand(gen, h, HEADS * hd),
        f"{prefix}mlp.gate_proj.weight": _rand(gen, FFN, h),
        f"{prefix}mlp.up_proj.weight": _rand(gen, FFN, h),
        f"{prefix}mlp.down_proj.weight": _rand(gen, h, FFN),
        f"{prefix}post_attention_layernorm.weight": _norm(gen, h),
    }
    if qkv_bias:
        for name, rows in (("q", HEADS * hd), ("k", KV_HEADS * hd), ("v", KV_HEADS * hd)):
            t[f"{prefix}self_attn.{name}_proj.bias"] = _rand(gen, rows)
    return t


def head_config(h: int, vocab: int, layers: int, **extra) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h, "intermediate_size": FFN,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "num_hidden_layers": layers,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 256, "hidden_act": "silu",
        "vocab_size": vocab, "torch_dtype": "float16", **extra,
    }


def eagle2_tensors(h: int, vocab: int, layers: int = 1, qkv_bias: bool = False, embed: torch.Tensor | None = None,
                   seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    t = {"fc.weight": _rand(gen, h, 2 * h), "fc.bias": _rand(gen, h)}
    for i in range(layers):
        t.update(attention_and_mlp(gen, f"layers.{i}.", h, h, qkv_bias))
        if i > 0:
            t[f"layers.{i}.input_layernorm.weight"] = _norm(gen, h)
    if embed is not None:
        t["embed_tokens.weight"] = embed.clone()
    return t


def eagle3_tensors(h: int, target_h: int, vocab: int, draft_ids: torch.Tensor | None,
                   embed: torch.Tensor | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    draft_vocab = vocab if draft_ids is None else draft_ids.numel()
    t = {"fc.weight": _rand(gen, h, 3 * target_h)}
    t.update(attention_and_mlp(gen, "midlayer.", h, 2 * h, qkv_bias=False))
    t["midlayer.input_layernorm.weight"] = _norm(gen, h)
    t["midlayer.hidden_norm.weight"] = _norm(gen, h)
    t["norm.weight"] = _norm(gen, h)
    t["lm_head.weight"] = _rand(gen, draft_vocab, h)
    if draft_ids is not None:
        t["d2t"] = draft_ids - torch.arange(draft_vocab)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[draft_ids] = True
        t["t2d"] = t2d
    if embed is not None:
        t["embed_tokens.weight"] = embed.clone()
    return t


def write_checkpoint(directory: Path, config: dict, tensors: dict[str, torch.Tensor], fmt: str = "bin") -> Path:
    """fmt: "bin" (pytorch_model.bin), "safetensors", or "sharded" (two safetensors shards + index)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    if fmt == "bin":
        torch.save(tensors, directory / "pytorch_model.bin")
    elif fmt == "safetensors":
        save_file(tensors, str(directory / "model.safetensors"))
    elif fmt == "sharded":
        names = sorted(tensors)
        halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
        weight_map = {}
        for shard, keys in halves.items():
            save_file({k: tensors[k] for k in keys}, str(directory / shard))
            weight_map.update({k: shard for k in keys})
        (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    else:
        raise ValueError(fmt)
    return directory
