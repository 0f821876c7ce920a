"""Training sequences: chats are masked to what the model generates, text is trained whole, documents are cut."""

import torch

from frspec.train.sequences import chat_segments, document_sequence
from frspec.vocab.chat import ChatRenderer

from tests.train.train_tiny import tiny_tokenizer

CHAT = [{"role": "user", "content": "hi cat"}, {"role": "assistant", "content": "the dog"},
        {"role": "user", "content": "ok"}, {"role": "assistant", "content": "a mat"}]


def renderer():
    return ChatRenderer(tiny_tokenizer())


def test_chat_pieces_cover_the_render_and_mark_only_assistant_text():
    r = renderer()
    pieces = chat_segments(r, CHAT)
    assert "".join(t for t, _ in pieces) == r.tokenizer.apply_chat_template(CHAT, tokenize=False)
    assert [t for t, generated in pieces if generated] == ["the dog<|im_end|>", "a mat<|im_end|>"]


def test_assistant_only_mask_selects_the_generated_tokens():
    r = renderer()
    seq = document_sequence(r, CHAT, assistant_only=True, max_len=1000)
    trained = r.tokenizer.decode([i for i, m in zip(seq.ids, seq.mask) if m])
    assert trained == "the dog<|im_end|>a mat<|im_end|>"
    assert seq.ids == r.tokenizer.encode(r.tokenizer.apply_chat_template(CHAT, tokenize=False),
                                         add_special_tokens=False)
    whole = document_sequence(r, CHAT, assistant_only=False, max_len=1000)
    assert whole.ids == seq.ids and all(whole.mask)


def test_text_is_trained_whole_and_documents_are_cut():
    r = renderer()
    seq = document_sequence(r, "the cat sat", assistant_only=True, max_len=5)
    assert seq.ids == r.tokenizer.encode("the c", add_special_tokens=False) and seq.mask == [1] * 5
    assert document_sequence(r, "ab", assistant_only=False, max_len=10) is None  # nothing to predict


def test_chat_without_trainable_tokens_in_reach_is_dropped():
    r = renderer()
    assert document_sequence(r, CHAT, assistant_only=True, max_len=10) is None
