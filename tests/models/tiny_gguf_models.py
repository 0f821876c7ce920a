"""Tiny real-architecture models for the model tests: a Qwen2 GGUF written with the `gguf` package, with
a byte-level BPE tokenizer in its metadata, exactly the way llama.cpp lays out the default models' files."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 32, 2, 4, 2, 64

# HF parameter name inside layer i -> GGUF tensor name inside block i (llama.cpp's qwen2 names).
BLOCK_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}


def tiny_vocab() -> tuple[list[str], list[str]]:
    """All 256 byte tokens, a few merges, and two control tokens: a small but real byte-level BPE vocabulary."""
    merges = ["h e", "l l", "he ll", "Ġ t", "Ġt h"]
    merged = ["he", "ll", "hell", "Ġt", "Ġth"]
    return list(bytes_to_unicode().values()) + merged + ["<|endoftext|>", "<|im_end|>"], merges


def tiny_qwen2(vocab_size: int = 263, seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(config).eval()


def gguf_name(hf_name: str) -> str:
    if hf_name in TOP_NAMES:
        return TOP_NAMES[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)  # model.layers.<i>.<rest>
    return f"blk.{layer}.{BLOCK_NAMES[rest]}"


def write_tiny_gguf(path: Path, seed: int = 0, quantize: bool = False) -> Qwen2ForCausalLM:
    """Write a tiny Qwen2 GGUF; return the fp32 HF model with the same weights.

    quantize=True stores the 2-D weights as Q8_0 blocks (norms and biases stay F32, as llama.cpp does), so
    loading has to dequantize; the returned model then holds the dequantized values.
    """
    tokens, merges = tiny_vocab()
    model = tiny_qwen2(len(tokens), seed)
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("tiny-qwen2")
    writer.add_context_length(128)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_embedding_length(HIDDEN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(model.config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(model.config.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quantize else gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - 2) + [gguf.TokenType.CONTROL] * 2)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(len(tokens) - 2)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_add_bos_token(False)
    state = {}
    for name, tensor in model.state_dict().items():
        data = tensor.detach().float().numpy().astype(np.float32)
        if quantize and data.ndim == 2:
            blocks = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(gguf_name(name), blocks, raw_shape=blocks.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            data = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0).reshape(data.shape)
        else:
            writer.add_tensor(gguf_name(name), data)
        state[name] = torch.from_numpy(np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    model.load_state_dict(state)
    return model


def logits(model, ids=(5, 258, 17, 262, 99)) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits.float()
