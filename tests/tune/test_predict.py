"""frspec tune's prediction math on fixed synthetic measurements: the replay of greedy acceptance, the step cost
model, and which configuration wins (no map when maps hurt acceptance, a map when they only save head time)."""

from __future__ import annotations

import pytest

from frspec.tune.predict import (
    OUTSIDE, Candidate, Measurements, acceptance, candidates, cheap_rows, predict, rank_predictions, replay,
    to_confirm,
)
from frspec.decode.tree_shape import TreeShape


def test_replay_walks_the_output_step_by_step():
    # index 0 is the prefill's token; a chain of 2 then accepts while ranks are 0.
    ranks = [9, 0, 0, 2, 0, 0, 0, 1]
    tokens, steps, proposed, accepted = replay(ranks, depth=2)
    # steps start at 1 (accept 2: tokens 1,2 + bonus 3), at 4 (accept 2: 4,5 + bonus 6), at 7 (0 drafts fit)
    assert (tokens, steps) == (7, 3)
    assert proposed == [2, 2] and accepted == [2, 2]
    # a static tree of branching 3 also accepts ranks 1 and 2
    tokens, steps, _, _ = replay(ranks, depth=3, branching=3)
    assert (tokens, steps) == (7, 2)
    # every emitted token is counted once: decode tokens = output length - the prefill's token
    for depth in (1, 2, 3, 5):
        for branching in (1, 2, 3):
            assert replay(ranks, depth, branching)[0] == len(ranks) - 1


def test_a_perfect_draft_emits_k_plus_one_tokens_per_step():
    ranks = [[0] * 61]
    for k in (1, 2, 3, 4, 5):
        per_step, per_position = acceptance(ranks, TreeShape.chain(k))
        assert per_step == pytest.approx(60 / -(-60 // (k + 1)))
        assert all(a == 1.0 for a in per_position)
    never = [[OUTSIDE] * 31]
    assert acceptance(never, TreeShape.chain(3))[0] == 1.0


def _measurements(no_map_ranks, map_ranks, head_full=0.010, head_map=0.004, target=None) -> Measurements:
    target = target or {n: 0.100 + 0.002 * (n - 1) for n in range(1, 17)}
    heads = {None: {w: head_full * w for w in (1, 2, 3, 4, 9)}, 32768: {w: head_map * w for w in (1, 2, 3, 4, 9)}}
    return Measurements(
        target_costs=target, draft_base_costs={w: 0.020 + 0.002 * (w - 1) for w in (1, 2, 3, 4, 9)},
        head_costs=heads, ranks={None: no_map_ranks, 32768: map_ranks},
        step_overhead_s=0.005, draft_forward_overhead_s=0.001, vanilla_overhead_s=0.002,
    )


def _pattern(period: int, miss: int, n: int = 200) -> list[int]:
    """Rank 0 except every `period`-th token, which has rank `miss`."""
    return [miss if i % period == period - 1 else 0 for i in range(n)]


def test_prediction_is_tokens_per_step_over_the_step_cost():
    m = _measurements([_pattern(4, OUTSIDE)], [_pattern(4, OUTSIDE)])
    p = predict(Candidate(32768, TreeShape.chain(3)), m)
    draft = 3 * (0.020 + 0.004 + 0.001)
    assert p.draft_time_s == pytest.approx(draft)
    assert p.target_time_s == pytest.approx(0.100 + 0.002 * 3)
    assert p.step_time_s == pytest.approx(draft + 0.106 + 0.005)
    assert p.tokens_per_s == pytest.approx(p.tokens_per_step / p.step_time_s)
    # a static 2x2 tree: the root forward (1 row) and one forward over its 2 children; 6 nodes + 1 target rows
    t = predict(Candidate(None, TreeShape.static(2, 2)), m)
    assert t.draft_time_s == pytest.approx((0.020 + 0.010 + 0.001) + (0.022 + 0.020 + 0.001))
    assert t.target_time_s == pytest.approx(0.100 + 0.002 * 6)
    vanilla = predict(Candidate(None, None), m)
    assert vanilla.tokens_per_step == 1.0 and vanilla.step_time_s == pytest.approx(0.102)


def test_no_map_wins_when_the_map_hurts_acceptance():
    # Code-like: the full vocabulary drafts 4 of 5 tokens right; the map misses every other token (identifiers
    # outside it), although its head is cheaper.
    m = _measurements([_pattern(5, 1)], [_pattern(2, OUTSIDE)])
    ranked = rank_predictions(m, candidates([32768], m.target_costs))
    assert ranked[0].candidate.map_size is None and ranked[0].candidate.shape is not None
    best_map = next(p for p in ranked if p.candidate.map_size == 32768)
    assert best_map.tokens_per_s < ranked[0].tokens_per_s


def test_the_map_wins_when_acceptance_is_the_same_and_its_head_is_cheaper():
    same = [_pattern(5, 1)]
    m = _measurements(same, same)
    ranked = rank_predictions(m, candidates([32768], m.target_costs))
    assert ranked[0].candidate.map_size == 32768
    # and for every shape, the map's prediction beats the full vocabulary's
    for p in ranked:
        if p.candidate.map_size == 32768:
            assert p.tokens_per_s > predict(Candidate(None, p.candidate.shape), m).tokens_per_s


def test_a_cost_jump_after_four_rows_caps_the_chain_and_drops_trees():
    jump = {n: (0.100 if n <= 4 else 0.300) for n in range(1, 17)}
    m = _measurements([[0] * 200], [[0] * 200], target=jump)
    assert cheap_rows(jump) == 4
    cands = candidates([32768], jump)
    assert {str(c.shape) for c in cands if c.shape} == {"chain-1", "chain-2", "chain-3", "chain-4", "chain-5",
                                                        "static-1x2", "static-1x3"}  # trees of <= 3 nodes
    best = rank_predictions(m, cands)[0].candidate
    assert best.shape == TreeShape.chain(3) and best.map_size == 32768
    # a draft that is never right: vanilla wins
    m = _measurements([[OUTSIDE] * 200], [[OUTSIDE] * 200], target=jump)
    assert rank_predictions(m, cands)[0].candidate == Candidate(None, None)


def test_static_trees_win_where_the_second_choice_is_often_right():
    # the top-1 is right only half the time, the top-2 always: a 2-wide tree doubles the accepted length
    m = _measurements([[0, 1] * 100], [[0, 1] * 100])
    per_chain, _ = acceptance(m.ranks[None], TreeShape.chain(3))
    per_tree, _ = acceptance(m.ranks[None], TreeShape.static(3, 2))
    assert per_tree == pytest.approx(4.0, abs=0.05) and per_chain < 2.0
    assert rank_predictions(m, candidates([32768], m.target_costs))[0].candidate.shape.kind == "static"


def test_the_bench_confirms_vanilla_the_top_and_the_best_without_a_map():
    m = _measurements([_pattern(5, 1)], [_pattern(5, 1)])
    ranked = rank_predictions(m, candidates([32768], m.target_costs))
    chosen = to_confirm(ranked, top=2)
    assert chosen[0] == Candidate(None, None)
    drafting = [p.candidate for p in ranked if p.candidate.shape is not None]
    assert chosen[1:3] == drafting[:2] and drafting[0].map_size == 32768
    best_no_map = next(c for c in drafting if c.map_size is None)
    assert best_no_map in chosen and len(chosen) == 3 + (best_no_map not in drafting[:2])
    assert len(set(chosen)) == len(chosen)
    assert Candidate(32768, TreeShape.chain(3)).label == "chain-3 map=32768"
    assert Candidate(None, TreeShape.static(2, 2)).label == "static-2x2 no map"
