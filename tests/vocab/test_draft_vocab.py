"""DraftVocab: the one FR-Spec object (pruned head, id mapping, scatter to the full vocabulary)."""

import pytest
import torch

from frspec.errors import FrspecError
from frspec.vocab.draft_vocab import DraftVocab
from frspec.vocab.token_map import TokenMap


def _head(vocab=50, hidden=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, hidden, generator=g), torch.randn(vocab, generator=g)


def test_unrestricted_uses_the_weight_without_copy():
    w, b = _head()
    dv = DraftVocab.build(w, b)
    assert dv.size == 50 and not dv.is_restricted and dv.rows is None and dv.target_ids is None
    assert dv.head.weight.data_ptr() == w.data_ptr()
    h = torch.randn(3, 8)
    torch.testing.assert_close(dv.logits(h), h @ w.T + b)
    idx = torch.tensor([3, 7])
    assert torch.equal(dv.to_target(idx), idx)


def test_map_keeps_map_rows_in_map_order_and_never_touches_the_source():
    w, b = _head()
    before = w.clone()
    tm = TokenMap([9, 2, 40, 0], vocab_size=50)
    dv = DraftVocab.build(w, b, token_map=tm)
    h = torch.randn(2, 8)
    full = h @ w.T + b
    torch.testing.assert_close(dv.logits(h), full[:, [9, 2, 40, 0]])
    assert dv.to_target(torch.tensor([0, 2, 3])).tolist() == [9, 40, 0]
    assert dv.head.weight.data_ptr() != w.data_ptr()
    dv.head.weight.data.zero_()
    assert torch.equal(w, before)


def test_to_full_scatters_and_sums_to_one():
    w, _ = _head()
    dv = DraftVocab.build(w, token_map=TokenMap([5, 1, 30], vocab_size=50))
    q = torch.softmax(torch.randn(2, 3), -1)
    full = dv.to_full(q)
    assert full.shape == (2, 50)
    torch.testing.assert_close(full[:, [5, 1, 30]], q)
    assert float(full.sum(-1).sub(1).abs().max()) < 1e-6
    mask = torch.ones(50, dtype=torch.bool)
    mask[[5, 1, 30]] = False
    assert float(full[:, mask].abs().max()) == 0.0


def test_head_to_target_composes_with_the_map_in_map_order():
    # An EAGLE-3-style head with 6 rows over a 50-id target vocabulary.
    w, _ = _head(vocab=6)
    h2t = torch.tensor([0, 3, 4, 10, 20, 49])
    dv = DraftVocab.build(w, token_map=TokenMap([49, 7, 3, 20], vocab_size=50), head_to_target=h2t)
    # 7 is not a head token: the intersection keeps 49, 3, 20 in map order.
    assert dv.rows.tolist() == [5, 1, 4]
    assert dv.to_target(torch.arange(3)).tolist() == [49, 3, 20]
    h = torch.randn(8)
    torch.testing.assert_close(dv.logits(h), (w @ h)[[5, 1, 4]])
    plain = DraftVocab.build(w, head_to_target=h2t, vocab_size=50)
    assert plain.to_target(torch.tensor([3])).tolist() == [10]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(token_map=TokenMap([1, 2], vocab_size=60)), "50 rows but the target vocabulary has 60"),
        (dict(head_to_target=torch.tensor([0, 1])), "one target id per head row"),
        (dict(vocab_size=70), "50 rows but the target vocabulary has 70"),
    ],
)
def test_bad_inputs_are_one_line_errors(kwargs, message):
    w, _ = _head()
    with pytest.raises(FrspecError, match=message):
        DraftVocab.build(w, **kwargs)


def test_duplicate_and_disjoint_ids_are_refused():
    w, _ = _head(vocab=3)
    with pytest.raises(FrspecError, match="repeat an id"):
        DraftVocab.build(w, head_to_target=torch.tensor([1, 1, 2]), vocab_size=50)
    with pytest.raises(FrspecError, match="no token in common"):
        DraftVocab.build(w, head_to_target=torch.tensor([1, 2, 3]), vocab_size=50,
                         token_map=TokenMap([10, 11], vocab_size=50))


def test_two_vocabs_share_one_head_safely():
    w, _ = _head()
    a = DraftVocab.build(w, token_map=TokenMap([1, 2, 3], vocab_size=50))
    b = DraftVocab.build(w, token_map=TokenMap([4, 5], vocab_size=50))
    h = torch.randn(8)
    torch.testing.assert_close(a.logits(h), (w @ h)[[1, 2, 3]])
    torch.testing.assert_close(b.logits(h), (w @ h)[[4, 5]])


def test_kept_rows_is_the_selection_of_build_without_a_weight():
    from frspec.vocab.draft_vocab import kept_rows

    w, b = _head()
    tm = TokenMap([9, 2, 40, 0], vocab_size=50)
    rows, target_ids = kept_rows(tm, 50, 50)
    dv = DraftVocab.build(w, b, token_map=tm)
    assert torch.equal(rows, dv.rows) and torch.equal(target_ids, dv.target_ids)
    head_to_target = torch.tensor([40, 3, 9, 11])  # a 4-row head drafting these target ids
    rows, target_ids = kept_rows(tm, 4, 50, head_to_target)
    assert rows.tolist() == [2, 0] and target_ids.tolist() == [9, 40]
