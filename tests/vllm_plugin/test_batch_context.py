"""Context-aware drafting in the plugin without vLLM: the head's rows follow the running batch (the union of its
requests' prompts and generated tokens, within the budget), change only when `update` runs, and a sampling
drafter's distribution over them is zero everywhere else; the settings and their refusals."""

import numpy as np
import pytest
import torch

from frspec.errors import FrspecError
from frspec.vllm_plugin.batch_context import BatchContextRows
from frspec.vllm_plugin.drafter_head import build_drafter_head
from frspec.vllm_plugin.settings import ContextSetting, context_setting
from frspec.vocab.token_map import TokenMap

V, H = 100, 16
MAP = list(range(10, 30))  # 20 ids; everything below 10 and from 30 on is outside the map


def _head(budget, extra=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    w, b = torch.randn(V, H, generator=g, dtype=torch.float64), torch.randn(V, generator=g, dtype=torch.float64)
    head = build_drafter_head(w, TokenMap(MAP, V), V, V, bias=b, context=ContextSetting(extra, budget))
    return head, w, b


def _batch(*requests, width=32):
    """vLLM's InputBatch arrays for requests given as (id, tokens)."""
    tokens = np.zeros((len(requests), width), dtype=np.int32)
    for i, (_, ids) in enumerate(requests):
        tokens[i, :len(ids)] = ids
    return [r for r, _ in requests], tokens, np.array([len(ids) for _, ids in requests])


def test_rows_are_the_map_plus_the_batch_union_and_follow_generated_tokens():
    head, w, b = _head("additive", extra=4)
    rows = BatchContextRows(head.vocab)
    rows.update(*_batch(("a", [50, 50, 11]), ("b", [60, 12])))
    assert head.target_ids.tolist() == MAP + [50, 60], "the map, then the batch's tokens outside it"
    x = torch.randn(3, H, dtype=torch.float64)
    torch.testing.assert_close(head.kept_logits(x), (x @ w.T + b)[:, MAP + [50, 60]])
    rows.update(*_batch(("a", [50, 50, 11, 70]), ("b", [60, 12, 13])))  # each request generated a token
    assert head.target_ids.tolist() == MAP + [50, 60, 70]
    assert rows.rebuilds == 1, "same requests: only the new tokens were added"
    rows.update(*_batch(("b", [60, 12, 13]), ("c", [80, 81, 82, 83, 84])))  # a finished, c joined
    assert rows.rebuilds == 2
    # Rebuilt from the running requests' tokens; 6 are new for 4 rows: equally frequent, the later ones first.
    assert head.target_ids.tolist() == MAP + [84, 83, 82, 81] and 50 not in head.target_ids.tolist()
    assert head.vocab.dropped_tokens == 2


def test_a_fixed_budget_keeps_the_row_count_and_displaces_the_least_frequent_map_ids():
    head, _, _ = _head("fixed", extra=3)
    rows = BatchContextRows(head.vocab)
    assert head.target_ids.tolist() == MAP
    rows.update(*_batch(("a", [90, 91, 15])))
    ids = head.target_ids.tolist()
    assert len(ids) == len(MAP) and ids[:17] == MAP[:17] and set(ids[17:]) == {27, 90, 91}


def test_rows_change_only_on_update_and_sampling_is_zero_outside_them():
    head, w, b = _head("additive", extra=4)
    rows = BatchContextRows(head.vocab)
    rows.update(*_batch(("a", [40, 41])))
    before = head.target_ids.clone()
    x = torch.randn(5, H, dtype=torch.float64)
    probs = head.to_full(torch.softmax(head.kept_logits(x), -1))
    assert torch.equal(head.target_ids, before), "scoring and sampling never move the rows"
    outside = torch.ones(V, dtype=torch.bool)
    outside[before] = False
    assert bool((probs[:, outside] == 0).all())
    expected = torch.softmax((x @ w.T + b)[:, before], -1)
    torch.testing.assert_close(probs[:, before], expected)


def test_context_heads_are_one_rank_only():
    w = torch.randn(V, H)
    with pytest.raises(FrspecError, match="one rank"):
        build_drafter_head(w, TokenMap(MAP, V), V, V, shard_ranges=[(0, 50), (50, 100)], rank=0,
                           all_gather=lambda t: t, context=ContextSetting(4, "fixed"))


def test_settings_from_the_environment(monkeypatch):
    monkeypatch.delenv("FRSPEC_CONTEXT_ROWS", raising=False)
    monkeypatch.delenv("FRSPEC_CONTEXT_BUDGET", raising=False)
    assert context_setting() is None
    monkeypatch.setenv("FRSPEC_CONTEXT_ROWS", "0")
    assert context_setting() is None
    monkeypatch.setenv("FRSPEC_CONTEXT_ROWS", "512")
    assert context_setting() == ContextSetting(512, "fixed")
    monkeypatch.setenv("FRSPEC_CONTEXT_BUDGET", "additive")
    assert context_setting() == ContextSetting(512, "additive")


@pytest.mark.parametrize("rows, budget, words", [("many", "fixed", "non-negative integer"),
                                                 ("-3", "fixed", "non-negative integer"),
                                                 ("8", "double", "fixed, additive")])
def test_bad_settings_are_refused_in_one_line(monkeypatch, rows, budget, words):
    monkeypatch.setenv("FRSPEC_CONTEXT_ROWS", rows)
    monkeypatch.setenv("FRSPEC_CONTEXT_BUDGET", budget)
    with pytest.raises(FrspecError, match=words) as err:
        context_setting()
    assert "\n" not in str(err.value)
