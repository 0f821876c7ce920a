"""Text in and out: prompts, chat template, stop strings, streaming, default EOS ids."""

from __future__ import annotations

import pytest

from frspec.decode.factory import build_generator
from frspec.decode.stopping import TextTracker, default_eos_ids

from tests.decode.spec_tiny import TOKENIZER_VOCAB, tiny_lm, tiny_tokenizer


@pytest.fixture(scope="module")
def setup():
    tok = tiny_tokenizer()
    target = tiny_lm("llama", TOKENIZER_VOCAB, seed=11)
    return tok, target


def test_text_prompt_and_chat_template(setup):
    tok, target = setup
    generator = build_generator(target, target, num_spec_tokens=3, tokenizer=tok)
    out = generator.generate(prompt="hello", max_new_tokens=12, eos_token_ids=[])
    same = generator.generate(input_ids=tok("hello")["input_ids"], max_new_tokens=12, eos_token_ids=[])
    assert out.token_ids == same.token_ids
    assert out.text == tok.decode(out.token_ids, skip_special_tokens=True)
    chat = generator.generate(prompt="hello", max_new_tokens=12, eos_token_ids=[], apply_chat_template=True)
    messages = [{"role": "user", "content": "hello"}]
    templated = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(templated, add_special_tokens=False)["input_ids"]
    assert chat.stats.prompt_tokens == len(ids) and ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert chat.token_ids == generator.generate(input_ids=ids, max_new_tokens=12, eos_token_ids=[]).token_ids


@pytest.mark.parametrize("k", [None, 8], ids=["vanilla", "draft-k8"])
def test_stop_string_ends_generation_even_inside_an_accepted_draft(setup, k):
    tok, target = setup
    generator = build_generator(target, target if k else None, num_spec_tokens=k, tokenizer=tok)
    ref = generator.generate(prompt="the cat", max_new_tokens=40, eos_token_ids=[])
    text = ref.text
    assert len(text) > 12
    stop = text[6:8]
    cut = text.find(stop)
    # The token that completes the first occurrence is the last one emitted.
    j = next(j for j in range(1, 41) if stop in tok.decode(ref.token_ids[:j], skip_special_tokens=True))
    out = generator.generate(prompt="the cat", max_new_tokens=40, eos_token_ids=[], stop_strings=["zzzz", stop])
    assert out.token_ids == ref.token_ids[:j]
    assert out.text == text[:cut] and out.finish_reason == "stop_string"
    stream = generator.stream(prompt="the cat", max_new_tokens=40, eos_token_ids=[], stop_strings=["zzzz", stop])
    pieces = list(stream)
    assert "".join(pieces) == out.text and stream.output.token_ids == out.token_ids
    assert all(stop not in p for p in pieces)


def test_stream_yields_the_text_as_it_is_accepted(setup):
    tok, target = setup
    generator = build_generator(target, target, num_spec_tokens=2, tokenizer=tok)
    stream = generator.stream(prompt="abc", max_new_tokens=20, eos_token_ids=[])
    assert stream.output is None
    pieces = list(stream)
    assert len(pieces) > 1 and "".join(pieces) == stream.output.text
    assert stream.output.token_ids == generator.generate(prompt="abc", max_new_tokens=20, eos_token_ids=[]).token_ids


def test_default_eos_ids_include_end_of_turn_tokens(setup):
    tok, target = setup
    assert default_eos_ids(target, tok) == {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}
    target.generation_config.eos_token_id = [5, 6]
    try:
        assert default_eos_ids(target) == {5, 6}
    finally:
        target.generation_config.eos_token_id = None


class _FakeTokenizer:
    """decode() joins fixed strings, to play partial characters and partial stop strings."""

    table = {0: "ab", 1: "x", 2: "y", 3: "q", 4: "\ufffd", 5: "é"}

    def decode(self, ids, **_):
        text = "".join(self.table[i] for i in ids)
        return text.replace("\ufffdé", "é")  # token 4 then 5: two halves of one character


def test_tracker_holds_back_partial_stop_strings_and_characters():
    tracker = TextTracker(_FakeTokenizer(), ["xyz"])
    assert tracker.add([0, 1]) == 2 and tracker.take_piece() == "ab"  # "x" could start "xyz"
    assert tracker.add([2]) == 1 and tracker.take_piece() == ""
    assert tracker.add([3]) == 1 and tracker.take_piece() == "xyq"
    assert tracker.add([4]) == 1 and tracker.take_piece() == ""  # half a character
    assert tracker.add([5]) == 1 and tracker.take_piece() == "é"
    tracker = TextTracker(_FakeTokenizer(), ["yq"])
    assert tracker.add([0, 1, 2, 3, 0]) == 4 and tracker.stopped
    assert tracker.text == "abx" and tracker.take_piece(final=True) == "abx"
