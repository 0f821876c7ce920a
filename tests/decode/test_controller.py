"""The per-request controller (decode/controller.py) on fake costs and fake acceptance: no models.

A fake request is a stream of target tokens, each with a rank in the ranked head (which map sizes hold it); a
draft agrees with the target with probability `agree` where its rows hold the target's token. `simulate` plays
the engine: choose, "draft" and "verify" the chain, observe.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from frspec.decode import controller
from frspec.decode.controller import (EXPLORE_BUDGET, EXPLORE_LOSS, ControllerSettings, Plan, carried_confidence,
                                      chain_rule, choose, count_saving, drafter_prefill_tokens, expected_tokens,
                                      new_request, observe, rates, step_shape)
from frspec.decode.step_costs import StepCosts
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError

SIZES = (8192, 16384, 32768, 151936)


def costs(target, head_per_row=2e-8, base=0.02, rows=range(1, 9)) -> StepCosts:
    """`target(n)` seconds for n rows; the draft head costs head_per_row per map row."""
    return StepCosts({n: target(n) for n in rows}, {1: base},
                     {k: {1: head_per_row * k} for k in SIZES}, full_size=SIZES[-1])


FLAT = costs(lambda n: 0.3 + 0.01 * n)  # bandwidth-bound: extra rows nearly free
LINEAR = costs(lambda n: 0.3 * n)  # k + 1 rows cost k + 1 one-row forwards (the 2-core EPYC in bf16)


def simulate(settings, step_costs, rank_of_token, agree, steps=300, seed=0, world_seed=1, budget=math.inf):
    """Plans chosen over `steps` steps; rank_of_token(t, rng) gives the t-th target token's rank. Each step's saving
    is counted as the engine counts it (count_saving), against `budget` seconds for the steps taken to find out."""
    state = new_request(settings, seed=seed)
    state.explore_budget_s = budget
    world = random.Random(world_seed)
    plans, t = [], 0
    for _ in range(steps):
        behind = state.behind
        plan = choose(state, step_costs)
        ranks, accepted = [], 0
        for i in range(plan.depth + 1):
            r = rank_of_token(t, world)
            t += 1
            ranks.append(r)
            if i == plan.depth or not (r < plan.size and world.random() < agree):
                break
            accepted += 1
        observe(state, plan, accepted, ranks)
        count_saving(state, step_costs, plan.depth, plan.size, len(ranks), behind=behind,
                     finding_out=plan.finding_out)
        plans.append(plan)
    return plans, state


def in_top(n):
    return lambda t, rng: rng.randrange(n)


def test_linear_target_costs_mean_plain_decoding_even_at_perfect_acceptance():
    settings = ControllerSettings(sizes=SIZES)
    plans, state = simulate(settings, LINEAR, in_top(100), agree=1.0)
    assert all(p.depth == 0 for p in plans)  # and it never probes: no acceptance could pay
    assert state.chosen_depths == [len(plans)]


def test_flat_costs_and_good_acceptance_speculate_with_the_smallest_map_that_holds_the_tokens():
    plans, state = simulate(ControllerSettings(sizes=SIZES), FLAT, in_top(4000), agree=0.9)
    late = plans[50:]
    assert all(p.depth >= 3 for p in late)
    assert all(p.size == 8192 for p in late)  # every token is in the top 8k: the cheapest head loses nothing


def test_it_moves_to_a_larger_map_when_the_target_leaves_the_small_one():
    # A third of the tokens rank between 16k and 32k (code identifiers, another language): the 8k/16k maps miss
    # them, the 32k map holds them and costs far less than the full head.
    def rank(t, rng):
        return rng.randrange(16384, 32768) if rng.random() < 0.33 else rng.randrange(1000)

    plans, _ = simulate(ControllerSettings(sizes=SIZES), costs(lambda n: 0.3 + 0.01 * n, head_per_row=1e-7),
                        rank, agree=0.9)
    assert [p.size for p in plans[-100:] if p.depth].count(32768) >= 95


def test_within_one_request_the_choice_follows_a_change_of_workload():
    def rank(t, rng):
        return rng.randrange(1000) if t < 600 else rng.randrange(20000, 40000)

    plans, state = simulate(ControllerSettings(sizes=SIZES), costs(lambda n: 0.3 + 0.01 * n, head_per_row=1e-7),
                            rank, agree=0.9, steps=400)
    first = [p.size for p in plans[20:100] if p.depth]
    last = [p.size for p in plans[-60:] if p.depth]
    assert first and set(first) == {8192}
    assert last and set(last) <= {32768, 151936} and 8192 not in last
    assert sum(state.chosen_sizes.values()) == sum(1 for p in plans if p.depth)


def test_a_cost_jump_caps_the_draft_length():
    int4_like = costs(lambda n: 0.3 if n <= 4 else 0.9)
    plans, _ = simulate(ControllerSettings(sizes=SIZES), int4_like, in_top(100), agree=0.95)
    assert {p.depth for p in plans[30:]} == {3}


def test_poor_acceptance_falls_back_to_plain_decoding_and_probes_deterministically():
    settings = ControllerSettings(sizes=SIZES, probe_every=10)
    plans, _ = simulate(settings, costs(lambda n: 0.3 + 0.03 * n, base=0.05), in_top(100), agree=0.05, seed=7)
    late = plans[100:]
    plain = sum(p.depth == 0 for p in late)
    probes = [p for p in late if p.probe]
    assert plain >= 0.8 * len(late) and probes and all(p.depth == 1 for p in probes)
    again, _ = simulate(settings, costs(lambda n: 0.3 + 0.03 * n, base=0.05), in_top(100), agree=0.05, seed=7)
    assert again == plans  # the same seed and observations: the same choices
    other, _ = simulate(settings, costs(lambda n: 0.3 + 0.03 * n, base=0.05), in_top(100), agree=0.05, seed=8)
    assert [p.probe for p in other] != [p.probe for p in plans]  # the probe schedule is the seed's


# A forward over 2-7 rows costs about what one over 2 does, well above one row (bf16 on the AVX-512 EPYC: 1.4-1.7x).
SHELF = costs(lambda n: 0.16 if n == 1 else 0.26, base=0.05)


def test_a_probe_drafts_the_length_that_loses_least_at_the_estimate():
    # Where rows cost alike past the second, a probe of one draft pays the dear second row for the fewest tokens
    # and the least evidence: it drafts the length the estimate says loses least (where rows cost in proportion,
    # that is one draft: the test above).
    settings = ControllerSettings(sizes=SIZES, probe_every=10)
    plans, _ = simulate(settings, SHELF, in_top(100), agree=0.45, steps=400)
    late = plans[100:]
    probes = [p for p in late if p.probe]
    assert sum(p.depth == 0 for p in late) >= 0.8 * len(late) and len(probes) >= 10
    assert all(p.depth >= 2 for p in probes)
    state = new_request(settings)
    state.plain_steps, state.next_probe, state.behind = 0, 1, 10
    state.tried, state.agreed, state.squared = [200.0], [90.0], [90.0]  # 0.45 over many drafts: plain wins
    options, hopeful = rates(state, SHELF), rates(state, SHELF, acceptance="perfect")
    plan = choose(state, SHELF)
    # Among the lengths perfect acceptance would pay for (one draft would not: its second row costs too much).
    paying = [d for (d, k), rate in hopeful.items() if d > 0 and k == plan.size and rate > hopeful[(0, SIZES[-1])]]
    assert 1 not in paying and plan.probe and plan.depth == max(paying, key=lambda d: options[(d, plan.size)])


def test_recovers_when_acceptance_comes_back():
    state = new_request(ControllerSettings(sizes=SIZES, probe_every=4))
    world = random.Random(0)
    plans = []
    for step in range(400):
        agree = 0.02 if step < 100 else 0.95
        plan = choose(state, costs(lambda n: 0.3 + 0.03 * n, base=0.05))
        accepted = 0
        while accepted < plan.depth and world.random() < agree:
            accepted += 1
        observe(state, plan, accepted, [0] * (accepted + 1))
        plans.append(plan)
    assert sum(p.depth == 0 for p in plans[60:100]) >= 30
    assert all(p.depth >= 2 for p in plans[-50:])


def test_expected_tokens_is_the_chain_formula():
    state = new_request(ControllerSettings(sizes=(10, 20)), coverage_prior={10: 0.5, 20: 1.0})
    a = state.agreement(0)
    assert expected_tokens(state, 0, 10) == 1.0
    assert expected_tokens(state, 2, 20) == pytest.approx(1 + a + a * a)
    assert expected_tokens(state, 2, 10) == pytest.approx(1 + a * 0.5 + (a * 0.5) ** 2)


def test_a_tree_is_drafted_whole_or_not_at_all_and_sizes_still_move():
    tree = TreeShape.static(2, 2)
    plans, _ = simulate(ControllerSettings(sizes=SIZES, shape=tree), FLAT, in_top(4000), agree=0.9)
    assert {p.depth for p in plans} <= {0, 2} and plans[-1].depth == 2 and plans[-1].size == 8192
    plans, _ = simulate(ControllerSettings(sizes=SIZES, shape=tree), LINEAR, in_top(4000), agree=0.9)
    assert {p.depth for p in plans} == {0}


def test_remaining_budget_bounds_the_draft():
    state = new_request(ControllerSettings(sizes=SIZES))
    assert choose(state, FLAT, remaining=2).depth <= 1
    assert choose(state, FLAT, remaining=1).depth == 0


def test_bad_settings_and_cost_records_are_one_line_errors():
    with pytest.raises(FrspecError):
        ControllerSettings(sizes=())
    with pytest.raises(FrspecError):
        ControllerSettings(sizes=(0,))
    with pytest.raises(FrspecError):
        ControllerSettings(sizes=(8,), depths=(-1,))
    with pytest.raises(FrspecError):
        StepCosts.from_dict({"target_costs": {}, "draft_base_costs": {"1": 0.1}, "head_costs": {}})
    record = FLAT.to_dict()
    assert StepCosts.from_dict(record).to_dict() == record


def test_speculation_can_pay_only_where_some_draft_beats_a_plain_step_at_best():
    from frspec.decode.controller import speculation_can_pay

    assert speculation_can_pay(ControllerSettings(sizes=SIZES), FLAT)
    assert not speculation_can_pay(ControllerSettings(sizes=SIZES), LINEAR)
    assert not speculation_can_pay(ControllerSettings(sizes=SIZES, depths=(0,)), FLAT)
    assert not speculation_can_pay(ControllerSettings(sizes=SIZES, shape=TreeShape.static(2, 2)), LINEAR)
    # An explicit length or tree (no plain option): it drafts whatever the costs say.
    assert speculation_can_pay(ControllerSettings(sizes=SIZES, depths=(3,)), LINEAR)
    assert speculation_can_pay(ControllerSettings(sizes=SIZES, shape=TreeShape.static(2, 2), allow_plain=False),
                               LINEAR)


def test_one_early_rejection_does_not_stop_drafting_but_steady_rejections_do():
    # Drafting pays at the prior acceptance (0.72) and loses, by a little, at the estimate after one rejection
    # (0.46): a draft is cheap to try, so plain decoding waits until the upper bound of acceptance loses too.
    dear_draft = costs(lambda n: 0.3 + 0.01 * n, base=0.17)
    settings = ControllerSettings(sizes=SIZES)
    state = new_request(settings)
    first = choose(state, dear_draft)
    assert first.depth >= 1
    observe(state, first, 0, [0])  # rejected at once
    assert state.agreement(0) < 0.5  # the estimate alone would decode plainly now
    after = choose(state, dear_draft)
    assert after.depth >= 1 and not after.probe
    plans, _ = simulate(settings, dear_draft, in_top(100), agree=0.3)
    assert sum(p.depth == 0 for p in plans[100:]) >= 0.8 * len(plans[100:])
    good, _ = simulate(settings, dear_draft, in_top(100), agree=0.8)
    assert all(p.depth >= 1 for p in good[20:])


def _rejected_after(good: int, rejected: int) -> "ControllerState":
    """A request whose first `good` chains of 3 were accepted whole, then `rejected` were rejected at once."""
    state = new_request(ControllerSettings(SIZES))
    for _ in range(good):
        observe(state, Plan(3, SIZES[-1]), 3, [0] * 4)
    for _ in range(rejected):
        observe(state, Plan(3, SIZES[-1]), 0, [0])
    return state


def test_drafting_on_the_bound_alone_tries_the_draft_that_loses_least_at_the_estimate():
    # Rows cost more than they do on a GPU but less than linearly: a chain of 1 costs 1.9 plain steps, of 3 3.2.
    thin = StepCosts({n: 0.1 * t for n, t in enumerate((1.0, 1.5, 1.75, 2.0, 2.3, 2.6, 2.9, 3.2), 1)}, {1: 0.04},
                     {k: {1: 2e-8 * k} for k in SIZES}, full_size=SIZES[-1])
    state = _rejected_after(good=3, rejected=1)
    estimate, bound = rates(state, thin), rates(state, thin, acceptance="upper")
    plain = estimate[(0, SIZES[-1])]
    assert max(estimate, key=estimate.get)[0] == 0  # the estimate says plain decoding
    best_bound = max(bound, key=bound.get)
    assert best_bound[0] >= 4  # the bound's favourite: a long chain
    plan = choose(state, thin)
    assert 1 <= plan.depth < best_bound[0] and not plan.probe
    # ... the draft chosen is the one that loses least at the estimate, and it loses under EXPLORE_LOSS.
    assert estimate[(plan.depth, plan.size)] == max(v for (d, _), v in estimate.items() if d > 0)
    assert estimate[best_bound] < estimate[(plan.depth, plan.size)]
    assert estimate[(plan.depth, plan.size)] >= (1 - EXPLORE_LOSS) * plain
    # After a few more rejections every draft the bound still favours loses over EXPLORE_LOSS at the estimate, so
    # it decodes plainly (a wrong try would cost 2-3 plain steps for one token) though the bound alone would draft.
    for rejected in range(2, 9):
        state = _rejected_after(good=3, rejected=rejected)
        if choose(state, thin).depth == 0:
            break
    else:
        raise AssertionError("eight rejections in a row and still drafting")
    estimate, bound = rates(state, thin), rates(state, thin, acceptance="upper")
    plain = estimate[(0, SIZES[-1])]
    paying = [dk for dk, rate in bound.items() if dk[0] > 0 and rate > bound[(0, SIZES[-1])]]
    assert paying  # the bound alone would still draft ...
    assert all(estimate[dk] < (1 - EXPLORE_LOSS) * plain for dk in paying)  # ... but each such draft loses too much


def test_the_steps_taken_to_find_out_stop_once_they_lost_the_requests_exploration_budget():
    settings = ControllerSettings(sizes=SIZES, probe_every=10)
    poor = costs(lambda n: 0.3 + 0.03 * n, base=0.05)
    # Every draft rejected: each step taken to find out loses, so what they lost only grows.
    unbounded, _ = simulate(settings, poor, in_top(100), agree=0.0, seed=7)
    tries = [i for i, p in enumerate(unbounded) if p.finding_out]
    assert len(tries) >= 15  # probes (and drafts on the bound) all through the request
    # A budget of what the first five lost: the same five, then plain decoding to the end.
    _, after_five = simulate(settings, poor, in_top(100), agree=0.0, seed=7, steps=tries[4] + 1)
    budget = after_five.explored_s
    assert budget > 0
    bounded, state = simulate(settings, poor, in_top(100), agree=0.0, seed=7, budget=budget)
    assert bounded[:tries[4] + 1] == unbounded[:tries[4] + 1]
    assert all(p.depth == 0 for p in bounded[tries[4] + 1:]) and state.explored_s == budget
    # A step taken to find out that pays gives its saving back; the estimate's own drafts spend nothing.
    state = new_request(settings)
    count_saving(state, FLAT, 1, SIZES[0], 2, finding_out=True)  # 2 tokens for about one plain step's time
    gave_back = state.explored_s
    assert gave_back < 0
    count_saving(state, FLAT, 1, SIZES[0], 1, finding_out=False)
    assert state.explored_s == gave_back and state.may_explore
    # The budget is EXPLORE_BUDGET of the request's expected plain decoding time, set where its drafter's prefill is
    # decided (unbounded before: a caller that never decides one keeps every step's own bound alone).
    assert new_request(settings).explore_budget_s == math.inf
    state = new_request(settings)
    drafter_prefill_tokens(state, LINEAR, 100, 64)
    assert state.explore_budget_s == pytest.approx(EXPLORE_BUDGET * 64 * LINEAR.step_time_s(None))


def test_a_timed_step_taken_to_find_out_spends_the_budget_by_the_clock_and_the_worth_by_the_table():
    settings = ControllerSettings(sizes=SIZES)
    plain = FLAT.step_time_s(None)
    at_table = FLAT.step_time_s(step_shape(settings, 1), SIZES[0])
    assert at_table < 2 * plain  # at the table, a chain of 1 that is accepted saves ...
    for clock_s, gains in ((at_table, True), (2.2 * plain, False)):  # ... by the clock it may lose
        state = new_request(settings)
        count_saving(state, FLAT, 1, SIZES[0], 2, finding_out=True, clock_s=clock_s)
        assert state.explored_s == pytest.approx(clock_s - 2 * plain) and (state.explored_s < 0) == gains
        assert state.saved_s == pytest.approx(2 * plain - at_table)  # what its kind carries stays at the table
    # A step not taken to find out spends no budget, timed or not; nor does a plain step.
    state = new_request(settings)
    count_saving(state, FLAT, 1, SIZES[0], 1, finding_out=False, clock_s=3 * plain)
    count_saving(state, FLAT, 0, SIZES[0], 1, finding_out=True, clock_s=3 * plain)
    assert state.explored_s == 0.0


def test_expected_counts_replace_the_accept_reject_outcomes_when_given():
    """Sampling steps report each reached position's acceptance probability and target mass inside the rows
    (decode/acceptance.py); the controller counts those instead of the step's outcome."""
    settings = ControllerSettings(SIZES)
    flips, expectations = new_request(settings), new_request(settings)
    plan = choose(flips, FLAT)
    assert plan.depth >= 2
    observe(flips, plan, 0, [5, 9])  # rejected at the first position
    observe(expectations, plan, 0, [5, 9], expected=[(0.6, 0.9)])
    assert (flips.agreed[0], flips.tried[0]) == (0.0, 1.0)
    assert (expectations.agreed[0], expectations.tried[0]) == (0.6, 0.9)
    assert expectations.agreed[1:] == [0.0] * (plan.depth - 1) == expectations.tried[1:]
    assert expectations.agreement(0) > flips.agreement(0)


def test_the_upper_bound_is_binomial_over_outcomes_and_closes_in_sooner_over_expected_counts():
    """The bound's spread is the observed one: exactly alpha (1 - alpha) over accept/reject outcomes (greedy is
    unchanged), smaller over sampled steps' expected counts, which then stop drafting on a steadily low acceptance
    sooner than coin flips with the same mean do."""
    dear_draft = costs(lambda n: 0.3 + 0.01 * n, base=0.14)
    settings = ControllerSettings(SIZES)
    flips, expectations = new_request(settings), new_request(settings)
    first_plain = {}
    for step in range(30):
        for name, state in (("flips", flips), ("expectations", expectations)):
            if choose(state, dear_draft).depth == 0:
                first_plain.setdefault(name, step)
            plan = Plan(2, SIZES[-1])  # observe the same two-draft step every time: only the evidence differs
        accepted = 1 if step % 5 in (0, 2) else 0  # the first position accepted 2 times in 5: mean 0.4
        observe(flips, plan, accepted, [0] * (accepted + 1))
        observe(expectations, plan, 0, [0], expected=[(0.4, 1.0)])
        for i in range(len(flips.tried)):
            alpha = flips.agreement(i)
            assert flips.agreement_spread(i) == pytest.approx(alpha * (1 - alpha), abs=1e-12)
    alpha = expectations.agreement(0)
    assert alpha == pytest.approx(flips.agreement(0), abs=0.05)
    assert expectations.agreement_spread(0) < 0.5 * alpha * (1 - alpha)
    assert expectations.agreement_upper_bound(0) < flips.agreement_upper_bound(0)
    assert first_plain["expectations"] < first_plain.get("flips", 30)  # coin flips: still drafting after 30 steps


def test_catching_up_costs_the_drafters_extra_rows():
    # Chains only measure the drafter's one-row forward: its extra rows cost what the target's curve says.
    assert LINEAR.catch_up_s(1) == 0.0
    assert LINEAR.catch_up_s(5) == pytest.approx(0.02 * (1.5 / 0.3 - 1))
    assert FLAT.catch_up_s(5) == pytest.approx(0.02 * (0.35 / 0.31 - 1))
    # Measured widths (trees) are the drafter's own.
    trees = StepCosts({1: 0.3, 2: 0.6}, {1: 0.02, 4: 0.05}, {None: {1: 0.001}})
    assert trees.catch_up_s(4) == pytest.approx(0.03)
    # A drafter `behind` tokens behind reads them and the new token: behind + 1 rows; not behind, nothing.
    assert trees.behind_s(0) == 0.0 and trees.behind_s(3) == pytest.approx(trees.catch_up_s(4))


# Rows cost nearly as much as whole forwards (an AVX2-only CPU in bf16): at perfect acceptance a draft saves a few
# percent, less than a drafter left behind by plain steps pays to catch up.
THIN = costs(lambda n: 0.3 * n - 0.02 * (n - 1), base=0.01)


def test_a_drafter_left_behind_is_probed_only_where_catching_up_can_pay():
    settings = ControllerSettings(sizes=SIZES, probe_every=10)
    plans, state = simulate(settings, THIN, in_top(100), agree=0.05, steps=200)
    assert state.behind > 10 and all(p.depth == 0 for p in plans[50:])  # no probes: catching up costs more
    # Where extra rows are cheap, the same poor acceptance still gets probes after as many plain steps.
    plans, state = simulate(settings, costs(lambda n: 0.3 + 0.03 * n, base=0.05), in_top(100), agree=0.05, seed=7)
    assert any(p.probe for p in plans[50:])
    assert state.behind <= 15 + 1  # probe_every plus its jitter


def test_a_probe_is_taken_only_where_perfect_acceptance_would_gain_enough(monkeypatch):
    """A probe finds out whether acceptance is high; where even perfect acceptance would gain under PROBE_GAIN over
    plain decoding (its catch-up counted), that is worth less than the probe costs."""
    from frspec.decode.controller import PROBE_GAIN, _best

    settings = ControllerSettings(sizes=SIZES, probe_every=10)

    def perfect_gain(step_costs, state, behind):
        hopeful = rates(dataclasses.replace(state, behind=behind), step_costs, acceptance="perfect")
        return hopeful[_best(hopeful)] / hopeful[(0, SIZES[-1])]

    slim = costs(lambda n: 0.3 + 0.26 * (n - 1), base=0.01)
    ample = costs(lambda n: 0.3 + 0.24 * (n - 1), base=0.01)
    plans, state = simulate(settings, slim, in_top(100), agree=0.05, steps=200, seed=7)
    assert all(1.0 < perfect_gain(slim, state, behind) < 1.0 + PROBE_GAIN for behind in (10, 15))
    assert not any(p.probe for p in plans[50:])
    plans, state = simulate(settings, ample, in_top(100), agree=0.05, steps=200, seed=7)
    assert all(perfect_gain(ample, state, behind) > 1.0 + PROBE_GAIN for behind in (10, 15))
    assert any(p.probe for p in plans[50:])
    monkeypatch.setattr(controller, "PROBE_GAIN", 0.0)  # the same slim upside, probed without the rule
    plans, _ = simulate(settings, slim, in_top(100), agree=0.05, steps=200, seed=7)
    assert any(p.probe for p in plans[50:])


def test_a_plain_step_puts_the_drafter_one_token_behind_and_a_draft_catches_it_up():
    state = new_request(ControllerSettings(sizes=SIZES))
    observe(state, Plan(0, SIZES[-1]), 0, [1])
    observe(state, Plan(0, SIZES[-1]), 0, [1])
    assert state.behind == 2
    options = rates(state, THIN)
    ahead = rates(dataclasses.replace(state, behind=0), THIN)  # the same evidence, the drafter caught up
    assert options[(0, SIZES[-1])] == ahead[(0, SIZES[-1])]
    assert all(options[dk] < ahead[dk] for dk in options if dk[0])  # each draft also pays the catch-up
    observe(state, Plan(1, SIZES[-1]), 1, [1, 1])
    assert state.behind == 0


def test_a_request_drafts_only_where_the_saving_expected_before_its_first_step_wins_back_the_drafters_prefill():
    from frspec.decode.controller import PRIOR_ACCEPTANCE, CarriedWorth, drafter_prefill_tokens, speculation_can_pay

    settings = ControllerSettings(sizes=SIZES)

    def prefill_tokens(step_costs, prompt_tokens, max_new_tokens, windows=(), request_settings=settings):
        return drafter_prefill_tokens(new_request(request_settings), step_costs, prompt_tokens, max_new_tokens,
                                      windows)

    # Two target rows cost 1.4x one, seven 3.4x: at perfect acceptance drafting saves 0.137 s a token (a chain of
    # 6), at the prior's acceptance 0.044 s (a chain of 1). The drafter's prefill over a prompt costs its one-row
    # forward scaled by the target's curve over that many rows: 0.81 s over 100 tokens, 4.81 s over 600.
    mid = costs(lambda n: 0.3 + 0.12 * (n - 1))
    assert speculation_can_pay(settings, mid)
    assert prefill_tokens(mid, 100, 64) == 100  # 2.8 s saved > 0.81 s: the whole prompt
    # 4.81 s: more than the 2.8 s expected over 64 tokens, less than the 8.8 s a perfect drafter would save. The
    # estimate decides (a prefill, once paid, is sunk).
    assert prefill_tokens(mid, 600, 64) == 0
    assert prefill_tokens(mid, 600, 256) == 600  # 11.3 s saved
    assert prefill_tokens(mid, 100, 1) == 0  # nothing to draft for
    # A drafter that can read a window of the prompt: the longest window won back, 256 tokens (2.06 s < 2.8 s;
    # 512 would cost 4.1 s). Windows as long as the prompt or longer are no windows; none won back: plain.
    assert prefill_tokens(mid, 600, 64, windows=(2048, 1024, 512, 256)) == 256
    assert prefill_tokens(mid, 600, 256, windows=(512, 256)) == 600  # the whole prompt where it pays
    assert prefill_tokens(mid, 100, 64, windows=(256,)) == 100
    assert prefill_tokens(mid, 600, 16, windows=(512, 256)) == 0  # 0.7 s saved: not even 256 tokens' 2.06 s
    # Where drafting only pays at acceptances far above the prior's, no request of a kind whose drafts were seen
    # accepted at the prior's rate prefills the drafter ...
    thin = costs(lambda n: 0.3 * n - 0.05 * (n - 1))
    assert speculation_can_pay(settings, thin)
    at_prior = CarriedWorth(agreed=PRIOR_ACCEPTANCE * 40, tried=40.0, squared=PRIOR_ACCEPTANCE * 40)
    assert drafter_prefill_tokens(new_request(settings, worth=at_prior), thin, 36, 64) == 0
    # ... but a kind's first request (no drafts carried) finds out, where the prefill is cheap (0.60 s over 36
    # tokens, 3% of 64 plain steps) and perfect acceptance would win it back: the whole prompt, never a window.
    assert prefill_tokens(thin, 36, 64) == 36
    assert prefill_tokens(thin, 600, 64, windows=(256,)) == 0  # a prefill dearer than EXPLORE_PREFILL_SHARE
    # Where extra rows are nearly free, a long prompt's drafter prefill is won back within a short request.
    assert prefill_tokens(FLAT, 2000, 64, windows=(1024, 512)) == 2000
    # An explicit length cannot decode plainly: it drafts whatever the costs, over the whole prompt.
    assert prefill_tokens(LINEAR, 2000, 64, (256,), ControllerSettings(sizes=SIZES, depths=(3,))) == 2000


def test_what_drafting_saved_on_earlier_requests_of_a_kind_scales_the_saving_a_prefill_is_weighed_against():
    from frspec.decode.controller import (WORTH_DECAY, CarriedWorth, carry_worth, count_saving,
                                          drafter_prefill_tokens, request_kind)

    settings = ControllerSettings(sizes=SIZES)
    mid = costs(lambda n: 0.3 + 0.12 * (n - 1))  # as above: 0.044 s a token expected at the prior; the drafter's
    # prefill 0.81 s over 100 prompt tokens, 4.81 s over 600

    def prefill_tokens(worth, prompt_tokens, max_new_tokens, windows=()):
        return drafter_prefill_tokens(new_request(settings, worth=worth), mid, prompt_tokens, max_new_tokens,
                                      windows)

    def request(worth, saving_ratio, tokens=64, whole=True, prompt_tokens=600, max_new_tokens=64):
        """A request whose steps saved `saving_ratio` times what was expected before its first step."""
        state = new_request(settings, worth=worth)
        drafter_prefill_tokens(state, mid, prompt_tokens, max_new_tokens)
        state.saved_s, state.counted_tokens = saving_ratio * state.expected_saving * tokens, tokens
        return carry_worth(worth, state, whole)

    assert prefill_tokens(None, 600, 64) == 0  # 2.8 s expected against 4.81 s (the test above)
    # A translation before it saved 3x what was expected (its drafts all accepted): worth (3 + 1) / (1 + 1) = 2,
    # 5.6 s against 4.81 s: the whole prompt.
    drafted_well = request(None, 3.0)
    assert drafted_well.scale == pytest.approx(2.0)
    assert prefill_tokens(drafted_well, 600, 64) == 600
    # Requests that saved nothing (their drafts rejected, or their steps plain once the request learned it) lower it:
    # 100 prompt tokens and 24 new ones, 1.06 s expected against 0.81 s, but half that after one such request.
    assert prefill_tokens(None, 100, 24) == 100
    drafted_badly = request(None, 0.0, prompt_tokens=100, max_new_tokens=24)
    assert drafted_badly.scale == pytest.approx(0.5)
    assert prefill_tokens(drafted_badly, 100, 24) == 0
    # ... and never for good: every later request of the kind that does not draft ages it back toward the prior
    # (scale 1 / (1 + 0.7^n) after n of them), so one of them drafts again: the fifth, once 0.7^n <= 0.30.
    worth, waited = drafted_badly, 0
    while prefill_tokens(worth, 100, 24) == 0:
        worth, waited = carry_worth(worth, new_request(settings), counts=False), waited + 1
    assert waited == 4 and worth.weight == pytest.approx(WORTH_DECAY ** 4)
    # A windowed request's drafts say little of a whole prompt's: it only ages the worth. A short request weighs its
    # share of WORTH_TOKENS; one ratio counts up to WORTH_MAX.
    assert request(drafted_well, 0.0, whole=False) == CarriedWorth(3.0 * WORTH_DECAY, WORTH_DECAY)
    assert request(None, 3.0, tokens=16) == CarriedWorth(0.75, 0.25)
    assert request(None, 100.0).ratios == controller.WORTH_MAX
    # Kinds split at PROMPT_CLASSES: a 60-token question and a 600-token translation carry apart.
    assert request_kind(60) != request_kind(600) and request_kind(600) == request_kind(1300)

    # Kinds also split by whether the prompt's tokens are common ones (ranked under COMMON_RANKS): a translation and a
    # code file of the same length carry apart; no ranking, no split.
    common, rare = [5] * 600, [5] * 450 + [100_000] * 150
    assert request_kind(600, common) != request_kind(600, rare)
    assert request_kind(600, common) == request_kind(1300, common)
    assert request_kind(600)[1] is None

    # What a step saved, at the costs: its emitted tokens' plain steps less its own time (a catch-up included); a
    # plain step saves nothing and counts its token.
    state = new_request(settings)
    plain, two = mid.step_time_s(None), mid.step_time_s(TreeShape.chain(2), SIZES[-1])
    count_saving(state, mid, 2, SIZES[-1], 3)
    assert state.saved_s == pytest.approx(3 * plain - two) and state.counted_tokens == 3
    count_saving(state, mid, 0, SIZES[-1], 1)
    assert state.saved_s == pytest.approx(3 * plain - two) and state.counted_tokens == 4
    count_saving(state, mid, 2, SIZES[-1], 1, behind=4)
    assert state.saved_s == pytest.approx(4 * plain - 2 * two - mid.catch_up_s(5))


def test_a_kind_carries_how_its_drafts_were_accepted_and_its_first_request_finds_out():
    """Where no draft pays at PRIOR_ACCEPTANCE, only a request that drafts can show that a kind's drafts pay: its
    first request drafts where that is cheap to find out, and what its drafts showed is the next one's prior."""
    from frspec.decode.controller import (EXPLORE_PREFILL_SHARE, PRIOR_ACCEPTANCE, PRIOR_DRAFTS, carry_worth,
                                          drafter_prefill_tokens)

    settings = ControllerSettings(sizes=SIZES)
    # One target row 0.3 s, four 0.9 s: at the prior's acceptance every draft loses (a chain of 1 emits 1.72 tokens
    # in 0.52 s), at 0.95 a chain of 3 saves 0.04 s a token. The drafter's prefill over 36 tokens costs 0.49 s (3%
    # of 64 plain steps), over 200 tokens 2.7 s (14%).
    tight = costs(lambda n: 0.3 + 0.2 * (n - 1))
    assert tight.drafter_prefill_s(200) > EXPLORE_PREFILL_SHARE * 64 * tight.step_time_s(None)

    def drafted(acceptance: float, carried=None):
        """A request of 40 chains of 3 (a draft accepted with probability `acceptance`), carried on."""
        state, world = new_request(settings, worth=carried), random.Random(0)
        assert drafter_prefill_tokens(state, tight, 36, 64) == 36
        for _ in range(40):
            accepted = 0
            while accepted < 3 and world.random() < acceptance:
                accepted += 1
            observe(state, Plan(3, SIZES[-1]), accepted, [1] * (accepted + 1))
        return carry_worth(carried, state, counts=True)

    def prefill(carried, prompt_tokens=36):
        return drafter_prefill_tokens(new_request(settings, worth=carried), tight, prompt_tokens, 64)

    assert prefill(None) == 36 and prefill(None, 200) == 0  # the first request tries, where that is cheap
    well, badly = drafted(0.95), drafted(0.4)
    assert new_request(settings, worth=well).prior_acceptance > 0.9
    assert new_request(settings, worth=badly).prior_acceptance < 0.45
    assert prefill(well) == 36 and prefill(badly) == 0  # now by the kind's estimate, no longer exploring
    assert not new_request(settings, worth=badly).explore_prefill
    # A request whose drafts do not count (read through a window: carried apart) carries nothing; requests that do
    # not draft age what was carried, until too few drafts are left to go by and a request of the kind finds out.
    assert carry_worth(badly, new_request(settings), counts=False).tried == pytest.approx(badly.tried * 0.7)
    aged, plain = badly, 0
    while prefill(aged) == 0:
        aged, plain = carry_worth(aged, new_request(settings), counts=False), plain + 1
    assert aged.tried < PRIOR_DRAFTS <= aged.tried / 0.7 and plain == 7
    # Within a request the carried acceptance is the pooled prior: drafts seen accepted well start chains long.
    assert new_request(settings, worth=well).agreement(2) > 0.9 > PRIOR_ACCEPTANCE
    # A kind with no drafts of its own starts from its sampling setting's (every kind's, carried alike): at
    # temperature 1.0 a code file's first request from what questions' drafts showed there, not from the prior.
    fresh = new_request(settings, worth=None, setting_worth=badly)
    assert fresh.prior_acceptance == pytest.approx(badly.acceptance()[0]) and fresh.explore_prefill
    own = new_request(settings, worth=well, setting_worth=badly)  # its own drafts weigh, the setting's as a prior
    assert badly.acceptance()[0] < own.prior_acceptance < well.acceptance()[0]
    assert own.prior_acceptance == pytest.approx(well.acceptance(badly.acceptance())[0])


def test_a_kinds_first_request_finds_out_only_where_the_bound_wins_the_prefill_back_with_a_margin(monkeypatch):
    """The upper bound is the best a kind may turn out to be: a prefill it wins back only just is a sure cost for a
    slim chance, so a first request prefills to find out where the bound wins it back FIND_OUT_MARGIN times."""
    from frspec.decode.controller import (EXPLORE_PREFILL_SHARE, FIND_OUT_MARGIN, _estimated_saving,
                                          request_contexts)

    settings = ControllerSettings(sizes=SIZES)
    slim = costs(lambda n: 0.3 + 0.26 * (n - 1))  # at perfect acceptance a chain saves little
    bound, plain_s = _estimated_saving(new_request(settings), slim, 64, request_contexts(slim, 50, 64),
                                       acceptance="upper")
    prefill = slim.drafter_prefill_s(50)
    assert prefill < EXPLORE_PREFILL_SHARE * 64 * plain_s and 1.0 < bound * 64 / prefill < FIND_OUT_MARGIN
    assert drafter_prefill_tokens(new_request(settings), slim, 50, 64) == 0
    monkeypatch.setattr(controller, "FIND_OUT_MARGIN", 1.0)
    assert drafter_prefill_tokens(new_request(settings), slim, 50, 64) == 50


def test_a_kinds_first_request_whose_whole_prompt_is_too_dear_finds_out_through_a_window():
    """A kind's first request whose whole prompt's prefill costs more than EXPLORE_PREFILL_SHARE of its plain time
    reads the longest window whose prefill fits that share, where acceptance's upper bound wins it back, and drafts
    at once (a prefill taken to find out that decodes plainly finds nothing out). What the windows' drafts show is
    carried apart from the kind's whole prompts' and weighs its later windows: drafted well, a later request reads a
    window its kind's prior alone would not have; drafted badly, it no longer finds out."""
    from frspec.decode.controller import EXPLORE_PREFILL_SHARE, PRIOR_ACCEPTANCE, CarriedWorth

    settings = ControllerSettings(sizes=SIZES)
    tight = costs(lambda n: 0.3 + 0.2 * (n - 1))  # at the prior every draft loses (as above)
    plain_s = 128 * tight.step_time_s(None)  # 38.4 s; the share's 3.84 s
    windows = (256, 128, 64)
    assert tight.drafter_prefill_s(300) > EXPLORE_PREFILL_SHARE * plain_s >= tight.drafter_prefill_s(256)
    well = CarriedWorth(ratios=1.0, weight=1.0, agreed=47.5, tried=50.0, squared=47.5)  # 0.95
    badly = CarriedWorth(ratios=0.3, weight=1.0, agreed=20.0, tried=50.0, squared=20.0)  # 0.4

    def prefill(**carried):
        state = new_request(settings, **carried)
        return state, drafter_prefill_tokens(state, tight, 300, 128, windows)

    state, tokens = prefill()
    assert tokens == 256 and state.prefill_saving > 0  # the longest window that fits, taken at the bound ...
    assert state.expected_saving * 128 < tight.drafter_prefill_s(64)  # ... not by the estimate: no window pays there
    assert state.next_probe == 1  # and its first plain-looking step probes
    assert prefill(window_worth=badly)[1] == 0  # the kind's windows showed enough: no longer finding out
    assert prefill(worth=badly)[1] == 0  # nor once its whole prompts have
    # Windows drafted well: the next request reads one at what they showed (its kind's prior is unchanged).
    state, tokens = prefill(window_worth=well)
    assert state.prior_acceptance == pytest.approx(PRIOR_ACCEPTANCE)
    assert state.window_acceptance[0] == pytest.approx(well.acceptance()[0]) and tokens == 256
    assert state.expected_saving * state.window_scale * 128 > tight.drafter_prefill_s(256) and state.next_probe > 1


def test_a_later_request_finds_out_its_own_acceptance_where_the_prefill_fits_its_exploration_budget(monkeypatch):
    """A kind's requests differ (MT-Bench's questions ran 0.83-1.43x vanilla one by one at static chains of 3): one
    whose kind carried enough drafts to say none pays still prefills its drafter to find out its own acceptance,
    where that wins back at acceptance's upper bound and the prefill costs at most EXPLORE_PREFILL_OF_BUDGET of its
    exploration budget, which the prefill then spends. It waits for a late prefill by the saving it was taken for."""
    from frspec.decode.controller import (EXPLORE_PREFILL_OF_BUDGET, LATE_PREFILL_SHARE, CarriedWorth,
                                          plain_tokens_first)

    settings = ControllerSettings(sizes=SIZES)
    tight = costs(lambda n: 0.3 + 0.2 * (n - 1))  # as above: at the prior every draft loses
    # 50 drafts carried, 0.42 accepted (with the prior's), drafting saved 0.65 of what was expected.
    badly = CarriedWorth(ratios=0.3, weight=1.0, agreed=20.0, tried=50.0, squared=20.0)
    prefill = tight.drafter_prefill_s(36)

    def later(max_new_tokens):
        state = new_request(settings, worth=badly)
        assert not state.explore_prefill  # not the kind's first requests: those find out for the kind
        return state, drafter_prefill_tokens(state, tight, 36, max_new_tokens)

    state, tokens = later(64)  # 64 plain steps: 19.2 s, whose budget's share is 0.29 s, under the prefill's 0.49
    assert prefill > EXPLORE_PREFILL_OF_BUDGET * EXPLORE_BUDGET * 64 * 0.3 and tokens == 0
    assert state.explore_prefill_s == 0 and state.prefill_saving == 0
    state, tokens = later(256)
    assert tokens == 36 and state.expected_saving * state.worth * 256 < prefill  # not by the estimate
    assert state.explore_prefill_s == pytest.approx(prefill) and state.may_explore
    state.explored_s = state.explore_budget_s - prefill  # the steps that find out get what the prefill left
    assert not state.may_explore
    # The wait before a late prefill forgoes LATE_PREFILL_SHARE of it at the bound's saving: a few tokens, where at
    # the estimate's (almost nothing) it waited past the answer's end.
    assert 0 < plain_tokens_first(state, tight, 36) < LATE_PREFILL_SHARE * 256
    monkeypatch.setattr(controller, "EXPLORE_PREFILL_OF_BUDGET", 0.0)
    assert later(256)[1] == 0


def test_a_late_drafter_prefill_waits_until_the_plain_tokens_forgo_a_share_of_it():
    from frspec.decode.controller import LATE_PREFILL_SHARE, CarriedWorth, drafter_prefill_tokens, plain_tokens_first

    settings = ControllerSettings(sizes=SIZES)
    mid = costs(lambda n: 0.3 + 0.12 * (n - 1))  # 0.044 s a token expected at the prior; the drafter's prefill
    # 0.81 s over 100 prompt tokens, 4.81 s over 600 (the tests above)

    def plain_first(prompt_tokens, max_new_tokens, worth=None):
        state = new_request(settings, worth=worth)
        return plain_tokens_first(state, mid, drafter_prefill_tokens(state, mid, prompt_tokens, max_new_tokens))

    assert LATE_PREFILL_SHARE == 0.05
    assert plain_first(600, 256) == 5  # 5 x 0.044 s forgone <= 5% of 4.81 s < 6 x 0.044 s
    assert plain_first(600, 256, CarriedWorth(3.0, 1.0)) == 2  # saving twice as much a token: fewer wait
    assert plain_first(100, 64) == 0  # 5% of 0.81 s is less than one token's saving: no wait
    assert plain_first(2000, 64) == 0  # no prefill at all
    # Before the saving is estimated, or with nothing to prefill, nothing waits.
    assert plain_tokens_first(new_request(settings), mid, 600) == 0
    state = new_request(settings)
    drafter_prefill_tokens(state, mid, 600, 256)
    assert plain_tokens_first(state, mid, 0) == 0


def test_the_prompts_tokens_are_evidence_of_coverage_before_the_first_step():
    from frspec.decode.controller import PROMPT_TOKEN_WEIGHT, PROMPT_WINDOW, observe_prompt

    # The corpus says the 8k map holds every token; this request's prompt (another language) lies mostly between
    # 8k and 32k.
    prior = {k: 1.0 for k in SIZES}
    head = costs(lambda n: 0.3 + 0.01 * n, head_per_row=1e-7)
    settings = ControllerSettings(sizes=SIZES)
    prompt = [20000 + i if i % 4 else 100 for i in range(600)]  # a quarter inside 8k, all inside 32k

    blind = new_request(settings, prior)
    assert choose(blind, head).size == 8192  # the corpus's coverage alone bets on the smallest map
    told = new_request(settings, prior)
    observe_prompt(told, prompt)
    assert told.coverage(8192) < 0.7 and told.coverage(32768) == pytest.approx(1.0)
    assert choose(told, head).size == 32768

    # A prompt weighs as a few emitted tokens, a short one less than a long one: the output soon outweighs it.
    short = new_request(settings, prior)
    observe_prompt(short, prompt[-40:])
    assert 0 < short.seen < told.seen < 200 * PROMPT_TOKEN_WEIGHT
    assert told.coverage(8192) < short.coverage(8192) < blind.coverage(8192)
    for _ in range(40):  # the request's own tokens are all in the top 8k
        observe(told, Plan(1, 32768), 1, [5, 5])
    assert told.coverage(8192) > 0.9
    # Only the prompt's last PROMPT_WINDOW tokens count, and a prompt before nothing is observed changes nothing.
    window, longer = new_request(settings, prior), new_request(settings, prior)
    observe_prompt(window, (prompt * 2)[-PROMPT_WINDOW:])
    observe_prompt(longer, [0] * 5000 + prompt * 2)
    assert longer.coverage(8192) == pytest.approx(window.coverage(8192)) and window.coverage(8192) < 0.7
    empty = new_request(settings, prior)
    observe_prompt(empty, [])
    assert empty.coverage(8192) == blind.coverage(8192)


def drafted_under_the_rule(state, step_costs, plan, probabilities) -> int:
    """How many tokens a chain drafts for `plan` under `chain_rule` when its picks have these draft probabilities
    (as the drafters ask it: after every token, stopping at the first no or at the plan's longest)."""
    keep = chain_rule(state, step_costs, plan)
    for n, probability in enumerate(probabilities, 1):
        if not keep(probability) or n == plan.drafts:
            return n
    raise AssertionError("more probabilities needed")


@pytest.mark.parametrize("target", [lambda n: 0.3 + 0.01 * n, lambda n: 0.3 + 0.05 * n, lambda n: 0.3 + 0.1 * n,
                                    lambda n: 0.3 + 0.06 * (n >= 3), lambda n: 0.3 + 0.02 * n + 0.05 * (n >= 3)])
def test_without_evidence_of_confidence_a_chain_stops_at_the_best_fixed_length(target):
    """Every confidence bin at the pooled rate: the probability the chain so far is all accepted falls as the fixed
    lengths' expectation does, so drafting on pays exactly while a longer fixed length would have: the chain
    drafts the best fixed length, whatever the pick probabilities (the rule can only gain where they say more).
    Also where the third row is dear and the ones after it cheap (the 2-core EPYC's bf16 table: 3 rows 238 ms
    after 2 rows' 236, rescaled x0.86 against x0.81): weighing the next draft alone would stop at 1 there."""
    step_costs = costs(target, base=0.05)
    state = new_request(ControllerSettings(sizes=SIZES))
    plan = choose(state, step_costs)
    assert plan.adaptive and plan.longest == max(state.settings.depths) > plan.depth >= 1
    for probability in (0.01, 0.5, 0.99):
        assert drafted_under_the_rule(state, step_costs, plan, [probability] * 10) == plan.depth


def test_unsure_picks_end_a_chain_and_sure_ones_run_it_to_the_longest_length():
    """Evidence that drafts drawn at a draft probability above 0.9 are accepted and those below 0.1 are not: a
    chain runs on through sure picks to the longest allowed length and stops right after an unsure one."""
    step_costs = costs(lambda n: 0.3 + 0.02 * n, base=0.05)
    state = new_request(ControllerSettings(sizes=SIZES))
    # Every position is accepted as often as the others (2 in 3); the pick's probability tells which.
    histories = [([0.97, 0.97, 0.97], 3), ([0.97, 0.03], 1), ([0.03], 0), ([0.97, 0.97, 0.97], 3),
                 ([0.97, 0.97, 0.03], 2), ([0.03], 0)]
    for i in range(60):
        picks, accepted = histories[i % len(histories)]
        plan = choose(state, step_costs)
        keep = chain_rule(state, step_costs, plan)
        for probability in picks:
            keep(probability)
        drawn = [1.0] * accepted + [0.0] * (len(picks) - accepted)
        observe(state, Plan(len(picks), plan.size), accepted, [0] * (accepted + 1), drawn=drawn)
        assert state.confidences == []  # taken by observe
    assert state.confident_acceptance(0.95) > 0.9 > 0.2 > state.confident_acceptance(0.05)
    plan = choose(state, step_costs)
    assert plan.adaptive and plan.longest == 6
    assert drafted_under_the_rule(state, step_costs, plan, [0.97] * 10) == 6
    assert drafted_under_the_rule(state, step_costs, plan, [0.97, 0.97, 0.03] + [0.97] * 7) == 3
    assert drafted_under_the_rule(state, step_costs, plan, [0.03] + [0.97] * 9) == 1


def test_a_new_request_starts_from_the_confidence_bins_the_last_one_left():
    """The bins learned over one request carry to the next (a copy: the new request's picks do not reach back): its
    first chain already stops after an unsure pick, where empty bins draft on to the best fixed length. Bins of the
    wrong length are refused in one line."""
    step_costs = costs(lambda n: 0.3 + 0.02 * n, base=0.05)
    settings = ControllerSettings(sizes=SIZES)
    first = new_request(settings)
    histories = [([0.97, 0.97, 0.97], 3), ([0.97, 0.03], 1), ([0.03], 0)]
    for i in range(60):
        picks, accepted = histories[i % len(histories)]
        keep = chain_rule(first, step_costs, choose(first, step_costs))
        for probability in picks:
            keep(probability)
        observe(first, Plan(len(picks), SIZES[0]), accepted, [0] * (accepted + 1),
                drawn=[1.0] * accepted + [0.0] * (len(picks) - accepted))
    carried = carried_confidence(first)
    fresh, following = new_request(settings), new_request(settings, confidence=carried)
    assert following.confident_drafts == first.confident_drafts and following.confident_drafts is not carried[1]
    assert following.confident_acceptance(0.05) < 0.2 < 0.9 < following.confident_acceptance(0.95)
    plan = choose(following, step_costs)
    assert plan.adaptive and choose(fresh, step_costs).depth == plan.depth
    assert drafted_under_the_rule(following, step_costs, plan, [0.03] + [0.97] * 9) == 1
    assert drafted_under_the_rule(fresh, step_costs, plan, [0.03] + [0.97] * 9) == plan.depth
    observe(following, Plan(1, SIZES[0]), 0, [0], drawn=[0.0])
    assert carried_confidence(first) == carried  # the first request's bins are untouched by the second's
    with pytest.raises(FrspecError, match="confidence bins"):
        new_request(settings, confidence=([0.0], [0.0]))


def test_a_chain_goes_on_past_an_unsure_pick_when_sure_picks_after_it_would_pay(monkeypatch):
    """Drafts drawn at 0.6 are accepted half the time, those at 0.97 always, and most picks are sure: after an
    unsure first pick the next draft alone does not pay for itself, but the chance that it is sure and opens a run
    of cheap sure drafts does. Looking LOOKAHEAD picks ahead the chain goes on; weighing the next run of drafts at
    the positions' average estimates only (LOOKAHEAD = 0), it stops."""
    step_costs = costs(lambda n: 0.3 + 0.025 * n, base=0.05)
    state = new_request(ControllerSettings(sizes=SIZES))
    histories = [([0.97, 0.97, 0.97], 3), ([0.6, 0.6], 1), ([0.6, 0.97, 0.97], 3), ([0.6], 0)]
    for i in range(60):
        plan = choose(state, step_costs)
        keep = chain_rule(state, step_costs, plan)
        picks, accepted = histories[i % len(histories)]
        for probability in picks:
            keep(probability)
        observe(state, Plan(len(picks), plan.size), accepted, [0] * (accepted + 1),
                drawn=[1.0] * accepted + [0.0] * (len(picks) - accepted))
    assert state.confident_acceptance(0.6) < 0.6 < 0.95 < state.confident_acceptance(0.97)
    plan = choose(state, step_costs)
    assert plan.adaptive
    assert drafted_under_the_rule(state, step_costs, plan, [0.6] + [0.97] * 9) == 5  # on through sure picks
    assert drafted_under_the_rule(state, step_costs, plan, [0.6] * 10) == 2  # ... but not past two unsure ones
    monkeypatch.setattr(controller, "LOOKAHEAD", 0)
    assert drafted_under_the_rule(state, step_costs, plan, [0.6] + [0.97] * 9) == 1


def test_only_the_best_estimates_chains_stop_early_and_every_chain_records_its_confidences():
    """Fixed plans (stop_early off, probes, timing drafts, trees) draft their whole length; the rule still records
    each pick's probability for the bins."""
    step_costs = costs(lambda n: 0.3 + 0.02 * n, base=0.05)
    state = new_request(ControllerSettings(sizes=SIZES, stop_early=False))
    plan = choose(state, step_costs)
    assert plan.depth >= 1 and not plan.adaptive and plan.drafts == plan.depth
    keep = chain_rule(state, step_costs, plan)
    assert all(keep(0.01) for _ in range(plan.depth))
    assert state.confidences == [0.01] * plan.depth
    observe(state, plan, 0, [0], drawn=[0.0])
    assert state.confident_drafts[0] == 1.0 and state.confidences == []
    tree = new_request(ControllerSettings(sizes=SIZES, shape=TreeShape.static(2, 2)))
    assert not choose(tree, step_costs).adaptive


def test_a_position_the_chain_stops_short_of_forgets_an_old_rejection():
    """Evidence ages with every drafting step, at every position: one rejection at the second position, then a
    hundred single drafts all accepted. Aged only when reached, that rejection kept the second position's estimate
    at the prior-shrunk 0.78 for good, and a chain stopped after its first (sure) pick on every step (measured on a
    Spanish prompt: 130 steps of single drafts where chains of 3 were all accepted); aged, the estimate returns to
    the pooled one and the chain drafts on through sure picks. Costs shaped like the int4 pair's at 650 tokens: a
    draft forward costs about half a plain step."""
    step_costs = costs(lambda n: 0.07 + 0.01 * n, base=0.05)
    state = new_request(ControllerSettings(sizes=SIZES))
    observe(state, Plan(2, SIZES[-1]), 1, [0, 0])  # the second draft rejected, its rows held the token
    stale = state.agreement(1)
    for _ in range(100):
        plan = choose(state, step_costs)
        keep = chain_rule(state, step_costs, plan)
        keep(0.99)
        observe(state, Plan(1, SIZES[-1]), 1, [0, 0], drawn=[1.0])
    assert state.tried[1] == pytest.approx(controller.DRAFT_DECAY ** 100)
    assert stale < 0.8 < 0.9 < state.agreement(1)
    plan = choose(state, step_costs)
    assert plan.adaptive and plan.depth >= 2  # aged only when reached: 1
    assert drafted_under_the_rule(state, step_costs, plan, [0.99] * 10) == plan.longest  # ... and it stopped at 1


def test_one_rejection_at_a_deeper_position_holds_chains_to_one_draft_for_a_few_steps_only(monkeypatch):
    """A deeper position's estimate leans on the pooled agreement as on POSITION_DRAFTS drafts of its own: one
    rejection there, of an unsure pick early in a request, then sure picks all accepted. Costs shaped like the int4
    pair's at 640 tokens (a draft forward a third of a plain step, 2 and 3 target rows at 1.0x and 1.17x one). Leaning
    as on PRIOR_DRAFTS, chains of one draft ran on for 11 steps (measured on a Spanish prompt: 14 steps in a replay of
    its teacher-forced drafts, 64 in a timed run)."""
    rows = {1: 0.0865, 2: 0.0864, 3: 0.1013, 4: 0.1117, 5: 0.196, 6: 0.2005, 7: 0.2049, 8: 0.21}
    step_costs = StepCosts(rows, {1: 0.031}, {k: {1: 3e-8 * k} for k in SIZES}, full_size=SIZES[-1])

    def single_draft_steps() -> int:
        state = new_request(ControllerSettings(sizes=SIZES))
        for picks, accepted in (([0.9], 1), ([1.0, 0.94, 0.97], 3), ([1.0, 0.36], 1)):
            keep = chain_rule(state, step_costs, choose(state, step_costs))
            for probability in picks:
                keep(probability)
            observe(state, Plan(len(picks), SIZES[-1]), accepted, [0] * (accepted + 1),
                    drawn=[1.0] * accepted + [0.0] * (len(picks) - accepted))
        for step in range(30):
            plan = choose(state, step_costs)
            drafted = drafted_under_the_rule(state, step_costs, plan, [0.99] * 10)
            if drafted > 1:
                return step
            keep = chain_rule(state, step_costs, plan)
            keep(0.99)
            observe(state, Plan(1, SIZES[-1]), 1, [0, 0], drawn=[1.0])
        return 30

    assert single_draft_steps() <= 5
    monkeypatch.setattr(controller, "POSITION_DRAFTS", controller.PRIOR_DRAFTS)
    assert single_draft_steps() >= 8
