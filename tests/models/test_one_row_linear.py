"""One-row half-precision linear calls on the native kernel where oneDNN's is slower (models/one_row_linear.py):
which calls it takes, that they are F.linear with oneDNN off for that call alone, and that the rest is untouched."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from frspec.models import one_row_linear as O
from frspec.models import wide_linear as W


@pytest.fixture
def native(monkeypatch):
    """Force the machine's answer (the measurement is per process and cached)."""

    def set_to(on: bool) -> None:
        monkeypatch.setenv(O.ENV, "1" if on else "0")
        O.native_is_faster.cache_clear()

    yield set_to
    O.native_is_faster.cache_clear()


def _inputs(rows: int, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(rows)
    return (torch.randn(1, rows, 64, generator=gen).to(dtype), torch.randn(96, 64, generator=gen).to(dtype),
            torch.randn(96, generator=gen).to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_one_row_call_runs_without_onednn_and_leaves_it_on_for_the_rest(native, monkeypatch, dtype):
    native(True)
    seen, real = [], F.linear  # oneDNN's switch as each F.linear call found it

    def recorded(*args):
        seen.append(torch.backends.mkldnn.enabled)
        return real(*args)

    monkeypatch.setattr(O.F, "linear", recorded)
    x, w, b = _inputs(1, dtype)
    assert O.applies(x) and O.applies(x[0, 0])
    y = W.linear(x, w, b)
    assert seen == [False] and torch.backends.mkldnn.enabled  # off for the call, back on after it
    assert torch.allclose(y.float(), real(x, w, b).float(), atol=0.05)  # the same product, another kernel's rounding
    x, w, b = _inputs(2, dtype)
    assert not O.applies(x)
    assert torch.equal(W.linear(x, w, b), real(x, w, b)) and seen == [False, True]  # the default kernel
    x32, w32, b32 = (t.float() for t in _inputs(1))
    assert not O.applies(x32)  # fp32 keeps its kernel: the fp32 identity tests run on the same code as before


def test_nothing_changes_where_the_machine_does_not_gain(native):
    native(False)
    x, w, b = _inputs(1)
    assert not O.applies(x) and not O.on_this_machine(torch.bfloat16, torch.device("cpu"))
    assert torch.equal(W.linear(x, w, b), F.linear(x, w, b))


def test_onednn_is_switched_back_on_when_the_call_fails(native):
    native(True)
    x, w, b = _inputs(1)
    with pytest.raises(RuntimeError):
        O.linear(x, w[:, :10], b)
    assert torch.backends.mkldnn.enabled


def test_the_measurement_answers_once_per_dtype(monkeypatch):
    monkeypatch.delenv(O.ENV, raising=False)
    O.native_is_faster.cache_clear()
    try:
        first = O.native_is_faster(torch.bfloat16)
        assert isinstance(first, bool) and O.native_is_faster(torch.bfloat16) is first
        assert O.native_is_faster.cache_info().hits >= 1
    finally:
        O.native_is_faster.cache_clear()


def test_a_drafters_head_runs_on_the_kernel_its_one_row_input_is_faster_on(native):
    """`kernel_for` covers calls that do not go through `linear` (a drafter's LM head over its vocabulary's rows):
    oneDNN off inside it for one row, untouched for several, and back on after it even when the call fails."""
    native(True)
    x, _, _ = _inputs(1)
    with O.kernel_for(x):
        assert not torch.backends.mkldnn.enabled
    assert torch.backends.mkldnn.enabled
    with O.kernel_for(_inputs(2)[0]):
        assert torch.backends.mkldnn.enabled
    with pytest.raises(ValueError):
        with O.kernel_for(x):
            raise ValueError("a failing head")
    assert torch.backends.mkldnn.enabled
    native(False)
    with O.kernel_for(x):
        assert torch.backends.mkldnn.enabled


def test_a_draft_models_one_row_head_call_runs_without_onednn(native, monkeypatch):
    from frspec.decode.draft_model import DraftModelDrafter
    from tests.decode.spec_tiny import tiny_lm

    native(True)
    drafter = DraftModelDrafter(tiny_lm("qwen2", 128, hidden=32, seed=0, dtype=torch.bfloat16))
    seen, real = [], drafter.vocab.logits

    def recorded(hidden, *args):
        seen.append(torch.backends.mkldnn.enabled)
        return real(hidden, *args)

    monkeypatch.setattr(drafter.vocab, "logits", recorded)
    drafter._logits(torch.randn(1, 1, 32).to(torch.bfloat16))
    drafter._logits(torch.randn(1, 3, 32).to(torch.bfloat16))
    assert seen == [False, True] and torch.backends.mkldnn.enabled
