"""One reused buffer for a weight that lives for one call (models/call_weight.py): reused where nothing keeps the
weight, fresh where autograd could or the weight is too large, and every layer's product right although they share
it (int4 and int8 prefills dequantized into it, bf16 calls widened into it)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from frspec.models import call_weight as C
from frspec.models import quant_kernels as K
from frspec.models import wide_linear as W
from frspec.models.quant import quantize_linear


def test_the_buffer_is_reused_grown_and_skipped_where_autograd_or_size_forbid(monkeypatch):
    x = torch.zeros(2, 3)
    a = C.call_weight((4, 8), torch.float32, x)
    b = C.call_weight((8, 2), torch.float32, x)
    assert b.data_ptr() == a.data_ptr() and b.shape == (8, 2)  # the same storage, viewed anew
    grown = C.call_weight((64, 64), torch.float32, x)
    assert C.call_weight((4, 8), torch.float32, x).data_ptr() == grown.data_ptr()
    assert C.call_weight((4, 8), torch.bfloat16, x).data_ptr() != grown.data_ptr()  # one buffer per dtype
    assert C.call_weight((4, 8), torch.float32, x.requires_grad_()).data_ptr() != grown.data_ptr()
    with torch.no_grad():  # nothing is recorded: reused again
        assert C.call_weight((4, 8), torch.float32, x).data_ptr() == grown.data_ptr()
    monkeypatch.setattr(C, "MAX_BYTES", 64 * 64 * 4 - 1)
    assert C.call_weight((64, 64), torch.float32, torch.zeros(1)).data_ptr() != grown.data_ptr()


def test_each_thread_has_its_own_buffer():
    import threading

    x = torch.zeros(1)
    here = C.call_weight((4, 8), torch.float32, x).data_ptr()
    there = []
    thread = threading.Thread(target=lambda: there.append(C.call_weight((4, 8), torch.float32, x).data_ptr()))
    thread.start()
    thread.join()
    assert there and there[0] != here
    assert C.call_weight((4, 8), torch.float32, x).data_ptr() == here  # this thread's buffer is still its own


@pytest.mark.parametrize("first", ["inference_mode", "no_grad"])
def test_the_buffer_is_written_in_and_out_of_inference_mode(first, widen):
    """A buffer first made under inference mode is written outside it, and the other way round (an inference tensor
    would refuse the in-place write outside); in a thread of its own, so the buffer is made here."""
    widen(True)
    modes = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad}
    errors = []

    def calls():
        try:
            for mode in (first, "no_grad" if first == "inference_mode" else "inference_mode", first):
                with modes[mode]():
                    C.call_weight((4, 8), torch.float32, torch.zeros(1)).fill_(1.0)
                    W.linear(torch.ones(W.WIDE_ROWS, 8).to(torch.bfloat16), torch.ones(4, 8).to(torch.bfloat16))
        except RuntimeError as e:
            errors.append(e)

    import threading

    thread = threading.Thread(target=calls)
    thread.start()
    thread.join()
    assert not errors, errors


def _layers(quant: str, dtype: torch.dtype) -> list[nn.Module]:
    torch.manual_seed(0)
    return [quantize_linear(nn.Linear(64, n, bias=True).to(dtype), quant) for n in (96, 48)]


@pytest.mark.parametrize("quant", ["int4", "int8"])
@pytest.mark.parametrize("wide", [True, False])
def test_layers_sharing_the_buffer_each_multiply_by_their_own_weight(quant, wide, widen, monkeypatch):
    """Two quantized layers called in turn over prefill rows (past the dequantizing threshold), bf16 activations
    widened to fp32 or not: each output is its own weight's product, the second call to the first layer included
    (the buffer held the second layer's weight in between)."""
    widen(wide)
    monkeypatch.setattr(K, "INT4_DEQUANT_ROWS", 32)
    monkeypatch.setattr(K, "INT4_DEQUANT_ROWS_WIDENED", 32)
    monkeypatch.setattr(K, "INT8_DEQUANT_ROWS", 32)
    first, second = _layers(quant, torch.bfloat16)
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    expected = [_reference(layer, x) for layer in (first, second)]
    for _ in range(2):
        for layer, want in zip((first, second), expected):
            torch.testing.assert_close(layer(x), want, rtol=0.02, atol=0.02)  # bf16 rounding; a wrong weight: O(1)


def _reference(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The layer's product spelt out in fp32 from its stored weight, rounded to the activations' dtype."""
    if hasattr(layer, "values"):  # int8: values * per-row scale
        weight = layer.values.float() * layer.scale.float()[:, None]
    else:
        weight = layer._unpacked().dequantize()[: layer.out_features]
    return (F.linear(x.float(), weight) + layer.bias.float()).to(x.dtype)


def test_a_widened_call_under_autograd_keeps_its_own_weight(widen):
    """A wide bf16 call whose input requires grad multiplies by a weight of its own: another call in between cannot
    change the gradient (it would, through a shared buffer)."""
    widen(True)
    torch.manual_seed(0)
    a, b = nn.Linear(16, 8, bias=False).to(torch.bfloat16), nn.Linear(16, 8, bias=False).to(torch.bfloat16)
    x = torch.randn(W.WIDE_ROWS, 16).to(torch.bfloat16).requires_grad_()
    y = W.linear(x, a.weight)
    with torch.no_grad():
        W.linear(torch.randn(W.WIDE_ROWS, 16).to(torch.bfloat16), b.weight)  # fills the shared buffer with b
    y.float().sum().backward()
    expected = a.weight.float().sum(0).expand(W.WIDE_ROWS, 16).to(torch.bfloat16)
    torch.testing.assert_close(x.grad, expected)
    assert a.weight.grad is not None  # and the weight's own gradient flowed
