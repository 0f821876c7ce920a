"""A fresh EAGLE-1/2 head for a target, and writing a trained one in the layout `load_eagle_head` reads.

The head is one decoder layer of the target's own family (Qwen2 or Llama), sized like the target's layers, sharing
the target's embedding and LM head. Only `fc` and the layer are trained and saved:

    HEAD_DIR/config.json         the layer config (hidden size, heads, MLP width, RoPE...) + training metadata
    HEAD_DIR/model.safetensors   fc.weight, fc.bias, layers.0.* (no embedding, no LM head: they are the target's)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, PreTrainedModel, Qwen2Config

from frspec.errors import FrspecError
from frspec.io import atomic_path
from frspec.models.eagle import Eagle2Head
from frspec.models.eagle_loading import read_head_weights, resolve_head_dir
from frspec.models.loading import vocab_size_of

# The target config keys a head layer needs; anything else (layer counts, sliding windows, ids) is the target's.
LAYER_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "hidden_act", "rms_norm_eps", "rope_parameters", "rope_theta", "rope_scaling",
              "max_position_embeddings", "attention_dropout")
# Tensors that belong to the target, not the head.
SHARED_PREFIXES = ("embed_tokens.", "lm_head.")


def head_layer_config(target: PreTrainedModel, intermediate_size: int | None = None) -> Qwen2Config | LlamaConfig:
    """The config of the head's single decoder layer: the target's layer shape, one layer."""
    values = {k: v for k, v in target.config.to_dict().items() if k in LAYER_KEYS and v is not None}
    # The end-of-turn id rides along so a reduced token loss (--loss-vocab) can always keep it.
    values.update(num_hidden_layers=1, vocab_size=vocab_size_of(target), eos_token_id=target.config.eos_token_id)
    if intermediate_size is not None:
        values["intermediate_size"] = int(intermediate_size)
    family = Qwen2Config if getattr(target.config, "model_type", "") == "qwen2" else LlamaConfig
    if family is LlamaConfig:
        values["attention_bias"] = False
    config = family(**values)
    config._attn_implementation = "sdpa"
    return config


def new_head(target: PreTrainedModel, intermediate_size: int | None = None, seed: int = 0) -> Eagle2Head:
    """An untrained fp32 EAGLE-1/2 head for `target` (shared embedding and LM head stay frozen in the target)."""
    torch.manual_seed(seed)
    config = head_layer_config(target, intermediate_size)
    head = Eagle2Head(config, target.get_input_embeddings(), target.get_output_embeddings(), fc_bias=True,
                      first_input_norm=False)
    for module in head.modules():  # transformers' own initialisation (normal(0, initializer_range)) for the layer
        if isinstance(module, torch.nn.Linear) and module is not head.lm_head:
            torch.nn.init.normal_(module.weight, std=float(getattr(target.config, "initializer_range", 0.02)))
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
    head.to(device=target.get_input_embeddings().weight.device)
    for name, p in head.named_parameters():
        p.requires_grad_(not name.startswith(SHARED_PREFIXES))
    return head


def trainable_state(head: Eagle2Head) -> dict[str, torch.Tensor]:
    """The head's own tensors (what a checkpoint holds), by the names the loader expects."""
    return {k: v for k, v in head.state_dict().items() if not k.startswith(SHARED_PREFIXES)}


def head_config_dict(head: Eagle2Head, metadata: dict | None = None) -> dict:
    """config.json for the head: its layer config as the loader reads it, plus how it was trained."""
    config = head.config
    values = {k: v for k, v in config.to_dict().items() if k in LAYER_KEYS and v is not None}
    arch = "EagleQwen2Head" if isinstance(config, Qwen2Config) else "EagleLlamaHead"
    values.update(architectures=[arch], model_type=config.model_type, num_hidden_layers=1,
                  vocab_size=int(config.vocab_size), bias=True)
    if metadata:
        values["frspec_training"] = metadata
    return values


def save_head(head: Eagle2Head, out_dir: str | os.PathLike, dtype: torch.dtype = torch.bfloat16,
              metadata: dict | None = None) -> Path:
    """Write config.json + model.safetensors so `load_eagle_head(out_dir, target)` reads it.

    A reader never sees half a head or a mix of two: both files are written completely beside their final names
    first (an interrupt there leaves a previous head untouched and no temporary file). Only then is the previous
    head's config.json, which marks a head complete (the loader and `is_head_ready` need it), removed, the new
    weights renamed into place and the new config.json last. An interrupt within those renames leaves no head
    (weights without a config.json), never new weights under an old config.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in trainable_state(head).items()}
    config = json.dumps(head_config_dict(head, metadata), indent=2) + "\n"
    with atomic_path(out / "config.json") as config_tmp:  # renamed last: when the weights are in place
        config_tmp.write_text(config)
        with atomic_path(out / "model.safetensors") as weights_tmp:
            save_file(state, str(weights_tmp), metadata={"format": "pt"})
            (out / "config.json").unlink(missing_ok=True)
    return out


def init_from(head: Eagle2Head, source: str | os.PathLike) -> None:
    """Start training from an existing EAGLE-1/2 head's weights (to continue or fine-tune it)."""
    saved = read_head_weights(resolve_head_dir(source))
    own = trainable_state(head)
    wrong = sorted(k for k in own if k not in saved or saved[k].shape != own[k].shape)
    if wrong:
        raise FrspecError(f"head {str(source)!r} does not fit this target's head: {', '.join(wrong[:3])}"
                          f"{' ...' if len(wrong) > 3 else ''} missing or of another shape")
    with torch.no_grad():
        for key, value in own.items():
            value.copy_(saved[key].to(value.dtype))
