"""GGUF files: dequantized once into the cache, loaded from it afterwards, and never trusted when incomplete."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from frspec.errors import FrspecError
from frspec.models import cache
from frspec.models.cache import MARKER, gguf_entry, gguf_identity, is_valid_entry, list_entries
from frspec.models.loading import load_model, resolve_model_dir

from tests.models.tiny_gguf_models import logits, write_tiny_gguf


@pytest.fixture
def count_conversions(monkeypatch):
    """Count real dequantizations of a GGUF (the slow step the cache exists to skip)."""
    calls = []
    real = cache.dequantize_gguf

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(cache, "dequantize_gguf", counting)
    return calls


def test_gguf_loads_exactly_and_is_cached(cache_root, tiny_gguf, count_conversions):
    path, reference = tiny_gguf
    model = load_model(str(path), dtype="fp32")
    assert torch.equal(logits(model), logits(reference))  # an F32 GGUF is cached in fp32: nothing is lost
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    (entry,) = list_entries()
    assert entry.valid and entry.dtype == "float32" and entry.path.parent == cache_root / "models"
    assert entry.source["identity"] == gguf_identity(path)
    assert len(count_conversions) == 1


def test_second_load_reads_the_cache_without_dequantizing(cache_root, tiny_gguf, monkeypatch):
    path, reference = tiny_gguf
    load_model(str(path), dtype="fp32")
    monkeypatch.setattr(cache, "dequantize_gguf", lambda *a: pytest.fail("dequantized again despite the cache"))
    again = load_model(str(path), dtype="fp32")
    assert torch.equal(logits(again), logits(reference))


def test_explicit_cache_dir_is_used(tmp_path, cache_root, tiny_gguf):
    path, _ = tiny_gguf
    elsewhere = tmp_path / "other-cache"
    load_model(str(path), cache_dir=elsewhere)
    assert len(list_entries(elsewhere)) == 1 and list_entries() == []


def test_cache_holds_the_tokenizer(cache_root, tiny_gguf):
    path, _ = tiny_gguf
    entry = resolve_model_dir(str(path))
    from_cache = AutoTokenizer.from_pretrained(entry)
    from_gguf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    text = "hello the tall hell<|im_end|>"
    assert from_cache.encode(text) == from_gguf.encode(text)
    assert from_cache.eos_token == "<|im_end|>"


def test_quantized_gguf_is_dequantized_and_cached_in_bf16(cache_root, tmp_path):
    path = tmp_path / "q8.gguf"
    reference = write_tiny_gguf(path, quantize=True)  # holds the dequantized Q8_0 weights
    model = load_model(str(path), dtype="fp32")
    assert list_entries()[0].dtype == "bfloat16"
    # fp32 from a quantized file = its dequantized weights rounded to bf16, then upcast
    assert torch.allclose(logits(model), logits(reference.to(torch.bfloat16).float()), atol=1e-5)
    assert not torch.equal(logits(model), logits(write_tiny_gguf(tmp_path / "f32.gguf")))


@pytest.mark.parametrize(
    "damage",
    ["truncate_weights", "delete_marker", "delete_tokenizer", "garbage_marker", "marker_lists_missing_file"],
)
def test_damaged_cache_entry_is_rebuilt(cache_root, tiny_gguf, count_conversions, damage):
    path, reference = tiny_gguf
    entry = gguf_entry(path)
    weights = entry / "model.safetensors"
    if damage == "truncate_weights":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif damage == "delete_marker":
        (entry / MARKER).unlink()
    elif damage == "delete_tokenizer":
        (entry / "tokenizer.json").unlink()
    elif damage == "garbage_marker":
        (entry / MARKER).write_text("{not json")
    else:
        marker = json.loads((entry / MARKER).read_text())
        marker["files"]["extra.safetensors"] = {"size": 1, "sha256": "0"}
        (entry / MARKER).write_text(json.dumps(marker))
    assert not is_valid_entry(entry)
    model = load_model(str(path), dtype="fp32")
    assert len(count_conversions) == 2
    assert is_valid_entry(entry) and torch.equal(logits(model), logits(reference))


def test_same_size_corruption_is_caught_by_verify(cache_root, tiny_gguf):
    path, _ = tiny_gguf
    entry = gguf_entry(path)
    weights = entry / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert is_valid_entry(entry)  # sizes match: the cheap check cannot see it
    assert not is_valid_entry(entry, verify=True)


def test_different_gguf_content_gets_its_own_entry(cache_root, tmp_path):
    a, b = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    a.parent.mkdir(), b.parent.mkdir()
    model_a, model_b = write_tiny_gguf(a, seed=1), write_tiny_gguf(b, seed=2)
    assert gguf_identity(a) != gguf_identity(b)
    assert torch.equal(logits(load_model(str(a), dtype="fp32")), logits(model_a))
    assert torch.equal(logits(load_model(str(b), dtype="fp32")), logits(model_b))
    assert len(list_entries()) == 2


def test_interrupted_build_leaves_nothing_behind(cache_root, tiny_gguf, monkeypatch):
    path, _ = tiny_gguf

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache, "sha256_file", crash)  # dies after the weights are written, before the marker
    with pytest.raises(KeyboardInterrupt):
        load_model(str(path))
    assert list((cache_root / "models").iterdir()) == []


def test_force_rebuilds(cache_root, tiny_gguf, count_conversions):
    path, _ = tiny_gguf
    gguf_entry(path)
    gguf_entry(path)
    gguf_entry(path, force=True)
    assert len(count_conversions) == 2


def test_not_a_gguf_file(cache_root, tmp_path):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"PK\x03\x04 definitely a zip")
    with pytest.raises(FrspecError, match="not a GGUF file"):
        load_model(str(fake))


def test_truncated_gguf_is_a_clear_error(cache_root, tiny_gguf):
    path, _ = tiny_gguf
    path.write_bytes(path.read_bytes()[:300])  # valid magic, torn metadata
    with pytest.raises(FrspecError, match="GGUF"):
        load_model(str(path))
    assert list_entries() == []


def test_list_entries_reports_incomplete_ones(cache_root, tiny_gguf):
    path, _ = tiny_gguf
    entry = gguf_entry(path)
    (cache_root / "models" / "half-built").mkdir()
    (cache_root / "models" / ".tmp-in-progress").mkdir()  # hidden build dirs are not entries
    listed = {e.path.name: e for e in list_entries()}
    assert set(listed) == {entry.name, "half-built"}
    assert listed[entry.name].valid and listed[entry.name].size_bytes > 0
    assert not listed["half-built"].valid
