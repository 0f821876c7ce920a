"""Wide half-precision linear calls through fp32 (models/wide_linear.py): which calls widen, that they compute the
widened product rounded back, that narrow calls keep the half kernel bit for bit, and where layers are swapped."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from frspec.models import wide_linear as W
from frspec.models.loading import load_model
from frspec.models.quant import quantize_linear

from tests.models.tiny_gguf_models import logits, tiny_qwen2


def _inputs(rows: int, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(rows)
    return (torch.randn(rows, 48, generator=gen).to(dtype), torch.randn(40, 48, generator=gen).to(dtype),
            torch.randn(40, generator=gen).to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_wide_calls_compute_in_fp32_and_round_back_narrow_calls_keep_the_half_kernel(widen, dtype):
    widen(True)
    x, w, b = _inputs(W.WIDE_ROWS, dtype)
    assert torch.equal(W.linear(x, w, b), F.linear(x.float(), w.float(), b.float()).to(dtype))
    assert W.linear(x, w, b).dtype == dtype
    x, w, b = _inputs(W.WIDE_ROWS - 1, dtype)
    assert torch.equal(W.linear(x, w, b), F.linear(x, w, b))
    # Rows are counted over the leading dimensions: a (1, n, hidden) prefill is n rows.
    x, w, b = _inputs(W.WIDE_ROWS, dtype)
    assert torch.equal(W.linear(x[None], w, b)[0], F.linear(x.float(), w.float(), b.float()).to(dtype))


def test_nothing_widens_where_the_machine_does_not_gain_or_the_dtype_is_already_wide(widen):
    widen(False)
    x, w, b = _inputs(4 * W.WIDE_ROWS)
    assert torch.equal(W.linear(x, w, b), F.linear(x, w, b))
    assert W.wide_rows(torch.bfloat16, torch.device("cpu")) is None
    widen(True)
    x, w, b = _inputs(4 * W.WIDE_ROWS, torch.float32)
    assert torch.equal(W.linear(x, w, b), F.linear(x, w, b))
    assert W.wide_rows(torch.float32, torch.device("cpu")) is None
    assert W.wide_rows(torch.bfloat16, torch.device("cpu")) == W.WIDE_ROWS


def test_the_measurement_answers_once_per_dtype(monkeypatch):
    monkeypatch.delenv(W.ENV, raising=False)
    W.fp32_is_faster.cache_clear()
    try:
        first = W.fp32_is_faster(torch.bfloat16)
        assert isinstance(first, bool) and W.fp32_is_faster(torch.bfloat16) is first
        assert W.fp32_is_faster.cache_info().hits >= 1
    finally:
        W.fp32_is_faster.cache_clear()


def test_swapped_layers_share_parameters_keep_ties_and_narrow_outputs(widen):
    widen(True)
    model = tiny_qwen2(vocab_size=96).to(torch.bfloat16)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as in models with tied embeddings
    reference = tiny_qwen2(vocab_size=96).to(torch.bfloat16)
    reference.lm_head.weight = reference.model.embed_tokens.weight
    reference.load_state_dict(model.state_dict())
    linears = sum(type(m) is nn.Linear for m in model.modules())
    params = {id(p) for p in model.parameters()}
    assert W.use_wide_linears(model) == linears > 0
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert {id(p) for p in model.parameters()} == params  # the same tensors, nothing copied
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = (1, 2, 3)  # fewer rows than WIDE_ROWS: the half kernel, bit for bit
    assert torch.equal(logits(model, ids=ids), logits(reference, ids=ids))
    long = tuple(range(1, 2 * W.WIDE_ROWS))  # a prefill: through fp32, close to the half kernel's result
    assert torch.allclose(logits(model, ids=long), logits(reference, ids=long), atol=0.1)
    assert W.use_wide_linears(tiny_qwen2(vocab_size=96)) == 0  # fp32: nothing to widen


def test_load_model_swaps_half_models_only(tmp_path, widen):
    widen(True)
    path = tmp_path / "tiny-hf"
    tiny_qwen2(vocab_size=96).save_pretrained(path)
    assert any(isinstance(m, W.WideLinear) for m in load_model(path, dtype="bf16").modules())
    assert not any(isinstance(m, W.WideLinear) for m in load_model(path, dtype="fp32").modules())
    quantized = load_model(path, dtype="bf16", quant="int8")  # quantization replaces the (wide) linears
    assert not any(isinstance(m, (W.WideLinear, nn.Linear)) for m in quantized.model.layers.modules())


def test_a_quantized_layers_dequantized_prefill_widens_too(widen):
    torch.manual_seed(0)
    layer = quantize_linear(nn.Linear(64, 32, bias=False).to(torch.bfloat16), "int8")
    x = torch.randn(256, 64).to(torch.bfloat16)  # past INT8_DEQUANT_ROWS: the dequantized GEMM
    widen(True)
    wide = layer(x)
    assert torch.equal(wide, F.linear(x.float(), layer.values.to(x.dtype).float()).to(x.dtype) * layer.scale)
    widen(False)
    assert torch.equal(layer(x), F.linear(x, layer.values.to(x.dtype)) * layer.scale)
