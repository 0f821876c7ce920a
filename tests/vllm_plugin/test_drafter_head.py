"""The plugin's FR-Spec head without vLLM: one rank, and tensor-parallel ranks each keeping their own shard's rows,
whose all-gathered logits must equal the one-rank result (SGLang's issue 4328 is what goes wrong otherwise)."""

import pytest
import torch

from frspec.errors import FrspecError
from frspec.vllm_plugin.drafter_head import build_drafter_head
from frspec.vllm_plugin.shard_rows import select_shard_rows
from frspec.vocab.token_map import TokenMap

V, H = 100, 16


def _head(rows=V, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, H, generator=g, dtype=torch.float64), torch.randn(rows, generator=g, dtype=torch.float64)


def _ranges(n_rows, tp):
    per = -(-n_rows // tp)  # vLLM's equal split (the last shard may be short)
    return [(min(r * per, n_rows), min((r + 1) * per, n_rows)) for r in range(tp)]


def _sharded(weight, bias, token_map, tp, head_to_target=None, padding=0):
    """Each rank's head, built from its own shard only (plus `padding` junk rows, as vLLM pads a shard)."""
    ranges = _ranges(weight.shape[0], tp)
    heads = []
    for r, (lo, hi) in enumerate(ranges):
        shard = torch.cat([weight[lo:hi], torch.full((padding, H), 1e6, dtype=weight.dtype)])
        shard_bias = torch.cat([bias[lo:hi], torch.zeros(padding, dtype=bias.dtype)])
        heads.append(build_drafter_head(shard, token_map, V, weight.shape[0], ranges, r, bias=shard_bias,
                                        head_to_target=head_to_target, all_gather=lambda x: x))
    return heads


def _gathered(heads, hidden):
    local = [h.local_logits(hidden) for h in heads]
    assert len({x.shape[-1] for x in local}) == 1, "every rank contributes the same width to the all-gather"
    return [h.select(torch.cat(local, dim=-1)) for h in heads]


def test_one_rank_scores_the_map_rows_in_map_order_and_scatters_to_the_full_vocab():
    w, b = _head()
    ids = [50, 3, 99, 7, 0]
    head = build_drafter_head(w, TokenMap(ids, V), V, V, bias=b)
    x = torch.randn(4, H, dtype=torch.float64)
    torch.testing.assert_close(head.kept_logits(x), (x @ w.T + b)[:, ids])
    assert head.to_target(torch.tensor([0, 2, 4])).tolist() == [50, 99, 0]
    full = head.full_logits(x)
    torch.testing.assert_close(full[:, ids], head.kept_logits(x))
    outside = torch.ones(V, dtype=torch.bool)
    outside[ids] = False
    assert bool(torch.isneginf(full[:, outside]).all())
    probs = torch.softmax(head.kept_logits(x), -1)
    torch.testing.assert_close(head.to_full(probs), torch.softmax(full, -1))


def _assert_one_rank_result(gathered, expected):
    # Close, not equal: a GEMM over fewer output rows may block its sums differently (MKL on an AVX2-only EPYC
    # differs in the last bits); a row gathered into the wrong place would be far off.
    torch.testing.assert_close(gathered, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tp", [2, 3, 4])
def test_tensor_parallel_ranks_keep_their_own_rows_and_gather_to_the_one_rank_result(tp):
    w, b = _head()
    g = torch.Generator().manual_seed(1)
    token_map = TokenMap(torch.randperm(V, generator=g)[:37], V)
    one = build_drafter_head(w, token_map, V, V, bias=b)
    heads = _sharded(w, b, token_map, tp, padding=3)
    x = torch.randn(5, H, dtype=torch.float64)
    for r, (head, (lo, hi)) in enumerate(zip(heads, _ranges(V, tp))):
        mine = [i for i in token_map.ids.tolist() if lo <= i < hi]
        assert head.vocab.size == len(mine), f"rank {r} keeps exactly the map rows of its own shard"
        torch.testing.assert_close(head.vocab.head.weight, w[mine])
        assert torch.equal(head.target_ids, one.target_ids)
    for gathered in _gathered(heads, x):
        _assert_one_rank_result(gathered, one.kept_logits(x))


def test_a_rank_whose_shard_holds_no_map_row_still_takes_part_in_the_gather():
    w, b = _head()
    token_map = TokenMap([1, 30, 12, 45], V)  # all in the first half: rank 1 of 2 keeps nothing
    heads = _sharded(w, b, token_map, 2)
    assert heads[1].vocab.size == 0
    x = torch.randn(3, H, dtype=torch.float64)
    one = build_drafter_head(w, token_map, V, V, bias=b)
    for gathered in _gathered(heads, x):
        _assert_one_rank_result(gathered, one.kept_logits(x))


def test_eagle3_head_rows_compose_with_the_map_under_tensor_parallelism():
    rows = 40
    w, b = _head(rows)
    g = torch.Generator().manual_seed(2)
    head_to_target = torch.sort(torch.randperm(V, generator=g)[:rows]).values  # d2t: sorted target ids
    map_ids = torch.cat([head_to_target[torch.tensor([33, 2, 17, 39, 5])], torch.tensor([i for i in range(V) if i not in set(head_to_target.tolist())][:6])])
    token_map = TokenMap(map_ids, V)
    one = build_drafter_head(w, token_map, V, rows, bias=b, head_to_target=head_to_target)
    assert one.target_ids.tolist() == head_to_target[[33, 2, 17, 39, 5]].tolist(), "intersection, in map order"
    x = torch.randn(2, H, dtype=torch.float64)
    torch.testing.assert_close(one.kept_logits(x), (x @ w.T + b)[:, [33, 2, 17, 39, 5]])
    for gathered in _gathered(_sharded(w, b, token_map, 2, head_to_target=head_to_target), x):
        _assert_one_rank_result(gathered, one.kept_logits(x))


def test_shard_selection_rejects_ranges_that_miss_rows():
    rows = torch.tensor([5, 60])
    with pytest.raises(ValueError):
        select_shard_rows(rows, rows, [(0, 50)], 0)


def test_a_map_for_another_vocabulary_is_refused():
    w, b = _head()
    with pytest.raises(FrspecError, match="vocabulary of 120"):
        build_drafter_head(w, TokenMap([1, 2], 120), V, V)
