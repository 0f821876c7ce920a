"""Int4/int8 linear layers: exact against their own dequantized weights, the kernel dispatch per device, and
greedy speculative decoding with quantized targets and drafts equal to the quantized target's own output."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from frspec.errors import FrspecError
from frspec.models import quant_kernels as K
from frspec.models.quant import (
    Int4Linear, Int8Linear, parse_quant, quantize_head, quantize_int4, quantize_int8,
    quantize_linear, quantize_model,
)

from tests.decode.spec_tiny import hf_greedy, noisy_copy, tiny_lm


def _linear(n, k, bias=True, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias).to(dtype)
    return lin


def test_int4_codes_reconstruct_within_half_a_step():
    w = torch.randn(48, 128)
    q = quantize_int4(w, 32)
    assert q.codes.dtype == torch.uint8 and int(q.codes.max()) <= 15 and q.scale.shape == (48, 4)
    err = (q.dequantize() - w).abs().view(48, 4, 32)
    assert bool((err <= q.scale[..., None] / 2 + 1e-6).all())
    q8 = quantize_int8(w)
    assert bool(((q8.dequantize() - w).abs() <= q8.scale[:, None] / 2 + 1e-6).all())


@pytest.mark.parametrize("n", [32, 24, 5])  # 24 and 5: rows padded to the CPU kernel's multiple of 16
@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_quantized_linear_equals_its_dequantized_weight(n, quant):
    lin = _linear(n, 64)
    q = quantize_linear(lin, quant)
    assert q.kernel in (K.CPU_INT4, K.INT8)
    w = (quantize_int4(lin.weight, 32) if quant == "int4" else quantize_int8(lin.weight)).dequantize()
    for rows in (1, 3, 7):
        x = torch.randn(2, rows, 64)
        torch.testing.assert_close(q(x), nn.functional.linear(x, w, lin.bias), atol=1e-4, rtol=1e-4)


def test_int8_weights_at_an_unaligned_address_are_realigned():
    # The cached models' int8 matrices are slices of the safetensors buffer; at an address not on a 64-byte
    # boundary `_weight_int8pack_mm` segfaults on prompts of ~100+ rows (the 1.5B model's 128-token prefill did).
    w = quantize_int8(torch.randn(64, 256))
    buf = torch.empty(64 * 256 + 64, dtype=torch.int8)
    unaligned = buf[24:24 + 64 * 256].view(64, 256)
    unaligned.copy_(w.values)
    assert unaligned.data_ptr() % K.KERNEL_ALIGNMENT
    layer = Int8Linear(type(w)(unaligned, w.scale), None, torch.bfloat16, torch.device("cpu"))
    assert layer.kernel == K.INT8 and layer.values.data_ptr() % K.KERNEL_ALIGNMENT == 0
    assert layer.scale.data_ptr() % K.KERNEL_ALIGNMENT == 0
    x = torch.randn(128, 256)
    torch.testing.assert_close(layer(x.bfloat16()).float(), x @ w.dequantize().t(), atol=0.5, rtol=0.05)


def test_bf16_int4_runs_the_cpu_kernel_close_to_fp32():
    lin = _linear(64, 128, dtype=torch.bfloat16)
    q = quantize_linear(lin, "int4")
    assert q.kernel == K.CPU_INT4 and q.scales_and_zeros.dtype == torch.bfloat16
    x = torch.randn(3, 128)
    ref = nn.functional.linear(x, quantize_int4(lin.weight, 32).dequantize(), lin.bias.float())
    torch.testing.assert_close(q(x.bfloat16()).float(), ref, atol=0.1, rtol=0.02)


def test_unsupported_shapes_and_dtypes_fall_back_without_changing_results():
    lin = _linear(16, 48)  # 48 is not a multiple of 32: int4 cannot group it, so the layer takes int8
    assert isinstance(quantize_linear(lin, "int4"), Int8Linear)
    lin64 = _linear(16, 64, dtype=torch.float64)
    q = quantize_linear(lin64, "int4")
    assert q.kernel == K.DEQUANT  # no fp64 int4 kernel
    x = torch.randn(2, 64, dtype=torch.float64)
    w = quantize_int4(lin64.weight, 32).dequantize().double()
    torch.testing.assert_close(q(x), nn.functional.linear(x, w, lin64.bias))


def test_kernel_dispatch_per_device():
    cuda_build = lambda op, dev: (op, dev) in {("_weight_int4pack_mm", "cuda")}  # noqa: E731
    assert K.int4_kernel("cuda", torch.bfloat16, 1536, 32, available=cuda_build) == K.CUDA_INT4
    assert K.int4_kernel("cuda", torch.float16, 1536, 32, available=cuda_build) == K.DEQUANT  # tinygemm: bf16 only
    assert K.int4_kernel("cuda", torch.bfloat16, 48, 32, available=cuda_build) == K.DEQUANT
    assert K.int4_kernel("cuda", torch.bfloat16, 1536, 16, available=cuda_build) == K.DEQUANT
    assert K.int4_kernel("cpu", torch.bfloat16, 1536, 32, available=cuda_build) == K.DEQUANT
    assert K.int8_kernel("cuda", torch.bfloat16, available=cuda_build) == K.DEQUANT
    assert K.int4_kernel("cpu", torch.float32, 896, 32) == K.CPU_INT4
    assert K.int8_kernel("cpu", torch.bfloat16) == K.INT8
    assert K.int4_kernel("mps", torch.bfloat16, 896, 32) == K.DEQUANT
    assert [K.cuda_inner_k_tiles(k) for k in (1536, 8960, 896, 96, 48)] == [8, 8, 8, 2, None]


def test_scales_and_zeros_follow_the_kernels_minus_eight_convention():
    q = quantize_int4(torch.randn(16, 64), 32)
    sz = K.scales_and_zeros(q.scale, q.minimum, torch.float32)
    assert sz.shape == (2, 16, 2)
    w = (q.codes.float().view(16, 2, 32) - 8) * sz[..., 0].t()[..., None] + sz[..., 1].t()[..., None]
    torch.testing.assert_close(w.view(16, 64), q.dequantize())


def test_parse_quant():
    assert parse_quant(None) is None and parse_quant("none") is None and parse_quant("INT4") == "int4"
    with pytest.raises(FrspecError, match="unknown quantization"):
        parse_quant("int3")


def _tiny_target(tie=False):
    return tiny_lm("qwen2", 256, hidden=64, tie=tie, seed=0, dtype=torch.float32)


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_quantize_model_replaces_every_linear_and_keeps_embeddings(quant):
    model = _tiny_target(tie=True)
    embed = model.get_input_embeddings().weight.clone()
    ref = copy.deepcopy(model)
    quantize_model(model, quant)
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert isinstance(model.get_output_embeddings(), Int4Linear if quant == "int4" else Int8Linear)
    assert torch.equal(model.get_input_embeddings().weight, embed)  # a tied embedding is not touched
    # Same logits as the float model holding the dequantized weights.
    with torch.no_grad():
        for name, m in ref.named_modules():
            if isinstance(m, nn.Linear):
                w = quantize_int4(m.weight, 32) if quant == "int4" else quantize_int8(m.weight)
                m.weight = nn.Parameter(w.dequantize())
        ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, atol=1e-4, rtol=1e-4)


def test_int8_without_a_kernel_on_the_device_says_it_is_slower(monkeypatch, caplog):
    """CUDA has no weight-only int8 kernel: loading int8 there says, in one line, that every call dequantizes (an
    H200 ran a 248k head 8.5x slower than bf16). The CPU has the kernel: nothing is said."""
    import logging

    with caplog.at_level(logging.WARNING, logger="frspec"):
        quantize_model(_tiny_target(tie=True), "int8")
    assert not caplog.records
    monkeypatch.setattr(K, "int8_kernel", lambda device_type, dtype: K.DEQUANT)  # as on CUDA
    with caplog.at_level(logging.WARNING, logger="frspec"):
        model = quantize_model(_tiny_target(tie=True), "int8")
    assert all(m.kernel == K.DEQUANT for m in model.modules() if isinstance(m, Int8Linear))
    [record] = caplog.records
    assert "no weight-only kernel" in record.getMessage() and "slower than bf16" in record.getMessage()


def test_quantize_head_covers_full_and_draft_vocab_heads():
    from frspec.vocab.draft_vocab import DraftVocab
    from frspec.vocab.token_map import TokenMap

    weight = torch.randn(256, 64)
    before = weight.clone()
    ids = torch.tensor(list(range(0, 256, 3)))
    hidden = torch.randn(2, 64)
    pruned = quantize_head(DraftVocab.build(weight, token_map=TokenMap(ids.tolist(), 256)), "int4")
    assert isinstance(pruned.head, Int4Linear) and pruned.size == len(ids)
    assert torch.equal(pruned.to_target(torch.tensor([0, 2])), ids[[0, 2]])
    ref = hidden @ quantize_int4(weight[ids], 32).dequantize().t()
    torch.testing.assert_close(pruned.logits(hidden), ref, atol=1e-4, rtol=1e-4)
    assert torch.equal(weight, before)  # the source rows are copied, never quantized in place
    vocab = DraftVocab.build(weight, token_map=TokenMap(ids.tolist(), 256))
    assert quantize_head(vocab, "int8") is vocab and isinstance(vocab.head, Int8Linear)
    assert vocab.logits(hidden).shape == (2, len(ids))
    full = nn.Linear(64, 256, bias=False)
    assert isinstance(quantize_head(full, "int4"), Int4Linear)
    with pytest.raises(FrspecError, match="cannot quantize"):
        quantize_head(nn.Identity(), "int4")


@pytest.mark.parametrize("quant", ["int4", "int8"])
@pytest.mark.parametrize("tie", [False, True])
def test_speculative_output_equals_the_quantized_targets_own(quant, tie):
    from frspec.decode.factory import build_generator
    from frspec.vocab.token_map import TokenMap

    target = quantize_model(_tiny_target(tie), quant)
    draft = quantize_model(noisy_copy(_tiny_target(tie), 0.05, seed=1), quant, head=False)
    gen = torch.Generator().manual_seed(5)
    # The last prompt is prefilled by the float GEMM over dequantized weights (quant_kernels.*_DEQUANT_ROWS).
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (3, 7, 12, K.INT4_DEQUANT_ROWS + 20)]
    refs = [hf_greedy(target, p, 16) for p in prompts]
    vanilla = build_generator(target)
    keep = torch.randperm(256, generator=gen)[:128].tolist()
    accepted = 0
    for token_map in (None, TokenMap(keep, 256)):
        for k in (1, 3, 5):
            spec = build_generator(target, draft, token_map, num_spec_tokens=k, draft_head_quant=quant)
            assert isinstance(spec.drafter.vocab.head, Int4Linear if quant == "int4" else Int8Linear)
            for prompt, ref in zip(prompts, refs):
                assert vanilla.generate(input_ids=prompt, max_new_tokens=16, eos_token_ids=[]).token_ids == ref
                out = spec.generate(input_ids=prompt, max_new_tokens=16, eos_token_ids=[])
                assert out.token_ids == ref, f"map={token_map is not None} k={k} prompt={prompt}"
                accepted += sum(out.stats.accepted_per_position)
    assert accepted > 0


def test_the_cpu_int4_layout_cut_at_its_row_block_is_the_packing_of_the_first_rows():
    # first_rows rests on this: the first k rows of a packed weight (k a multiple of the block) are the packing of
    # the weight's first k rows. Checked on a larger weight than cpu_int4_row_block's own probe.
    block = K.cpu_int4_row_block()
    assert block in (16, 32, 64, 128)
    codes = torch.randint(0, 16, (block * 5 + 16, 96), generator=torch.Generator().manual_seed(3), dtype=torch.int32)
    whole = K.pack_int4_cpu(codes)
    for m in (block, 2 * block, 5 * block):
        assert torch.equal(K.pack_int4_cpu(codes[:m]), whole[:m])


@pytest.mark.parametrize("quant", ["int4", "int8"])
@pytest.mark.parametrize("bias", [True, False])
def test_first_rows_compute_the_first_outputs_from_the_same_packed_weight(quant, bias):
    """A ranked head quantized once serves every map size through first_rows(k): the same outputs as the whole
    layer's first k, and as a layer quantized from the first k rows alone, over views of the one weight."""
    lin = _linear(300, 64, bias=bias, dtype=torch.bfloat16)
    layer = quantize_linear(lin, quant)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    whole = layer(x)
    stored = layer.packed if quant == "int4" else layer.values
    for k in (1, 40, 64, 128, 200, 300):
        part = layer.first_rows(k)
        y = part(x)
        assert y.shape == (3, k) and torch.equal(y, whole[:, :k])
        alone = nn.Linear(64, k, bias=bias).to(torch.bfloat16)
        alone.weight.data, alone.bias = lin.weight.data[:k], (lin.bias if bias else None)
        if bias:
            alone.bias = nn.Parameter(lin.bias.data[:k])
        assert torch.equal(quantize_linear(alone, quant)(x), y)
        mine = part.packed if quant == "int4" else part.values
        assert mine.untyped_storage().data_ptr() == stored.untyped_storage().data_ptr()  # a view, not a copy
    for bad in (0, 301, 2.5, True):
        with pytest.raises(FrspecError, match="k must be an integer"):
            layer.first_rows(bad)


def test_first_rows_refuses_a_layout_it_cannot_cut_in_one_line(monkeypatch):
    layer = quantize_linear(_linear(128, 64, dtype=torch.bfloat16), "int4")
    monkeypatch.setattr(K, "cpu_int4_row_block", lambda: None)
    with pytest.raises(FrspecError, match="cannot be cut to its first rows"):
        layer.first_rows(64)


@pytest.mark.parametrize("split_halves", [True, False])
@pytest.mark.parametrize("rows, in_features", [(64, 32), (176, 96), (16, 64), (320, 256)])
def test_unpacking_the_cpu_int4_layout_gives_back_the_codes(rows, in_features, split_halves, monkeypatch):
    """Both readings of the packing: the reshape this build's layout allows (full 64-row blocks; checked once per
    process) and the general gather (a last, shorter block; a build with another layout)."""
    if split_halves:
        assert K.cpu_int4_split_halves(), "this build's CPU int4 layout is not the one measured (64-row blocks)"
    else:
        monkeypatch.setattr(K, "cpu_int4_split_halves", lambda: False)
    codes = torch.randint(0, 16, (rows, in_features), generator=torch.Generator().manual_seed(rows), dtype=torch.int32)
    assert torch.equal(K.unpack_int4_cpu(K.pack_int4_cpu(codes), in_features), codes.to(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_prefills_dequantized_int4_weight_is_the_kernels_weight(dtype, monkeypatch):
    """The weight a prefill's float GEMM multiplies by, in blocks of rows (three here, the last one short), is the
    weight the kernel holds ((code - 8) * scale + zero, its scale and zero in the activations' dtype) rounded to
    that dtype."""
    from frspec.models import quant as Q

    monkeypatch.setattr(Q, "DEQUANT_BLOCK_ROWS", 64)
    lin = _linear(176, 96, dtype=dtype)  # 176 rows: two full 64-row blocks and a short one
    layer = quantize_linear(lin, "int4")
    expected = layer._unpacked().dequantize()  # in fp32
    got = layer._dequantized(dtype, torch.zeros(1, 96, dtype=dtype))
    assert got.dtype == dtype and got.shape == expected.shape
    torch.testing.assert_close(got.float(), expected, rtol=2 ** -8 if dtype == torch.bfloat16 else 1e-6, atol=1e-6)


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_a_prefill_runs_the_float_gemm_over_the_dequantized_weight(quant, monkeypatch):
    """From *_DEQUANT_ROWS rows on, the layer dequantizes its weight and multiplies in float (the weight-only kernels
    slow down with rows); fewer rows run the kernel. Both compute the same product of the same weight."""
    lin = _linear(40, 64, dtype=torch.float32)  # 40 rows: padded to the int4 kernel's 48
    layer = quantize_linear(lin, quant)
    weight = (quantize_int4(lin.weight) if quant == "int4" else quantize_int8(lin.weight)).dequantize()
    calls = []
    kernel = "int4_mm" if quant == "int4" else "int8_mm"
    real = getattr(K, kernel)
    monkeypatch.setattr(K, kernel, lambda *a: calls.append(1) or real(*a))
    threshold = K.INT4_DEQUANT_ROWS if quant == "int4" else K.INT8_DEQUANT_ROWS
    for rows in (1, threshold - 1, threshold, 2 * threshold):
        x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))
        calls.clear()
        torch.testing.assert_close(layer(x), nn.functional.linear(x, weight, lin.bias), rtol=1e-4, atol=1e-4)
        assert bool(calls) == (rows < threshold)
