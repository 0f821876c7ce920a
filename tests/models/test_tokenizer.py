"""load_tokenizer: directories, GGUF files (cached), tiktoken .model files (Llama-3 layout); tokenizer_identity."""

from __future__ import annotations

import base64
import importlib.util
import os
from pathlib import Path

import pytest

from frspec.errors import FrspecError
from frspec.models import tokenizer as tokenizer_module
from frspec.models.tokenizer import load_tokenizer
from frspec.vocab.tokenizer_identity import same_tokenizer, tokenizer_identity

TINY_MERGES = [b"he", b"ll", b"hell", b"hello", b" w", b"or", b" wor", b" worl", b" world"]


def write_tiny_tiktoken(path: Path) -> Path:
    """A tiktoken BPE file: the 256 single bytes, then a few merged tokens (rank = line order)."""
    ranks = [bytes([i]) for i in range(256)] + TINY_MERGES
    path.write_text("".join(f"{base64.b64encode(b).decode()} {i}\n" for i, b in enumerate(ranks)))
    return path


def test_tiktoken_file_gets_llama3_specials_and_chat_template(tmp_path, cache_root):
    tok = load_tokenizer(str(write_tiny_tiktoken(tmp_path / "tiny.model")))
    n = 256 + len(TINY_MERGES)
    assert len(tok) == n + 256
    assert tok.convert_tokens_to_ids(["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]) == [n, n + 1, n + 9]
    assert tok.eos_token == "<|eot_id|>" and tok.bos_token == "<|begin_of_text|>"
    assert tok.encode("hello world", add_special_tokens=False) == [256 + 3, 256 + 8]
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}], tokenize=False
    )
    assert text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nworld<|eot_id|>"
    )
    assert tok.name_or_path == str(tmp_path / "tiny.model")


def test_conversion_is_cached_by_size_and_mtime(tmp_path, cache_root, monkeypatch):
    path = write_tiny_tiktoken(tmp_path / "tiny.model")
    first = load_tokenizer(str(path))
    entries = list((cache_root / "tokenizers").iterdir())
    assert len(entries) == 1 and (entries[0] / "tokenizer.json").is_file()

    def no_conversion(_path):
        raise AssertionError("should have come from the cache")

    monkeypatch.setattr(tokenizer_module, "_convert_tiktoken", no_conversion)
    again = load_tokenizer(str(path))
    assert tokenizer_identity(again)["vocab_hash"] == tokenizer_identity(first)["vocab_hash"]
    assert again.chat_template == first.chat_template and again.eos_token == "<|eot_id|>"

    os.utime(path, ns=(1, 1))  # a changed file is a new cache key: converting again is required
    with pytest.raises(AssertionError, match="cache"):
        load_tokenizer(str(path))


def test_gguf_tokenizer_loads_and_is_cached(tiny_gguf, cache_root, monkeypatch):
    path, model = tiny_gguf
    tok = load_tokenizer(str(path))
    assert len(tok) == model.config.vocab_size
    assert tok.eos_token == "<|im_end|>"
    monkeypatch.setattr(tokenizer_module, "_convert_gguf", lambda p: (_ for _ in ()).throw(AssertionError("cache")))
    cached = load_tokenizer(str(path))
    assert same_tokenizer(tokenizer_identity(cached), tokenizer_identity(tok))
    assert cached.name_or_path == str(path)


def test_directory_round_trip_and_identity(tmp_path, cache_root):
    tok = load_tokenizer(str(write_tiny_tiktoken(tmp_path / "tiny.model")))
    tok.save_pretrained(tmp_path / "saved")
    reloaded = load_tokenizer(str(tmp_path / "saved"))
    a, b = tokenizer_identity(tok), tokenizer_identity(reloaded)
    assert a["vocab_size"] == b["vocab_size"] == len(tok)
    assert same_tokenizer(a, b) and a["name"] != b["name"]
    assert len(a["vocab_hash"]) == 16
    # One more added token changes the identity.
    reloaded.add_tokens(["<extra>"])
    assert not same_tokenizer(a, tokenizer_identity(reloaded))


@pytest.mark.parametrize("spec", ["missing.gguf", "missing.model", "/no/such/dir/", "not-a-real/hub-model-xyz"])
def test_bad_specs_are_one_line_errors(spec, tmp_path, cache_root, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FrspecError) as e:
        load_tokenizer(spec)
    assert "\n" not in str(e.value)


def test_corrupt_tiktoken_file_is_an_error(tmp_path, cache_root):
    bad = tmp_path / "bad.model"
    bad.write_text("this is not base64 at all\n")
    with pytest.raises(FrspecError, match="tiktoken"):
        load_tokenizer(str(bad))


LLAMA3 = importlib.util.find_spec("llama_models")


@pytest.mark.skipif(LLAMA3 is None, reason="llama-models not installed")
def test_real_llama3_tokenizer_matches_reference(cache_root):
    from llama_models.llama3.tokenizer import Tokenizer

    path = Path(LLAMA3.submodule_search_locations[0]) / "llama3" / "tokenizer.model"
    tok = load_tokenizer(str(path))
    assert len(tok) == tokenizer_identity(tok)["vocab_size"] == 128_256
    assert tok.convert_tokens_to_ids(["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]) == [128000, 128001, 128009]
    reference = Tokenizer(path)
    text = "FR-Spec drafts from 32,768 frequent tokens.\n\ndef f(x):\n    return x ** 2  # ünïcödé 日本語"
    assert tok.encode(text, add_special_tokens=False) == reference.encode(text, bos=False, eos=False)
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True, add_generation_prompt=True)
    rendered = rendered["input_ids"] if isinstance(rendered, dict) or hasattr(rendered, "keys") else rendered
    assert rendered[0] == 128000 and 128009 in rendered and rendered[-2:] == reference.encode(
        "<|end_header_id|>\n\n", bos=False, eos=False, allowed_special="all"
    )


def test_default_model_names_resolve_to_the_prepared_cache(monkeypatch, tmp_path):
    from transformers import AutoTokenizer

    import frspec.models.loading as loading
    from frspec.models.tokenizer import load_tokenizer

    model_dir = tmp_path / "prepared"
    model_dir.mkdir()
    calls = []
    monkeypatch.setattr(loading, "resolve_model_dir", lambda spec, cache_dir=None: calls.append(spec) or str(model_dir))
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda path, **kw: type("Tok", (), {"name_or_path": path})())
    tok = load_tokenizer("qwen2.5-coder-0.5b-instruct")
    assert calls == ["qwen2.5-coder-0.5b-instruct"]
    assert tok.name_or_path == "qwen2.5-coder-0.5b-instruct"
