"""RankedVocab: one rank-ordered copy of a head serving every map size (vocab/ranked_vocab.py)."""

import pytest
import torch

from frspec.errors import FrspecError
from frspec.vocab.counts import TokenCounts
from frspec.vocab.draft_vocab import DraftVocab
from frspec.vocab.ranked_vocab import RankedVocab
from frspec.vocab.token_map import TokenMap


def _head(vocab=50, hidden=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, hidden, generator=g), torch.randn(vocab, generator=g)


def test_every_k_is_the_static_map_of_its_size():
    w, b = _head()
    counts = torch.randint(0, 1000, (50,), generator=torch.Generator().manual_seed(1))
    ranked = RankedVocab.build(w, TokenCounts(counts), b)
    h = torch.randn(3, 8)
    for k in (1, 7, 16, 33, 50):
        static = DraftVocab.build(w, b, TokenMap.from_counts(TokenCounts(counts), top_k=k))
        torch.testing.assert_close(ranked.logits(h, k), static.logits(h))
        ranked.set_size(k)
        assert ranked.size == k and ranked.is_restricted == (k < 50)
        torch.testing.assert_close(ranked.logits(h), static.logits(h))
        assert torch.equal(ranked.target_ids, static.target_ids)
        q = torch.softmax(torch.randn(2, k), -1)
        torch.testing.assert_close(ranked.to_full(q), static.to_full(q))
        idx = torch.arange(k)
        assert torch.equal(ranked.to_target(idx), static.to_target(idx))


def test_one_copy_of_the_weight_serves_every_k():
    w, b = _head(vocab=512, hidden=64)
    ranked = RankedVocab.build(w, torch.randperm(512, generator=torch.Generator().manual_seed(0)), b)
    base = ranked.weight_all.data_ptr()
    stored = [t.untyped_storage().data_ptr() for t in ranked.buffers()] + \
             [p.untyped_storage().data_ptr() for p in ranked.parameters()]
    for k in (8, 64, 256, 512):
        ranked.set_size(k)
        assert ranked.head.weight.data_ptr() == base  # a view of the first k rows
        assert ranked.head.weight.untyped_storage().data_ptr() == base
    # Every tensor the module holds lives in storages it had before any k was set: nothing per size was added.
    now = {t.untyped_storage().data_ptr() for t in list(ranked.buffers()) + list(ranked.parameters())}
    assert now <= set(stored)
    weight_bytes = sum(s.nbytes() for s in {t.untyped_storage() for t in [ranked.weight_all]})
    assert weight_bytes == w.numel() * w.element_size()  # exactly one head, not one per size
    assert ranked.weight_all.data_ptr() != w.data_ptr()  # a copy in rank order; the source is untouched


def test_map_ranking_puts_the_map_first_then_the_rest_by_id_and_never_touches_the_source():
    w, b = _head()
    before = w.clone()
    ranked = RankedVocab.build(w, TokenMap([9, 2, 40, 0], 50), b)
    assert ranked.full_size == 50 and ranked.ranked_size == 4 and ranked.size == 50 and not ranked.is_restricted
    assert ranked.target_ids_all[:6].tolist() == [9, 2, 40, 0, 1, 3]
    assert ranked.ranks([9, 0, 1, 49]).tolist() == [0, 3, 4, 49]
    ranked.set_size(4)
    ranked.head.weight.data.zero_()
    assert torch.equal(w, before)


def test_eagle3_head_ranks_only_its_own_rows():
    w, _ = _head(vocab=6)
    h2t = torch.tensor([0, 3, 4, 10, 20, 49])
    ranked = RankedVocab.build(w, TokenMap([49, 7, 3, 20], 50), head_to_target=h2t)
    # 7 is not a head token: ranked 49, 3, 20, then the head's other ids 0, 4, 10.
    assert ranked.target_ids_all.tolist() == [49, 3, 20, 0, 4, 10]
    assert ranked.full_size == 6 and ranked.ranks([7]).tolist() == [6]
    h = torch.randn(2, 8)
    torch.testing.assert_close(ranked.logits(h, 3), (h @ w.T)[:, [5, 1, 4]])


def test_coverage_prior_from_counts():
    counts = torch.tensor([0, 5, 3, 2] + [0] * 6)
    ranked = RankedVocab.build(torch.randn(10, 4), TokenCounts(counts))
    assert ranked.target_ids_all[:3].tolist() == [1, 2, 3]
    assert ranked.coverage(1) == pytest.approx(0.5) and ranked.coverage(3) == pytest.approx(1.0)


def test_bad_sizes_and_rankings_are_one_line_errors():
    w, _ = _head()
    ranked = RankedVocab.build(w, [3, 1])
    for k in (0, 51, 2.5, True):
        with pytest.raises(FrspecError):
            ranked.set_size(k)
    with pytest.raises(FrspecError):
        ranked.logits(torch.randn(8), 99)
    with pytest.raises(FrspecError):
        RankedVocab.build(w, [3, 3])
    with pytest.raises(FrspecError):
        RankedVocab.build(w, torch.rand(50))
    with pytest.raises(FrspecError):
        DraftVocab.build(w).logits(torch.randn(8), 10)


def test_to_moves_the_views_along():
    w, b = _head()
    ranked = RankedVocab.build(w, [5, 6, 7], b, size=3)
    ranked = ranked.to(torch.float64)
    assert ranked.head.weight.dtype == torch.float64 and ranked.head.weight.shape[0] == 3
    assert ranked.head.weight.data_ptr() == ranked.weight_all.data_ptr()


def test_shipped_counts_rank_a_head_when_no_map_is_given():
    from frspec.vocab.shipped import default_ranking, shipped_for, shipped_metadata

    identity = shipped_metadata("qwen2.5")["tokenizer"]
    assert shipped_for(identity) == "qwen2.5" and shipped_for({"vocab_hash": "none"}) is None
    ranking = default_ranking(identity, 151936)
    assert ranking.k == 65536 and ranking.counts is not None
    ranked = RankedVocab.build(torch.zeros(151936, 2), ranking)
    kept = sorted(ranking.metadata["kept_tokens"].values())
    assert sorted(ranked.target_ids_all[: len(kept)].tolist()) == kept  # special tokens in every prefix
    cover = [ranked.coverage(k) for k in (4096, 16384, 65536, 151936)]
    assert 0.5 < cover[0] < cover[1] < cover[2] <= cover[3] == pytest.approx(1.0)
    assert default_ranking({"vocab_hash": "none"}, 151936) is None


def test_context_rows_on_top_of_a_ranked_head():
    w, b = _head()
    ranked = RankedVocab.build(w, list(range(50)), b, extra_rows=3)  # rank == id
    ranked.set_context_floor(8)
    ranked.begin_request(torch.tensor([[2, 30, 30, 41, 45, 47]]))  # 2 ranks below the floor; 30 twice: first
    assert ranked.n_ctx == 3 and ranked.ctx_ids[:3].tolist()[0] == 30 and ranked.dropped_tokens == 1
    held = ranked.ctx_ids[:3].tolist()
    ranked.set_size(16)
    assert ranked.size == 19 and ranked.map_size == 16
    h = torch.randn(2, 8)
    logits = ranked.logits(h)
    full = h @ w.T + b
    torch.testing.assert_close(logits[:, :16], full[:, :16])
    torch.testing.assert_close(logits[:, 16:], full[:, held])
    assert ranked.to_target(torch.tensor([0, 16, 18])).tolist() == [0, held[0], held[2]]
    assert ranked.target_ids.tolist() == list(range(16)) + held
    q = torch.softmax(logits, -1)
    torch.testing.assert_close(ranked.to_full(q)[:, held], q[:, 16:])
    assert ranked.ranks([30, 2, 20]).tolist() == [0, 2, 20]  # a context row is scored at every size
    # At a size holding a context token already, its context row scores -inf: distinct tokens, probability 0 there.
    ranked.set_size(42)
    logits = ranked.logits(h)
    assert logits.shape[-1] == 45 and torch.isinf(logits[:, 42:][:, [held.index(30), held.index(41)]]).all()
    q = torch.softmax(logits, -1)
    full_q = ranked.to_full(q)
    torch.testing.assert_close(full_q.sum(-1), torch.ones(2))
    torch.testing.assert_close(full_q[:, 30], q[:, 30])
    ranked.add_tokens(torch.tensor([49]))  # no free row
    assert ranked.n_ctx == 3 and ranked.dropped_tokens == 2
    ranked.begin_request(torch.tensor([[12]]))  # a new request drops the previous one's rows
    assert ranked.n_ctx == 1 and ranked.ranks([30]).tolist() == [30]
    ranked = ranked.to(torch.float64)
    assert ranked.logits(h.double()).shape[-1] == 43


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_a_quantized_ranked_head_is_one_packed_copy_serving_every_k(quant):
    """quantize_head packs the whole ranked matrix once and drops the float copy; every k is then the packed
    head's first k rows, scoring exactly as a static map's head quantized from its own k rows does."""
    from frspec.models.quant import Int4Linear, Int8Linear, quantize_linear

    w, b = _head(vocab=512, hidden=64)
    w, b = w.bfloat16(), b.bfloat16()
    counts = TokenCounts(torch.randint(0, 1000, (512,), generator=torch.Generator().manual_seed(2)))
    ranked = RankedVocab.build(w, counts, b)
    assert ranked.quantize_head(lambda linear: quantize_linear(linear, quant))
    assert not ranked.quantize_head(lambda linear: quantize_linear(linear, quant))  # once
    assert ranked.weight_all is None and ranked.bias_all is None  # the float copy is gone
    layer = Int4Linear if quant == "int4" else Int8Linear
    packed = ranked.packed_all.packed if quant == "int4" else ranked.packed_all.values
    h = torch.randn(3, 64, dtype=torch.bfloat16)
    for k in (1, 64, 100, 256, 512):
        static = DraftVocab.build(w, b, TokenMap.from_counts(counts, top_k=k))
        static.quantize_head(lambda linear: quantize_linear(linear, quant))
        ranked.set_size(k)
        assert isinstance(ranked.head, layer) and ranked.size == k
        assert torch.equal(ranked.logits(h), static.logits(h)) and torch.equal(ranked.logits(h, k), static.logits(h))
        mine = ranked.head.packed if quant == "int4" else ranked.head.values
        assert mine.untyped_storage().data_ptr() == packed.untyped_storage().data_ptr()
        assert torch.equal(ranked.target_ids, static.target_ids)


def test_a_quantized_ranked_head_takes_no_context_rows():
    from frspec.models.quant import quantize_linear

    w, b = _head(vocab=128, hidden=64)
    ranked = RankedVocab.build(w, torch.arange(128), b, extra_rows=4)
    with pytest.raises(FrspecError, match="takes no context rows"):
        ranked.quantize_head(lambda linear: quantize_linear(linear, "int4"))
