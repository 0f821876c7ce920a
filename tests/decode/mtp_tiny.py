"""Tiny checkpoints with MTP layers, written in each family's published layout and config, for the MTP tests.

`save_mtp_checkpoint(dir, family)` writes config.json + model.safetensors as the family's released checkpoints lay
them out (per-expert MoE tensors, the MTP layer's own names), so models/mtp.py's loader path is what the tests run:

    deepseek_v3, glm4_moe   model.layers.{N}.{enorm,hnorm,eh_proj,shared_head.{norm,head},embed_tokens,<layer>}
    qwen3_next, qwen3_5     mtp.{fc,pre_fc_norm_embedding,pre_fc_norm_hidden,norm,layers.0.<layer>}
    mimo                    model.mtp_layers.0.{token_layernorm,hidden_layernorm,input_proj,final_layernorm,<layer>}
                            (config.json says model_type "mimo" as MiMo's does; frspec loads it as Qwen2, which it is)

The target is made "mostly bigram" (its layers' output projections are scaled down) and the MTP layer nearly copies
the next token's normed embedding into the shared head, so drafts are often but not always accepted.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FAMILIES = ("deepseek_v3", "glm4_moe", "qwen3_next", "qwen3_5", "mimo")
HYBRID_FAMILIES = ("qwen3_next", "qwen3_5")
# Output projections of attention, MLP / experts and Gated DeltaNet: scaled down to make the target mostly bigram.
_OUTPUTS = ("o_proj.weight", "down_proj.weight", "out_proj.weight")


def _config(family: str, vocab: int, layers: int):
    """(config class, model class, config) of a tiny model of `family` with `layers` decoder layers."""
    import transformers as tf

    common = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                  max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None, initializer_range=0.2)
    if family == "deepseek_v3":
        config = tf.DeepseekV3Config(
            **common, intermediate_size=64, moe_intermediate_size=16, num_key_value_heads=4, n_routed_experts=4,
            num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1,
            q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)
        return tf.DeepseekV3ForCausalLM, config
    if family == "glm4_moe":
        config = tf.Glm4MoeConfig(**common, intermediate_size=64, moe_intermediate_size=16, num_key_value_heads=2,
                                  n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1,
                                  topk_group=1, first_k_dense_replace=1, head_dim=8)
        return tf.Glm4MoeForCausalLM, config
    if family in HYBRID_FAMILIES:
        # Layers alternate linear (Gated DeltaNet) and full attention; the layer added for the MTP block is full.
        types = ["linear_attention", "full_attention"] * (layers // 2) + ["full_attention"] * (layers % 2)
        hybrid = dict(common, intermediate_size=64, num_key_value_heads=2, head_dim=8, layer_types=types,
                      linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
                      linear_value_head_dim=8, linear_conv_kernel_dim=4)
        if family == "qwen3_next":
            config = tf.Qwen3NextConfig(**hybrid, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                        shared_expert_intermediate_size=16)
            return tf.Qwen3NextForCausalLM, config
        return tf.Qwen3_5ForCausalLM, tf.Qwen3_5TextConfig(**hybrid)
    if family == "mimo":
        return tf.Qwen2ForCausalLM, tf.Qwen2Config(**common, intermediate_size=64, num_key_value_heads=2)
    raise ValueError(family)


def _mostly_bigram(state: dict[str, torch.Tensor], scale: float) -> None:
    for name, t in state.items():
        if name.startswith(("model.layers.", "mtp.")) and name.endswith(_OUTPUTS):
            t.mul_(scale)


def save_mtp_checkpoint(root, family: str, vocab: int = 96, layers: int = 2, seed: int = 0, noise: float = 0.1,
                        context_scale: float = 0.02) -> Path:
    """Write a tiny `family` target with one MTP layer to `root` (fp32); returns `root`.

    `noise` perturbs the MTP layer's input projection (relative), so its drafts are sometimes wrong."""
    root = Path(root)
    model_cls, config = _config(family, vocab, layers + 1)  # the extra layer becomes the MTP block
    torch.manual_seed(seed)
    big = model_cls(config).to(torch.float32).eval()
    with tempfile.TemporaryDirectory() as tmp:
        big.save_pretrained(tmp)  # the family's published tensor layout (per-expert MoE weights)
        state = load_file(str(Path(tmp) / "model.safetensors"))
    _mostly_bigram(state, context_scale)
    h = config.hidden_size
    gen = torch.Generator().manual_seed(seed + 1)
    eye, zero = torch.eye(h), torch.zeros(h, h)
    # The projection reads the token's normed embedding (the MTP layer then predicts what the target predicts after
    # that token), plus noise.
    proj = (torch.cat([zero, eye], 1) if family == "mimo" else torch.cat([eye, zero], 1))
    proj = proj + noise * torch.randn(proj.shape, generator=gen) / h**0.5
    norm = state["model.norm.weight"].clone()  # the family's norm convention (1 + w for Qwen3-Next/3.5)
    block = f"model.layers.{layers}."
    mtp_layer = {k[len(block):]: v for k, v in state.items() if k.startswith(block)}
    for k, v in mtp_layer.items():
        if k.endswith(_OUTPUTS):
            v.mul_(0.1)  # the block adds little: the MTP features stay close to the token's embedding
    state = {k: v for k, v in state.items() if not k.startswith(block)}
    if family in ("deepseek_v3", "glm4_moe"):
        extra = {"enorm.weight": norm.clone(), "hnorm.weight": norm.clone(), "eh_proj.weight": proj,
                 "shared_head.norm.weight": norm.clone(), "shared_head.head.weight": state["lm_head.weight"].clone(),
                 "embed_tokens.weight": state["model.embed_tokens.weight"].clone()}
        state.update({f"{block}{k}": v for k, v in {**mtp_layer, **extra}.items()})
        config.num_nextn_predict_layers = 1
    elif family in HYBRID_FAMILIES:
        state.update({f"mtp.layers.0.{k}": v for k, v in mtp_layer.items()})
        state.update({"mtp.fc.weight": proj, "mtp.pre_fc_norm_embedding.weight": norm.clone(),
                      "mtp.pre_fc_norm_hidden.weight": norm.clone(), "mtp.norm.weight": norm.clone()})
    else:
        prefix = "model.mtp_layers.0."
        state.update({f"{prefix}{k}": v for k, v in mtp_layer.items()})
        state.update({f"{prefix}token_layernorm.weight": norm.clone(), f"{prefix}hidden_layernorm.weight": norm.clone(),
                      f"{prefix}input_proj.weight": proj, f"{prefix}final_layernorm.weight": norm.clone()})
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:layers]
    root.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(root / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(root)
    data = json.loads((root / "config.json").read_text())
    if family in HYBRID_FAMILIES:
        data["mtp_num_hidden_layers"] = 1  # the published Qwen3-Next / Qwen3.5 field
    elif family == "mimo":  # the published MiMo config: its own (remote-code) class, Qwen2's fields
        data.update(num_nextn_predict_layers=1, model_type="mimo", architectures=["MiMoForCausalLM"])
    (root / "config.json").write_text(json.dumps(data, indent=2))
    return root


def as_qwen3_5_release(text_root, root) -> Path:
    """The Qwen3.5 checkpoint `text_root` (save_mtp_checkpoint's "qwen3_5") as Qwen3.5 is released: a multimodal
    config (model_type "qwen3_5", text_config + vision_config) and the text weights under `model.language_model.`,
    `mtp.*` at the top level."""
    from transformers import Qwen3_5Config

    text_root, root = Path(text_root), Path(root)
    root.mkdir(parents=True, exist_ok=True)
    state = load_file(str(text_root / "model.safetensors"))
    state = {("model.language_model." + k[len("model."):]) if k.startswith("model.") else k: v for k, v in state.items()}
    save_file(state, str(root / "model.safetensors"), metadata={"format": "pt"})
    text = json.loads((text_root / "config.json").read_text())
    text = {k: v for k, v in text.items() if k not in ("architectures", "transformers_version")}
    config = Qwen3_5Config(text_config=text, vision_config=dict(depth=1, hidden_size=16, num_heads=2,
                                                                 intermediate_size=16, out_hidden_size=32))
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    config.save_pretrained(root)
    return root


def load_target(root, dtype: torch.dtype = torch.float32):
    """The target model of a checkpoint written by `save_mtp_checkpoint` (its MTP weights are not loaded)."""
    from transformers.utils import logging

    from frspec.models.loading import load_model

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # the MTP tensors are "unexpected" keys for the target alone
    try:
        model = load_model(str(root), dtype=dtype)
    finally:
        logging.set_verbosity(verbosity)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model
