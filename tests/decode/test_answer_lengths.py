"""The tokens a request is expected to emit, from the lengths its kind's earlier answers took
(decode/answer_lengths.py), and the drafter-prefill decision that weighs its saving over them."""

from __future__ import annotations

import pytest

from frspec.decode.answer_lengths import LENGTH_HISTORY, AnswerLengths, add_answer, expected_tokens
from frspec.decode.controller import ControllerSettings, drafter_prefill_tokens, new_request
from tests.decode.test_controller import SIZES, costs


def answers(*lengths: int, capped: bool = False) -> AnswerLengths:
    history = None
    for tokens in lengths:
        history = add_answer(history, tokens, capped)
    return history


def test_with_no_history_a_request_is_expected_to_run_to_its_cap():
    assert expected_tokens(None, 0, 256) == 256
    assert expected_tokens(AnswerLengths(), 10, 256) == 246
    assert expected_tokens(None, 300, 256) == 0


def test_short_answers_lower_the_expectation_which_one_pseudo_answer_at_the_cap_keeps_from_zero():
    assert expected_tokens(answers(10), 0, 256) == pytest.approx((256 + 10) / 2)  # one short answer: halved, at most
    assert expected_tokens(answers(10, 46, 207), 0, 256) == pytest.approx((256 + 10 + 46 + 207) / 4)
    # An answer longer than this request's cap counts to the cap; one its own cap cut counts as reaching this cap.
    assert expected_tokens(answers(1000), 0, 64) == 64
    assert expected_tokens(answers(32, capped=True), 0, 256) == 256


def test_only_answers_that_went_on_past_the_tokens_emitted_count():
    history = answers(10, 11, 200)
    # At 12 tokens emitted the two answers that ended by 11 say nothing of this one: (244 + 188) / 2 remain.
    assert expected_tokens(history, 12, 256) == pytest.approx((244 + 188) / 2)
    assert expected_tokens(history, 5, 256) == pytest.approx((251 + 5 + 6 + 195) / 4)
    # A capped answer shorter than the tokens emitted still counts, as reaching the cap.
    assert expected_tokens(answers(8, capped=True), 20, 256) == 236


def test_the_history_keeps_the_last_answers_only():
    history = answers(*([5] * LENGTH_HISTORY))
    history = add_answer(history, 256, True)
    assert len(history.answers) == LENGTH_HISTORY and history.answers[-1] == (256, True)
    assert history.answers[0] == (5, False)
    for _ in range(LENGTH_HISTORY):
        history = add_answer(history, 256, True)
    assert expected_tokens(history, 0, 256) == 256  # the short answers have aged out


def test_a_prefill_is_weighed_over_the_tokens_expected_not_the_cap():
    """The costs of the prefill tests in test_controller.py: 0.044 s saved a token at the prior, the drafter's
    prefill 4.81 s over 600 prompt tokens. Over 256 tokens (11.3 s) it pays; over the 92 expected after two answers
    of 10 tokens ((256 + 10 + 10) / 3: 4.0 s) it does not; after answers of 200 and 150 tokens (202: 8.9 s) it does."""
    settings = ControllerSettings(sizes=SIZES)
    mid = costs(lambda n: 0.3 + 0.12 * (n - 1))

    def prefill_tokens(expected):
        return drafter_prefill_tokens(new_request(settings), mid, 600, 256, expected_tokens=expected)

    assert prefill_tokens(None) == 600 and prefill_tokens(expected_tokens(None, 0, 256)) == 600
    assert prefill_tokens(expected_tokens(answers(10, 10), 0, 256)) == 0
    assert prefill_tokens(expected_tokens(answers(200, 150), 0, 256)) == 600
