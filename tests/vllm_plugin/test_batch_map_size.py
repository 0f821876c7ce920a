"""The map size per batch step in the plugin, without vLLM (FRSPEC_TOKEN_MAP_SIZE=auto): a ranked head serving
every size from one copy, a chooser fed the batch's tokens and a fake clock, and the settings' refusals."""

import numpy as np
import pytest
import torch

from frspec.errors import FrspecError
from frspec.vllm_plugin.batch_map_size import BatchMapSize
from frspec.vllm_plugin.drafter_head import build_drafter_head
from frspec.vllm_plugin.settings import auto_map_size
from frspec.vocab.token_map import TokenMap

V, H, DEPTH = 100, 16, 3
RANKING = list(range(60, 100))  # a 40-id map, most frequent first: ids 60.. rank 0..
REST_S = 0.010  # a step's seconds beyond the draft head (the target's forward, the drafter's body)


def _head():
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(V, H, generator=g, dtype=torch.float64), torch.randn(V, generator=g, dtype=torch.float64)
    return build_drafter_head(w, TokenMap(RANKING, V), V, V, bias=b, ranked=True), w, b


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _batch(tokens: dict[str, list[int]], width=400):
    ids = np.zeros((len(tokens), width), dtype=np.int32)
    for i, t in enumerate(tokens.values()):
        ids[i, :len(t)] = t
    return list(tokens), ids, np.array([len(t) for t in tokens.values()])


def _serve(chooser, clock, head_s_per_row, next_tokens, steps=40, requests=("a", "b")):
    """Play vLLM: every step each request gains its accepted drafts (all of them while the target's token is in
    the rows drafted from) and one token; the clock advances by the step's cost at the size the chooser set."""
    tokens = {r: [1, 2, 3] for r in requests}
    sizes, t = [], 0
    for _ in range(steps):
        size = chooser.update(*_batch(tokens))
        sizes.append(size)
        for r in requests:
            for i in range(DEPTH + 1):
                tok = next_tokens(t)
                t += 1
                tokens[r].append(tok)
                if i == DEPTH or chooser.vocab.rank_of[tok] >= size:
                    break
        clock.now += REST_S + DEPTH * head_s_per_row * size * len(requests)
    return sizes


def _chooser(head_s_per_row):
    head, _, _ = _head()
    clock = Clock()
    costs = {k: {1: head_s_per_row * k, 16: 16 * head_s_per_row * k} for k in BatchMapSize.sizes_for(head.vocab)}
    return BatchMapSize(head.vocab, DEPTH, costs, clock=clock), clock, head


def test_one_copy_of_the_head_serves_every_size_and_the_map_is_the_start():
    head, w, b = _head()
    vocab = head.vocab
    assert BatchMapSize.sizes_for(vocab) == (12, 25, 40, 100)  # nothing between the ranking's 40 and the whole head
    assert head.size == 40 and head.target_ids.tolist() == RANKING, "before any step: the map as it is"
    x = torch.randn(3, H, dtype=torch.float64)
    order = vocab.target_ids_all.tolist()
    for k in (12, 40, 100):
        vocab.set_size(k)
        torch.testing.assert_close(head.kept_logits(x), (x @ w.T + b)[:, order[:k]])
        assert vocab.head.weight.data_ptr() == vocab.weight_all.data_ptr(), "a view of the one ranked copy"
        full = head.row_logits(x)
        assert bool(torch.isinf(full[:, order[k:]]).all()) and bool(torch.isfinite(full[:, order[:k]]).all())


def test_a_dear_head_and_tokens_in_the_first_rows_choose_the_smallest_map():
    chooser, clock, _ = _chooser(head_s_per_row=1e-4)  # the 40-row head costs 4 ms a draft against a 10 ms rest
    sizes = _serve(chooser, clock, 1e-4, next_tokens=lambda t: RANKING[t % 10])
    assert sizes[0] == 40, "no size change before a step's time is measured"
    assert sizes[-10:] == [12] * 10
    assert chooser.chosen[12] >= 30


def test_tokens_beyond_the_map_choose_the_whole_head():
    chooser, clock, _ = _chooser(head_s_per_row=1e-6)
    sizes = _serve(chooser, clock, 1e-6, next_tokens=lambda t: [5, 17, 33, 48][t % 4])  # unranked ids
    assert sizes[-10:] == [100] * 10


def test_the_choice_follows_the_batchs_tokens_when_they_change():
    chooser, clock, _ = _chooser(head_s_per_row=1e-5)
    first = _serve(chooser, clock, 1e-5, next_tokens=lambda t: RANKING[t % 10], steps=40)
    later = _serve(chooser, clock, 1e-5, next_tokens=lambda t: [5, 17, 33, 48][t % 4], steps=120,
                   requests=("c", "d"))
    assert first[-1] < 40 and later[-1] == 100


def test_a_step_is_timed_only_when_the_batch_is_unchanged():
    chooser, clock, _ = _chooser(head_s_per_row=1e-5)
    chooser.update(*_batch({"a": [1, 2]}))
    clock.now += 5.0  # an idle gap, then another request joins: not a step's time
    chooser.update(*_batch({"a": [1, 2, 60], "b": [7]}))
    assert not chooser.rest_s
    clock.now += 0.02
    chooser.update(*_batch({"a": [1, 2, 60, 61], "b": [7, 60]}))
    assert list(chooser.rest_s) == [pytest.approx(0.02 - DEPTH * 1e-5 * 40 * 2)]


def test_the_setting_is_auto_or_unset(monkeypatch):
    monkeypatch.delenv("FRSPEC_CONFIG", raising=False)
    monkeypatch.delenv("FRSPEC_TOKEN_MAP_SIZE", raising=False)
    assert not auto_map_size()
    monkeypatch.setenv("FRSPEC_TOKEN_MAP_SIZE", "auto")
    assert auto_map_size()
    monkeypatch.setenv("FRSPEC_TOKEN_MAP_SIZE", "32768")
    with pytest.raises(FrspecError, match="must be 'auto'") as err:
        auto_map_size()
    assert "\n" not in str(err.value)


def test_a_ranked_head_refuses_tensor_parallelism_in_one_line():
    w = torch.randn(V, H)
    with pytest.raises(FrspecError, match="one rank"):
        build_drafter_head(w[:50], TokenMap(RANKING, V), V, V, shard_ranges=[(0, 50), (50, 100)], ranked=True)
