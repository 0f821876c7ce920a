"""ContextVocab: a token map plus the request's own tokens, in a preallocated head written per request."""

import pytest
import torch

from frspec.errors import FrspecError
from frspec.vocab.context_vocab import ContextSlots, ContextVocab
from frspec.vocab.draft_vocab import DraftVocab
from frspec.vocab.token_map import TokenMap

V, H = 60, 8
# Map order is frequency order: 10 is the most frequent, 33 the least. 0 is an always-kept special token that
# happens to rank last but one.
MAP_IDS = [10, 11, 12, 13, 14, 15, 16, 17, 0, 33]
KEPT = {"<|im_end|>": 0}


def _head(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, H, generator=g), torch.randn(V, generator=g)


def _map():
    return TokenMap(MAP_IDS, vocab_size=V, metadata={"kept_tokens": KEPT})


def _build(budget, extra_rows=3, seed=0, **kw):
    w, b = _head(seed)
    return w, b, ContextVocab.build(w, b, token_map=_map(), extra_rows=extra_rows, budget=budget, **kw)


def _check_consistent(cv, w, b):
    """The invariants every state must satisfy: logits are the full head's at the active ids, to_full is a
    distribution over exactly those ids, to_target agrees, and no id is held twice."""
    ids = cv.target_ids
    assert ids.numel() == cv.size and torch.unique(ids).numel() == ids.numel()
    assert bool((ids >= 0).all())
    h = torch.randn(4, H)
    full = h @ w.T + b
    torch.testing.assert_close(cv.logits(h), full[:, ids])
    assert torch.equal(cv.to_target(torch.arange(cv.size)), ids)
    probs = torch.softmax(cv.logits(h), -1)
    spread = cv.to_full(probs)
    assert spread.shape == (4, V)
    torch.testing.assert_close(spread[:, ids], probs)
    outside = torch.ones(V, dtype=torch.bool)
    outside[ids] = False
    assert bool((spread[:, outside] == 0).all())
    torch.testing.assert_close(spread.sum(-1), torch.ones(4))


@pytest.mark.parametrize("budget", ["fixed", "additive"])
def test_before_any_request_it_is_the_static_map(budget):
    w, b, cv = _build(budget)
    static = DraftVocab.build(w, b, token_map=_map())
    # The same rows; a fixed budget orders them static part first, then the displaceable tail (16, 17, 33).
    assert sorted(cv.target_ids.tolist()) == sorted(MAP_IDS)
    order = [MAP_IDS.index(t) for t in cv.target_ids.tolist()]
    h = torch.randn(3, H)
    torch.testing.assert_close(cv.logits(h), static.logits(h)[:, order])
    _check_consistent(cv, w, b)


def test_fixed_budget_displaces_the_least_frequent_map_ids_but_never_kept_ones():
    w, b, cv = _build("fixed", extra_rows=3)
    cv.begin_request([40, 41, 40, 10, 12])  # 10 and 12 are already in the static part
    assert cv.size == len(MAP_IDS)  # the same row count as the map alone
    active = set(cv.target_ids.tolist())
    assert {40, 41} <= active and cv.context_rows == 2
    # Fillers (the map's 3 least frequent displaceable ids: 16, 17, 33) make room from the least frequent: 33, 17.
    assert active == {10, 11, 12, 13, 14, 15, 16, 0, 40, 41}
    assert 0 in active  # ranked next to last, but always kept
    _check_consistent(cv, w, b)
    cv.add_tokens([42, 10, 40])  # only 42 is new; it displaces 16, the last filler
    assert set(cv.target_ids.tolist()) == {10, 11, 12, 13, 14, 15, 0, 40, 41, 42}
    _check_consistent(cv, w, b)
    cv.add_tokens([43])  # all 3 request rows are taken: dropped
    assert 43 not in cv.target_ids.tolist() and cv.dropped_tokens == 1
    _check_consistent(cv, w, b)


def test_fixed_budget_protects_map_tail_tokens_that_occur_in_the_prompt():
    w, b, cv = _build("fixed", extra_rows=3)
    cv.begin_request([33, 50])  # 33 is the map's least frequent: the prompt makes it a request token
    assert set(cv.target_ids.tolist()) == {10, 11, 12, 13, 14, 15, 16, 0, 33, 50}
    cv.add_tokens([51])  # displaces filler 16, not 33
    assert set(cv.target_ids.tolist()) == {10, 11, 12, 13, 14, 15, 0, 33, 50, 51}
    _check_consistent(cv, w, b)


def test_additive_budget_adds_rows_up_to_the_limit():
    w, b, cv = _build("additive", extra_rows=3)
    cv.begin_request([40, 10])
    assert cv.size == len(MAP_IDS) + 1 and cv.target_ids.tolist() == MAP_IDS + [40]
    _check_consistent(cv, w, b)
    cv.add_tokens([41, 42, 43, 41])  # 2 rows left: 41 (seen twice) comes first, then the later of 42/43
    assert cv.size == len(MAP_IDS) + 3
    assert cv.target_ids.tolist() == MAP_IDS + [40, 41, 43] and cv.dropped_tokens == 1
    _check_consistent(cv, w, b)


def test_a_new_request_forgets_the_previous_one():
    for budget in ("fixed", "additive"):
        w, b, cv = _build(budget, extra_rows=3)
        cv.begin_request([40, 41])
        cv.add_tokens([42])
        cv.begin_request([45])
        assert not {40, 41, 42} & set(cv.target_ids.tolist()) and 45 in cv.target_ids.tolist()
        assert cv.context_rows == 1 and cv.dropped_tokens == 0
        _check_consistent(cv, w, b)
        cv.begin_request([])
        assert sorted(cv.target_ids.tolist()) == sorted(MAP_IDS)


def test_overflowing_prompt_keeps_its_most_frequent_tokens():
    _, _, cv = _build("additive", extra_rows=2)
    cv.begin_request([50, 51, 51, 52, 52, 52, 53])
    assert cv.target_ids[len(MAP_IDS):].tolist() == [52, 51] and cv.dropped_tokens == 2


@pytest.mark.parametrize("budget", ["fixed", "additive"])
def test_no_full_head_copy_per_request(budget, monkeypatch):
    w, b, cv = _build(budget, extra_rows=4)
    source_before = w.clone()
    ptr = cv.head.weight.data_ptr()
    static_rows = cv.slots.n_static
    static_before = cv.head.weight[:static_rows].clone()
    selected = []
    real = torch.Tensor.index_select

    def counting(self, dim, index):
        selected.append(int(index.numel()))
        return real(self, dim, index)

    monkeypatch.setattr(torch.Tensor, "index_select", counting)
    for prompt in ([40, 41, 42], [50], list(range(20, 59))):
        cv.begin_request(torch.tensor([prompt]))
        cv.add_tokens([1, 2])
        assert cv.head.weight.data_ptr() == ptr  # the same preallocated matrix, a view of its prefix
        assert torch.equal(cv.head.weight[:static_rows], static_before)
        _check_consistent(cv, w, b)
    # Every head read is of at most extra_rows rows (weight and bias: two reads per write).
    assert selected and max(selected) <= 4
    assert torch.equal(w, source_before)


@pytest.mark.parametrize("budget", ["fixed", "additive"])
def test_duplicates_never_appear_under_random_traffic(budget):
    w, b, cv = _build(budget, extra_rows=5, seed=1)
    g = torch.Generator().manual_seed(3)
    for _ in range(30):
        cv.begin_request(torch.randint(0, V, (int(torch.randint(0, 30, (1,), generator=g)),), generator=g))
        for _ in range(4):
            cv.add_tokens(torch.randint(0, V, (3,), generator=g))
            ids = cv.target_ids.tolist()
            assert len(ids) == len(set(ids))
            assert set(cv.slots.static_ids.tolist()) <= set(ids) and 0 in ids  # the static part, kept tokens stay
        _check_consistent(cv, w, b)


def test_eagle3_head_takes_only_tokens_it_can_score():
    g = torch.Generator().manual_seed(0)
    h2t = torch.tensor([10, 11, 12, 13, 14, 15, 16, 17, 0, 33, 40, 41])  # the head's own 12-token vocabulary
    w = torch.randn(12, H, generator=g)
    cv = ContextVocab.build(w, token_map=_map(), head_to_target=h2t, vocab_size=V, extra_rows=2, budget="additive")
    cv.begin_request([41, 55])  # 55 has no row in this head
    assert cv.target_ids.tolist() == MAP_IDS + [41]
    assert torch.equal(cv.rows, torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11]))
    h = torch.randn(2, H)
    torch.testing.assert_close(cv.logits(h), h @ w[cv.rows].T)


def test_moving_the_module_keeps_the_views():
    w, b, cv = _build("additive", extra_rows=2)
    cv.begin_request([40])
    cv.to(torch.float64)
    assert cv.head.weight.dtype == torch.float64 and cv.head.weight.data_ptr() == cv.weight_all.data_ptr()
    cv.add_tokens([41])
    h = torch.randn(2, H, dtype=torch.float64)
    torch.testing.assert_close(cv.logits(h), (h @ w.double().T + b.double())[:, cv.target_ids])


def test_bad_configurations_are_one_line_errors():
    w, b = _head()
    with pytest.raises(FrspecError, match="extends a token map"):
        ContextVocab.build(w, b, extra_rows=2)
    with pytest.raises(FrspecError, match="at most 9 rows"):
        ContextVocab.build(w, b, token_map=_map(), extra_rows=10, budget="fixed")
    with pytest.raises(FrspecError, match="budget must be one of"):
        ContextVocab.build(w, b, token_map=_map(), extra_rows=2, budget="grow")
    with pytest.raises(FrspecError, match="non-negative integer"):
        ContextVocab.build(w, b, token_map=_map(), extra_rows=-1)
    _, _, cv = _build("fixed")
    with pytest.raises(FrspecError, match=r"must lie in \[0, 60\)"):
        cv.begin_request([5, 60])


def test_slots_alone_select_the_same_rows_as_the_vocab():
    _, _, cv = _build("fixed", extra_rows=3)
    slots = ContextSlots(torch.tensor(MAP_IDS), V, 3, "fixed", keep=KEPT.values())
    for prompt, more in (([40, 41], [42]), ([33, 20, 20], [21, 22])):
        cv.begin_request(prompt)
        slots.begin(prompt)
        cv.add_tokens(more)
        slots.add(more)
        assert torch.equal(cv.target_ids, slots.active_ids)
