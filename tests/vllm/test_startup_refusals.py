"""A map for another vocabulary or tokenizer is refused when the engine is configured, with one line, before any
engine starts (so before any request)."""

import pytest

from frspec.errors import FrspecError

from tests.vllm.vllm_tiny import start_llm, stop_llm


def _spec(tiny):
    return {"method": "draft_model", "model": tiny.draft, "num_speculative_tokens": 2}


@pytest.mark.parametrize("which, words", [("wrong_vocab_map", "vocabulary of 128 ids"),
                                          ("wrong_tokenizer_map", "another-tokenizer")])
def test_a_map_of_another_vocabulary_or_tokenizer_is_refused_in_one_line(tiny, which, words):
    with pytest.raises(FrspecError) as err:
        llm = start_llm(tiny.target, _spec(tiny), getattr(tiny, which))
        stop_llm(llm)
    message = str(err.value)
    assert words in message and "\n" not in message


def test_a_map_without_a_drafter_is_refused(tiny):
    with pytest.raises(FrspecError, match="no speculative decoding"):
        start_llm(tiny.target, None, tiny.token_map)


def test_ngram_speculation_is_refused(tiny):
    with pytest.raises(FrspecError, match="not 'ngram'"):
        start_llm(tiny.target, {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3},
                  tiny.token_map)


def test_a_fixed_context_budget_larger_than_the_map_is_refused(tiny, monkeypatch):
    monkeypatch.setenv("FRSPEC_CONTEXT_ROWS", "41")  # the map has 40 ids
    with pytest.raises(FrspecError, match="at most 40 rows") as err:
        start_llm(tiny.target, _spec(tiny), tiny.token_map)
    assert "\n" not in str(err.value)
