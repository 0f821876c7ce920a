"""GGUF 4-bit blocks convert to int4 groups exactly (checked against gguf's own dequantize), the cache of
converted weights is reused, checked and rebuilt, and `load_model(quant=...)` computes what the GGUF holds."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from transformers import Qwen2Config, Qwen2ForCausalLM

from frspec.errors import FrspecError
from frspec.models import gguf_quant, quant_cache
from frspec.models.gguf_quant import hf_linear_name, int4_from_q4_k
from frspec.models.loading import load_model
from frspec.models.quant import Int4Linear, Int8Linear

from tests.models.tiny_gguf_models import gguf_name, tiny_vocab

HIDDEN, FFN, LAYERS = 256, 512, 2


def random_q4_k(n: int, k: int, seed: int = 0) -> np.ndarray:
    """Valid Q4_K blocks for an [n, k] matrix: random codes and 6-bit scales/minimums, small finite d and dmin."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n * k // 256, 144), dtype=np.uint8)
    blocks[:, 0:2] = (rng.uniform(2e-4, 6e-4, size=(blocks.shape[0], 1))).astype(np.float16).view(np.uint8)
    blocks[:, 2:4] = (rng.uniform(1e-4, 4e-4, size=(blocks.shape[0], 1))).astype(np.float16).view(np.uint8)
    return blocks.reshape(n, k // 256 * 144)


def test_q4_k_blocks_are_int4_groups_of_32_exactly():
    blocks = random_q4_k(48, 512)
    w = int4_from_q4_k(blocks, 48, 512)
    assert w.group_size == 32 and w.codes.shape == (48, 512) and w.scale.shape == (48, 16)
    ref = gguf.quants.dequantize(blocks, T.Q4_K).reshape(48, 512)
    assert np.array_equal(w.dequantize().numpy(), ref)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1])
def test_q4_0_and_q4_1_are_exact_too(qtype):
    data = np.random.default_rng(1).normal(size=(16, 96)).astype(np.float32)
    blocks = gguf.quants.quantize(data, qtype)
    w = gguf_quant.exact_int4_types()[qtype](blocks, 16, 96)
    ref = gguf.quants.dequantize(blocks, qtype).reshape(16, 96)
    np.testing.assert_allclose(w.dequantize().numpy(), ref, rtol=0, atol=1e-6)


def test_gguf_names():
    assert hf_linear_name("blk.3.ffn_up.weight") == "model.layers.3.mlp.up_proj"
    assert hf_linear_name("blk.0.attn_output.weight") == "model.layers.0.self_attn.o_proj"
    assert hf_linear_name("output.weight") == "lm_head"
    assert hf_linear_name("blk.0.attn_q.bias") is None and hf_linear_name("token_embd.weight") is None


def write_q4_k_gguf(path, seed=0, head_type=T.Q8_0):
    """A tiny Qwen2 GGUF shaped like a Q4_K_M file: Q4_K matrices, a Q8_0 output head (as in the 0.5B file), F32 norms and
    biases. The returned model is unused: the test compares against what transformers reads from the file."""
    tokens, merges = tiny_vocab()
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tokens), hidden_size=HIDDEN, intermediate_size=FFN,
                         num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).eval()
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("tiny-q4k")
    w.add_context_length(128)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_embedding_length(HIDDEN)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(model.config.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(model.config.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - 2) + [gguf.TokenType.CONTROL] * 2)
    w.add_token_merges(merges)
    w.add_bos_token_id(len(tokens) - 2)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_add_bos_token(False)
    for i, (name, tensor) in enumerate(model.state_dict().items()):
        data = tensor.detach().float().numpy()
        if name == "lm_head.weight":
            blocks = gguf.quants.quantize(data, head_type)
            w.add_tensor(gguf_name(name), blocks, raw_shape=blocks.shape, raw_dtype=head_type)
        elif data.ndim == 2:
            blocks = random_q4_k(*data.shape, seed=seed + i)
            w.add_tensor(gguf_name(name), blocks, raw_shape=blocks.shape, raw_dtype=T.Q4_K)
        else:
            w.add_tensor(gguf_name(name), data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def q4k_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-q4k.gguf"
    write_q4_k_gguf(path)
    return path


def _logits(model, ids=(5, 258, 17, 262, 99, 3, 44)):
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits.float()


def test_load_model_int4_from_q4_k_computes_the_ggufs_own_weights(q4k_gguf, cache_root):
    plain = load_model(q4k_gguf, dtype="fp32")  # transformers' dequantization of the same blocks, stored in bf16
    model = load_model(q4k_gguf, dtype="fp32", quant="int4")
    assert isinstance(model.model.layers[0].mlp.up_proj, Int4Linear)
    assert isinstance(model.lm_head, Int4Linear)
    entries = list((cache_root / "quantized").iterdir())
    assert len(entries) == 1 and entries[0].name.endswith("-int4-g32")
    marker = quant_cache.read_marker(entries[0])
    assert len(marker["exact"]) == 7 * LAYERS and "lm_head" not in marker["exact"]  # the Q8_0 head is re-rounded
    # Exact conversions: the int4 layer reproduces the GGUF's values (the plain cache holds them rounded to bf16).
    up = model.model.layers[1].mlp.up_proj
    ref = plain.model.layers[1].mlp.up_proj.weight
    x = torch.randn(3, HIDDEN)
    torch.testing.assert_close(up(x), x @ ref.t(), atol=2e-2, rtol=1e-2)
    head_dense = plain.lm_head.weight
    ref_model = plain
    with torch.no_grad():
        ref_model.lm_head.weight.copy_(quant_cache.from_tensors(
            quant_cache.load_file(entries[0] / quant_cache.WEIGHTS), 32)["lm_head"].dequantize())
    torch.testing.assert_close(_logits(model), _logits(ref_model), atol=0.05, rtol=0.01)
    assert head_dense is ref_model.lm_head.weight


def test_cached_weights_are_reused_and_a_damaged_entry_is_rebuilt(q4k_gguf, cache_root, monkeypatch):
    first = load_model(q4k_gguf, dtype="fp32", quant="int4")
    calls = []
    real = gguf_quant.read_gguf_linears
    monkeypatch.setattr(gguf_quant, "read_gguf_linears", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = load_model(q4k_gguf, dtype="fp32", quant="int4")
    assert calls == []
    torch.testing.assert_close(_logits(again), _logits(first))
    entry = next((cache_root / "quantized").iterdir())
    weights = entry / quant_cache.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0xFF  # same size, different bytes
    weights.write_bytes(bytes(data))
    rebuilt = load_model(q4k_gguf, dtype="fp32", quant="int4")
    assert calls == [1]
    torch.testing.assert_close(_logits(rebuilt), _logits(first))


def test_int8_from_gguf_and_wrong_layouts_are_refused(q4k_gguf, cache_root, monkeypatch):
    model = load_model(q4k_gguf, dtype="fp32", quant="int8")
    assert isinstance(model.model.layers[0].self_attn.q_proj, Int8Linear)
    # A converter that misplaces rows must fail the check against the model's own weights, before caching.
    real = gguf_quant.int4_from_q4_k

    def permuted(blocks, n, k):
        w = real(blocks, n, k)
        w.codes = w.codes.flip(0)
        return w

    monkeypatch.setattr(gguf_quant, "exact_int4_types", lambda: {T.Q4_K: permuted})
    with pytest.raises(FrspecError, match="tensor layout is not supported"):
        load_model(q4k_gguf, dtype="fp32", quant="int4", cache_dir=cache_root / "other")
    assert not (cache_root / "other" / "quantized").exists() or not any((cache_root / "other" / "quantized").iterdir())


def test_float_checkpoints_are_quantized_group_wise_at_load(tmp_path):
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "m")
    model = load_model(tmp_path / "m", dtype="fp32", quant="int4", quantize_head=False)
    assert isinstance(model.model.layers[0].mlp.down_proj, Int4Linear)
    assert isinstance(model.lm_head, torch.nn.Linear)
    with pytest.raises(FrspecError, match="unknown quantization"):
        load_model(tmp_path / "m", quant="int2")
