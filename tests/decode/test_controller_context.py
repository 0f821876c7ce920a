"""The controller (decode/controller.py) on fake costs that depend on the context length: no models.

At a long context a target forward reads a long KV cache once for all its rows, so an extra verified row costs
relatively less than at a short one (the 1.5B target on ~1k-token prompts); the controller reads the costs at the
request's current context and should move to the draft length that pays there. The fake request is the one of
tests/decode/test_controller.py: every target token inside the map, drafts agreeing with probability `agree`.
"""

from __future__ import annotations

import random

import pytest

from frspec.decode.controller import (
    ControllerSettings, choose, new_request, observe, request_contexts, speculation_can_pay,
)
from frspec.decode.step_costs import StepCosts
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError

SIZES = (8192, 16384, 32768, 151936)
ROWS = range(1, 9)


def costs_by_context(target: dict, draft: dict | None = None, head_per_row: float = 2e-8) -> StepCosts:
    """target[L](n): seconds for n rows after L tokens; draft[L]: one draft forward after L tokens (default
    0.02 s everywhere). The flat tables are the shortest context's, as the measurement writes them."""
    contexts = sorted(target)
    draft = draft or {c: 0.02 for c in contexts}
    by_context = {c: {n: target[c](n) for n in ROWS} for c in contexts}
    return StepCosts(dict(by_context[contexts[0]]), {1: draft[contexts[0]]}, {k: {1: head_per_row * k} for k in SIZES},
                     full_size=SIZES[-1], context=contexts[0], target_by_context=by_context,
                     draft_base_by_context={c: {1: draft[c]} for c in contexts})


# Short context: each extra row costs half a one-row forward (compute-bound); at 2048 tokens the one-row forward
# is three times dearer (attention over the cache) and an extra row costs 3% of it.
CHEAPER_ROWS_WHEN_LONG = costs_by_context(
    {128: lambda n: 0.3 + 0.15 * (n - 1), 512: lambda n: 0.45 + 0.1 * (n - 1), 2048: lambda n: 0.9 + 0.03 * (n - 1)},
    {128: 0.02, 512: 0.025, 2048: 0.04})
# The other way round: cheap rows at a short context, rows as dear as whole forwards at a long one.
DEARER_ROWS_WHEN_LONG = costs_by_context(
    {128: lambda n: 0.3 + 0.01 * (n - 1), 2048: lambda n: 0.9 * n})


def simulate(settings, step_costs, context_of_step, agree, steps=300, seed=0, world_seed=1):
    """Plans over `steps` steps; context_of_step(i, tokens) is the context the i-th step is chosen at."""
    state = new_request(settings, seed=seed)
    world = random.Random(world_seed)
    plans, tokens = [], 0
    for i in range(steps):
        plan = choose(state, step_costs, context=context_of_step(i, tokens))
        accepted = 0
        while accepted < plan.depth and world.random() < agree:
            accepted += 1
        observe(state, plan, accepted, [world.randrange(100) for _ in range(accepted + 1)])
        tokens += accepted + 1
        plans.append(plan)
    return plans


def drafted_depths(plans):
    return [p.depth for p in plans if not p.probe]


def mean(xs):
    return sum(xs) / len(xs)


def test_at_a_long_context_where_extra_rows_are_cheap_it_drafts_longer():
    settings = ControllerSettings(sizes=SIZES)
    short = drafted_depths(simulate(settings, CHEAPER_ROWS_WHEN_LONG, lambda i, t: 128, agree=0.8)[50:])
    long = drafted_depths(simulate(settings, CHEAPER_ROWS_WHEN_LONG, lambda i, t: 2048, agree=0.8)[50:])
    # Expected tokens per second at acceptance 0.8 (E(d) = 1 + 0.8 + ... + 0.8^d): at 128 tokens a chain of one
    # pays best (3.8 tokens/s against 3.3 plain and 3.6 for three); at 2048 a chain of six (3.0 against 1.1
    # plain and 2.7 for three).
    assert max(short) <= 2 and mean(short) <= 1.5
    assert min(long) >= 4 and mean(long) >= 5


def test_in_between_measured_contexts_it_interpolates():
    settings = ControllerSettings(sizes=SIZES)
    at = {c: mean(drafted_depths(simulate(settings, CHEAPER_ROWS_WHEN_LONG, lambda i, t, c=c: c, agree=0.8)[50:]))
          for c in (128, 512, 1024, 2048)}
    assert at[128] <= at[512] <= at[1024] <= at[2048] and at[128] < at[2048]
    # 1024 lies a third of the way from 512 to 2048: its costs are that mix of theirs.
    mix = CHEAPER_ROWS_WHEN_LONG
    for n in (1, 4, 8):
        third = mix.target(n, 512) + (mix.target(n, 2048) - mix.target(n, 512)) * (1024 - 512) / (2048 - 512)
        assert mix.target(n, 1024) == pytest.approx(third)
    assert mix.draft_base(1, 1024) == pytest.approx(0.025 + 0.015 / 3)


def test_a_row_count_a_longer_context_lacks_follows_the_shortest_contexts_shape():
    """The measurement times every row count at the shortest context and 1, 2, 4 and 7 rows at the longer ones. The
    int4 target on the AVX512 EPYC jumps from 4 rows to 5 (94 to 174 ms after 128 tokens): at 512 tokens 5 rows
    read along that shape, not on the line from 4 to 7 rows, and so do the costs rescaled from timed forwards."""
    from frspec.decode.cost_calibration import recalibrated

    short = {1: 0.062, 2: 0.069, 3: 0.082, 4: 0.094, 5: 0.174, 7: 0.180}
    long = {1: 0.076, 2: 0.078, 4: 0.100, 7: 0.188}
    costs = StepCosts(dict(short), {1: 0.024}, {SIZES[-1]: {1: 0.005}}, full_size=SIZES[-1], context=128,
                      target_by_context={128: short, 512: long},
                      draft_base_by_context={128: {1: 0.024}, 512: {1: 0.026}})
    share = (0.174 - 0.094) / (0.180 - 0.094)
    assert costs.target(5, 512) == pytest.approx(0.100 + (0.188 - 0.100) * share)  # 0.182, not the line's 0.129
    assert costs.target(3, 512) == pytest.approx(0.078 + (0.100 - 0.078) * (0.082 - 0.069) / (0.094 - 0.069))
    assert costs.target(6, 512) == pytest.approx(0.100 + (0.188 - 0.100) * (0.177 - 0.094) / (0.180 - 0.094))
    assert costs.target(4, 512) == 0.100 and costs.target(9, 512) > 0.188  # measured; beyond: extrapolated
    assert costs.target(5, 320) == pytest.approx((costs.target(5, 128) + costs.target(5, 512)) / 2)
    # Rescaled by timed forwards (5 rows timed as the table has them): the 5-row entry the rescaling adds to every
    # context's table is read along that shape too.
    scaled = recalibrated(costs, {1: 1.0, 5: 1.0}, None, target_forwards=64, draft_steps=0)
    assert 5 in scaled.target_by_context[512]
    assert scaled.target(5, 512) == pytest.approx(costs.target(5, 512))


def test_at_a_long_context_where_extra_rows_are_dear_it_stops_drafting():
    settings = ControllerSettings(sizes=SIZES)
    short = drafted_depths(simulate(settings, DEARER_ROWS_WHEN_LONG, lambda i, t: 128, agree=0.9)[50:])
    long = simulate(settings, DEARER_ROWS_WHEN_LONG, lambda i, t: 2048, agree=0.9)
    assert min(short) >= 3
    assert all(p.depth == 0 for p in long)  # no acceptance pays there: no probes either


def test_within_one_request_the_length_follows_the_growing_context():
    # A 300-token prompt growing by each step's tokens to about 1.5k: the length grows with it.
    plans = simulate(ControllerSettings(sizes=SIZES), CHEAPER_ROWS_WHEN_LONG, lambda i, t: 300 + t, agree=0.8,
                     steps=400)
    first, last = drafted_depths(plans[20:80]), drafted_depths(plans[-60:])
    assert mean(first) < mean(last) - 1.5


def test_costs_without_context_tables_ignore_the_context():
    flat = StepCosts({n: 0.3 + 0.05 * n for n in ROWS}, {1: 0.02}, {k: {1: 2e-8 * k} for k in SIZES},
                     full_size=SIZES[-1])
    settings = ControllerSettings(sizes=SIZES)
    at_short = simulate(settings, flat, lambda i, t: 128, agree=0.8)
    assert simulate(settings, flat, lambda i, t: 4096, agree=0.8) == at_short
    assert simulate(settings, flat, lambda i, t: None, agree=0.8) == at_short
    assert flat.contexts == [] and flat.target(3, 4096) == flat.target(3)


def test_no_context_means_the_flat_tables_and_longer_contexts_extrapolate():
    c = CHEAPER_ROWS_WHEN_LONG
    assert c.contexts == [128, 512, 2048]
    assert c.target(4) == c.target(4, 128) == pytest.approx(0.75)
    assert c.target(4, 64) == c.target(4, 128)  # below the shortest: the shortest's
    # Beyond the longest: linear in the context from the two longest (attention's work grows linearly in it).
    slope = (c.target(1, 2048) - c.target(1, 512)) / (2048 - 512)
    assert c.target(1, 4096) == pytest.approx(c.target(1, 2048) + slope * 2048)
    shape = TreeShape.chain(3)
    assert c.step_time_s(shape, 8192, 2048) == pytest.approx(c.target(4, 2048) + 3 * (0.04 + c.head(8192)))


def test_speculation_can_pay_at_some_contexts_only():
    settings = ControllerSettings(sizes=SIZES)
    # Rows cost as whole forwards at 128 tokens, nearly nothing at 2048: drafting pays at long contexts only.
    late = costs_by_context({128: lambda n: 0.3 * n, 2048: lambda n: 0.9 + 0.01 * n})
    assert speculation_can_pay(settings, late)  # somewhere: the engine keeps its drafter
    assert not speculation_can_pay(settings, late, [128])
    assert speculation_can_pay(settings, late, [2048])
    # A request's contexts: first, last and the measured ones in between.
    assert request_contexts(late, 10, 64) == [10, 73]
    assert request_contexts(late, 100, 64) == [100, 128, 163]
    assert request_contexts(late, 100, 3000) == [100, 128, 2048, 3099]
    assert not speculation_can_pay(settings, late, request_contexts(late, 10, 64))
    assert speculation_can_pay(settings, late, request_contexts(late, 1500, 64))


def test_context_tables_round_trip_and_old_records_load():
    record = CHEAPER_ROWS_WHEN_LONG.to_dict()
    again = StepCosts.from_dict(record)
    assert again.to_dict() == record and again.contexts == [128, 512, 2048]
    assert again.target(3, 1000) == CHEAPER_ROWS_WHEN_LONG.target(3, 1000)
    # A tune config's costs from before the context tables: they load and stand for every context.
    old = {key: value for key, value in record.items()
           if key not in ("context", "target_costs_by_context", "draft_base_costs_by_context")}
    loaded = StepCosts.from_dict(old)
    assert loaded.contexts == [] and loaded.target(3, 2048) == loaded.target(3) == record["target_costs"]["3"]
    for bad in ({"0": {"1": 0.1}}, {"128": {"2": 0.1}}, {"x": {"1": 0.1}}, {"128": {"1": -1}}):
        with pytest.raises(FrspecError, match="costs"):
            StepCosts.from_dict({**record, "target_costs_by_context": bad}, "the costs")
