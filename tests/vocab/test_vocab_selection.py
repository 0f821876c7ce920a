"""Selecting a map from counts: every mode, forced tokens, ordering, and the bad values."""

from __future__ import annotations

import pytest
import torch

from frspec.errors import FrspecError
from frspec.vocab.counts import TokenCounts
from frspec.vocab.token_map import TokenMap, position_of, rank_by_count

# id:        0   1   2   3   4   5  6  7  8  9
COUNTS = [5, 50, 20, 20, 0, 3, 1, 0, 0, 1]  # total 100; ties 2/3 and 6/9 break by id


def counts(keep=None):
    return TokenCounts(torch.tensor(COUNTS), {"keep_tokens": keep or {}})


def test_rank_by_count_breaks_ties_by_id():
    assert rank_by_count(torch.tensor(COUNTS)).tolist() == [1, 2, 3, 0, 5, 6, 9, 4, 7, 8]


def test_position_of_inverts_an_order_and_marks_what_it_lacks():
    order = rank_by_count(torch.tensor(COUNTS))
    rank = position_of(order, len(COUNTS))
    assert torch.equal(order[rank], torch.arange(len(COUNTS)))  # a full order: the inverse permutation
    assert rank[1] == 0 and rank[8] == 9
    rows = position_of(torch.tensor([7, 2, 4]), 10)  # a head's three rows: target ids 7, 2, 4
    assert rows.tolist() == [-1, -1, 1, -1, 2, -1, -1, 0, -1, -1]
    assert position_of(torch.tensor([3]), 5, missing=1).tolist() == [1, 1, 1, 0, 1]


def test_top_k_orders_by_count_then_id():
    tm = TokenMap.from_counts(counts(), top_k=4)
    assert tm.ids.tolist() == [1, 2, 3, 0] and tm.vocab_size == 10
    assert tm.metadata["coverage"] == pytest.approx(0.95)
    assert tm.counts.tolist() == [50, 20, 20, 5]


def test_top_k_can_reach_never_seen_ids():
    tm = TokenMap.from_counts(counts(), top_k=10)
    assert tm.ids.tolist() == [1, 2, 3, 0, 5, 6, 9, 4, 7, 8]


def test_keep_fraction_is_a_share_of_the_vocabulary():
    assert TokenMap.from_counts(counts(), keep_fraction=0.3).ids.tolist() == [1, 2, 3]
    assert TokenMap.from_counts(counts(), keep_fraction=1.0).k == 10
    assert TokenMap.from_counts(counts(), keep_fraction=0.01).k == 1  # never empty


@pytest.mark.parametrize("target, k", [(0.5, 1), (0.51, 2), (0.90, 3), (0.95, 4), (0.96, 5), (0.98, 5), (0.99, 6), (1.0, 7)])
def test_coverage_picks_the_smallest_k(target, k):
    tm = TokenMap.from_counts(counts(), coverage=target)
    assert tm.k == k
    assert tm.metadata["coverage"] >= target
    # one id fewer would not reach the target
    assert sum(sorted(COUNTS, reverse=True)[: k - 1]) / 100 < target


def test_forced_tokens_count_toward_k_and_are_reported():
    tm = TokenMap.from_counts(counts({"<eos>": 8, "<eot>": 1}), top_k=4)
    assert tm.ids.tolist() == [1, 2, 3, 8]  # 8 pushes out 0 (count 5); 1 was in the top anyway
    assert tm.metadata["forced"] == 2 and tm.metadata["forced_in"] == 1
    assert tm.metadata["kept_tokens"] == {"<eot>": 1, "<eos>": 8}


def test_forced_tokens_in_coverage_mode_and_extra_keep_ids():
    tm = TokenMap.from_counts(counts({"<eos>": 7}), coverage=0.5, keep=[4])
    assert set(tm.ids.tolist()) == {1, 4, 7} and tm.ids.tolist() == [1, 4, 7]
    tm = TokenMap.from_counts(counts(), top_k=3, keep={"x": 9})
    assert tm.ids.tolist() == [1, 2, 9] and tm.metadata["kept_tokens"] == {"x": 9}


def test_selection_from_a_plain_tensor():
    assert TokenMap.from_counts(torch.tensor(COUNTS), top_k=2).ids.tolist() == [1, 2]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"top_k": 0}, "between 1 and"),
        ({"top_k": -3}, "between 1 and"),
        ({"top_k": 11}, "between 1 and"),
        ({"keep_fraction": 0.0}, r"\(0, 1\]"),
        ({"keep_fraction": 1.5}, r"\(0, 1\]"),
        ({"coverage": 0.0}, r"\(0, 1\]"),
        ({"coverage": 1.01}, r"\(0, 1\]"),
        ({"coverage": -0.5}, r"\(0, 1\]"),
        ({}, "exactly one"),
        ({"top_k": 3, "coverage": 0.5}, "exactly one"),
    ],
)
def test_bad_selection_values(kwargs, message):
    with pytest.raises(FrspecError, match=message):
        TokenMap.from_counts(counts(), **kwargs)


def test_k_smaller_than_the_forced_tokens_is_an_error():
    with pytest.raises(FrspecError, match="cannot hold the 3 tokens"):
        TokenMap.from_counts(counts({"a": 4, "b": 7, "c": 8}), top_k=2)


def test_empty_counts_and_out_of_range_keep_ids():
    with pytest.raises(FrspecError, match="empty"):
        TokenMap.from_counts(torch.zeros(10, dtype=torch.long), top_k=2)
    with pytest.raises(FrspecError, match="outside"):
        TokenMap.from_counts(counts(), top_k=2, keep=[10])


@pytest.mark.parametrize(
    "ids, vocab, message",
    [([1, 2, 2], 10, "duplicated id 2"), ([1, 10], 10, "out of range"), ([-1, 2], 10, "out of range"),
     ([], 10, "empty"), ([1.5], 10, "integers"), ([0, 1], 0, "positive")],
)
def test_token_map_validation(ids, vocab, message):
    with pytest.raises(FrspecError, match=message):
        TokenMap(ids, vocab)


def test_check_tokenizer():
    identity = {"name": "tok", "vocab_size": 10, "vocab_hash": "a" * 16}
    TokenMap([1, 2], 10).check_tokenizer(identity)
    TokenMap([1, 2], 12).check_tokenizer(identity, vocab_size=12)  # model head larger than the tokenizer
    with pytest.raises(FrspecError, match="vocabulary of 12 ids but tokenizer 'tok' has 10"):
        TokenMap([1, 2], 12).check_tokenizer(identity)
    with pytest.raises(FrspecError, match="has 10"):
        TokenMap([1, 2], 8).check_tokenizer(identity, vocab_size=8)
    recorded = TokenMap([1, 2], 10, {"tokenizer": {**identity, "vocab_hash": "b" * 16, "name": "other"}})
    with pytest.raises(FrspecError, match="built for tokenizer 'other'"):
        recorded.check_tokenizer(identity)
