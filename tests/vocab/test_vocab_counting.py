"""Counting: exact counts for text and chats (whole or assistant turns only), flags, files, merging."""

from __future__ import annotations

import json

import pytest
import torch

from frspec.errors import FrspecError
from frspec.vocab import counting
from frspec.vocab.counting import count_corpus, count_tokens
from frspec.vocab.counts import TokenCounts, merge_counts

from tests.vocab.vocab_helpers import sharegpt, write_jsonl

TEXTS = ["the quick brown fox", "hello world, hello tokens", "def add(a, b):\n    return a + b\n"]


def expected(tok, texts, size=None, special=False):
    out = torch.zeros(size or len(tok), dtype=torch.long)
    for t in texts:
        for i in tok.encode(t, add_special_tokens=special):
            out[i] += 1
    return out


def test_plain_text_counts_are_exact(tiny_tokenizer):
    counts = count_tokens(tiny_tokenizer, TEXTS)
    assert torch.equal(counts.counts, expected(tiny_tokenizer, TEXTS))
    assert counts.vocab_size == len(tiny_tokenizer) and counts.counts.dtype == torch.int64
    assert counts.metadata["documents"] == 3 and counts.metadata["tokens"] == counts.total


def test_add_special_tokens_adds_bos_per_document(tiny_tokenizer):
    bos = tiny_tokenizer.bos_token_id
    plain = count_tokens(tiny_tokenizer, TEXTS)
    with_bos = count_tokens(tiny_tokenizer, TEXTS, add_special_tokens=True)
    assert int(plain.counts[bos]) == 0 and int(with_bos.counts[bos]) == len(TEXTS)
    assert torch.equal(with_bos.counts, expected(tiny_tokenizer, TEXTS, special=True))


def test_counts_cover_a_larger_model_vocabulary(tiny_tokenizer):
    counts = count_tokens(tiny_tokenizer, TEXTS, vocab_size=len(tiny_tokenizer) + 50)
    assert counts.vocab_size == len(tiny_tokenizer) + 50
    assert int(counts.counts[len(tiny_tokenizer):].sum()) == 0
    # A smaller --vocab-size never truncates the tokenizer's ids.
    assert count_tokens(tiny_tokenizer, TEXTS, vocab_size=10).vocab_size == len(tiny_tokenizer)


CHAT = [
    {"role": "user", "content": "hello world"},
    {"role": "assistant", "content": "the quick brown fox"},
    {"role": "user", "content": "again"},
    {"role": "assistant", "content": "hello tokens"},
]


def test_chats_render_with_the_template(tiny_tokenizer):
    counts = count_tokens(tiny_tokenizer, [CHAT])
    rendered = tiny_tokenizer.apply_chat_template(CHAT, tokenize=False)
    assert torch.equal(counts.counts, expected(tiny_tokenizer, [rendered]))


def test_assistant_only_counts_generated_text_and_end_of_turn(tiny_tokenizer):
    counts = count_tokens(tiny_tokenizer, [CHAT], assistant_only=True)
    generated = ["the quick brown fox<|im_end|>", "hello tokens<|im_end|>"]
    assert torch.equal(counts.counts, expected(tiny_tokenizer, generated))
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    im_start = tiny_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert int(counts.counts[im_end]) == 2 and int(counts.counts[im_start]) == 0


def test_keep_tokens_cover_specials_added_and_template(tiny_tokenizer):
    keep = count_tokens(tiny_tokenizer, TEXTS).keep_tokens
    for token in ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|unused|>"]:
        assert keep[token] == tiny_tokenizer.convert_tokens_to_ids(token)
    newline = tiny_tokenizer.encode("\n", add_special_tokens=False)
    assert set(newline) <= set(keep.values())  # the template's own "\n" after each header


def test_chat_without_template_is_an_error(tiny_tokenizer_dir):
    from frspec.models.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tiny_tokenizer_dir))
    tok.chat_template = None
    with pytest.raises(FrspecError, match="no chat template"):
        count_tokens(tok, [CHAT])


@pytest.mark.parametrize("content", ["", "[]", '[{"conversations": []}]', '{"text": ""}\n'])
def test_empty_corpus_is_an_error(tiny_tokenizer, tmp_path, content):
    suffix = ".txt" if not content.strip() else (".json" if content.startswith("[") else ".jsonl")
    path = tmp_path / f"empty{suffix}"
    path.write_text(content)
    with pytest.raises(FrspecError, match="corpus is empty"):
        count_corpus(tiny_tokenizer, [str(path)], progress=False)


def test_small_batches_give_the_same_counts(tiny_tokenizer, monkeypatch):
    docs = TEXTS * 7 + [CHAT] * 5
    whole = count_tokens(tiny_tokenizer, docs)
    monkeypatch.setattr(counting, "BATCH_TEXTS", 2)
    monkeypatch.setattr(counting, "BATCH_CHARS", 16)
    assert torch.equal(count_tokens(tiny_tokenizer, docs).counts, whole.counts)


def test_count_corpus_metadata_and_file_round_trip(tiny_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "chats.jsonl", [sharegpt("hello world", "the quick brown fox")] * 3)
    counts = count_corpus(tiny_tokenizer, [str(path)], assistant_only=True, progress=False)
    m = counts.metadata
    assert m["records"] == 3 and m["documents"] == 3 and m["assistant_only"] is True
    assert m["inputs"] == [str(path.resolve())] and m["tokenizer"]["vocab_size"] == len(tiny_tokenizer)
    counts.save(tmp_path / "c.safetensors")
    loaded = TokenCounts.load(tmp_path / "c.safetensors")
    assert torch.equal(loaded.counts, counts.counts)
    assert loaded.metadata == json.loads(json.dumps(counts.metadata))


def test_merged_shards_equal_the_whole(tiny_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": t} for t in TEXTS * 3])
    whole = count_corpus(tiny_tokenizer, [str(path)], progress=False)
    shards = [count_corpus(tiny_tokenizer, [str(path)], skip=s, limit=4, progress=False) for s in (0, 4, 8)]
    merged = merge_counts(shards)
    assert torch.equal(merged.counts, whole.counts)
    assert merged.metadata["documents"] == whole.metadata["documents"] == 9
    assert merged.metadata["tokens"] == whole.total


def test_merging_different_tokenizers_or_sizes_is_refused(tiny_tokenizer):
    a = count_tokens(tiny_tokenizer, TEXTS)
    other = TokenCounts(a.counts.clone(), {**a.metadata, "tokenizer": {**a.metadata["tokenizer"], "vocab_hash": "f" * 16}})
    with pytest.raises(FrspecError, match="different tokenizers"):
        merge_counts([a, other])
    with pytest.raises(FrspecError, match="ids"):
        merge_counts([a, TokenCounts(torch.ones(a.vocab_size + 1, dtype=torch.long))])


@pytest.mark.parametrize("damage", ["garbage", "truncated", "not_counts", "missing"])
def test_bad_counts_files_are_one_line_errors(tiny_tokenizer, tmp_path, damage):
    path = tmp_path / "c.safetensors"
    count_tokens(tiny_tokenizer, TEXTS).save(path)
    if damage == "garbage":
        path.write_bytes(b"\x00garbage" * 10)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
    elif damage == "not_counts":
        from safetensors.torch import save_file

        save_file({"weight": torch.zeros(3)}, str(path))
    else:
        path.unlink()
    with pytest.raises(FrspecError) as e:
        TokenCounts.load(path)
    assert "\n" not in str(e.value)


def test_token_counts_validation():
    with pytest.raises(FrspecError, match="negative"):
        TokenCounts(torch.tensor([1, -1]))
    with pytest.raises(FrspecError, match="integers"):
        TokenCounts(torch.tensor([0.5, 1.0]))
