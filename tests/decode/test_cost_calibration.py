"""Step costs recalibrated from the engine's own timed forwards (decode/cost_calibration.py), and the controller
timing the lengths a wrong table would hide (decode/controller.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from frspec.decode import cost_measure
from frspec.decode.controller import (
    COST_EXPLORE_LOSS, ControllerSettings, choose, new_request, observe, rates, step_shape, target_rows,
)
from frspec.decode.cost_calibration import (
    CALIBRATION_SAMPLES, CALIBRATION_WINDOW, RESCALE_EVERY, STALE_FORWARDS, STALE_LEVEL, StepTimings, load_timings,
    save_timings, timings_path,
)
from frspec.decode.draft_model import DraftModelDrafter
from frspec.decode.engine import SpeculativeGenerator
from frspec.decode.factory import build_generator
from frspec.decode.sampling import SamplingParams
from frspec.decode.step_costs import StepCosts
from frspec.errors import FrspecError
from tests.decode.spec_tiny import named_pair_ranking, named_tiny_pair

V = 1000


def _table(target: dict[int, float], draft: float = 0.082, head: float = 0.005, **kwargs) -> StepCosts:
    """Costs with the target's forward over n rows `target[n]`; the drafter's forward and head are the real
    pair's (the 0.5B draft's bf16 forward and its 32k head, AVX-512 EPYC)."""
    return StepCosts(dict(target), {1: draft}, {V: {1: head}}, full_size=V, **kwargs)


def test_timed_row_counts_replace_the_tables_level_and_the_shape_stands_in_between():
    reference = _table({1: 1.0, 2: 1.0, 3: 2.0, 4: 1.2})
    before = json.dumps(reference.to_dict())
    timings = StepTimings(reference)
    for _ in range(CALIBRATION_SAMPLES - 1):
        timings.add_target(2, 100, 0.9)
    assert timings.costs() is reference  # too few forwards of any row count: nothing moves
    timings.add_target(2, 100, 0.9)
    for _ in range(CALIBRATION_SAMPLES):
        timings.add_target(4, 100, 1.08)
    costs = timings.costs()
    assert costs.target(2) == pytest.approx(0.9) and costs.target(4) == pytest.approx(1.08)
    assert costs.target(1) == pytest.approx(0.9)  # beyond the timed row counts: the nearest one's scale holds
    assert costs.target(3) == pytest.approx(1.8)  # untimed: the table's (wrong) shape, at the timed level
    for _ in range(CALIBRATION_SAMPLES):
        timings.add_target(3, 100, 1.1)
    assert timings.costs().target(3) == pytest.approx(1.1)  # timed: what it costs now
    assert json.dumps(reference.to_dict()) == before  # the reference is never modified
    assert timings.costs().provenance["recalibrated"]["target_scales"] == {"2": 0.9, "3": 0.55, "4": 0.9}


def test_a_timed_row_count_between_measured_ones_is_read_as_timed():
    timings = StepTimings(_table({1: 1.0, 4: 1.6}))  # 2 rows: 1.2 by interpolation
    for _ in range(CALIBRATION_SAMPLES):
        timings.add_target(2, 100, 0.6)
    costs = timings.costs()
    assert costs.target(2) == pytest.approx(0.6) and costs.target(1) == pytest.approx(0.5)
    assert costs.target(4) == pytest.approx(0.8)


def test_ratios_are_taken_at_each_forwards_context_and_scale_every_contexts_table():
    reference = _table({1: 1.0, 2: 1.0}, context=128,
                       target_by_context={128: {1: 1.0, 2: 1.0}, 2048: {1: 2.0, 2: 2.0}})
    timings = StepTimings(reference)
    for _ in range(CALIBRATION_SAMPLES):
        timings.add_target(1, 2048, 1.0)  # half what the table says at 2048 tokens
    costs = timings.costs()
    assert costs.target(1, 2048) == pytest.approx(1.0) and costs.target(1, 128) == pytest.approx(0.5)
    assert costs.target(1, 1088) == pytest.approx(0.75)


def test_drafting_follows_the_targets_level_until_it_has_its_own_timings():
    reference = _table({1: 1.0, 2: 1.0}, draft=0.03, head=0.01)
    timings = StepTimings(reference)
    for _ in range(CALIBRATION_SAMPLES):
        timings.add_target(1, 100, 1.2)  # a slow spell: the target 20% slower
    assert timings.costs().draft_time_s(step_shape(ControllerSettings(sizes=(V,)), 1), V) == pytest.approx(0.048)
    for _ in range(CALIBRATION_SAMPLES):  # the drafter's own steps: half what the table says, catch-up included
        timings.add_draft(step_shape(ControllerSettings(sizes=(V,)), 2), V, 100, 0, 0.04)
    costs = timings.costs()
    assert costs.draft_base(1) == pytest.approx(0.015) and costs.head(V) == pytest.approx(0.005)
    assert costs.target(1) == pytest.approx(1.2)


def test_only_the_last_forwards_count():
    timings = StepTimings(_table({1: 1.0}))
    for seconds in [3.0] * CALIBRATION_SAMPLES + [1.0] * CALIBRATION_WINDOW:
        timings.add_target(1, 100, seconds)
    assert timings.samples() == {1: CALIBRATION_WINDOW} and timings.costs().target(1) == pytest.approx(1.0)


def test_timings_are_kept_for_the_table_they_were_timed_against(tmp_path):
    reference = _table({1: 1.0, 2: 1.0})
    timings = StepTimings(reference)
    for _ in range(CALIBRATION_SAMPLES):
        timings.add_target(2, 100, 0.5)
    path = timings_path(tmp_path / "step_costs" / "abc.json")
    timings.path = path
    save_timings(timings)
    assert load_timings(path, reference).costs().target(2) == pytest.approx(0.5)
    # Measured again: the timings were against another table, so they start over.
    assert load_timings(path, _table({1: 1.0, 2: 1.1})).samples() == {}
    path.write_text("{not json")
    assert load_timings(path, reference).samples() == {}
    assert load_timings(None, reference).samples() == {}
    with pytest.raises(ValueError):
        timings.merge(StepTimings(_table({1: 1.0})))


# -- the controller times what a wrong table hides ------------------------------------------------------------------

STALE = {1: 0.319, 2: 0.278, 3: 0.313, 4: 0.291, 5: 0.310, 7: 0.308}  # a 14-hour-old table (AVX-512 EPYC, bf16)
TRUE = {1: 0.253, 2: 0.236, 3: 0.238, 4: 0.259, 5: 0.263, 7: 0.262}  # the same forwards measured again


def _simulate(recalibrate: bool, requests: int = 8, steps: int = 40, alpha: float = 0.8, within: bool = False
              ) -> tuple[list[list[int]], list[float]]:
    """Requests of `steps` steps on a machine whose forwards cost TRUE, starting from the STALE table: per request,
    steps per draft length and tokens per second. Every drafted position is accepted with probability `alpha`,
    observed as expected counts (as when sampling: no coin flips); the table is recalibrated after every request
    and, `within`, every RESCALE_EVERY steps of one (as the engine does)."""
    truth = _table(TRUE)
    settings = ControllerSettings(sizes=(V,))
    table, timings = _table(STALE), StepTimings(_table(STALE))
    chosen, speeds = [], []
    for r in range(requests):
        tokens, seconds = 0, 0.0
        state = new_request(settings, seed=r, timed_rows=timings.samples() if recalibrate else None)
        per_depth = [0] * (settings.max_depth + 1)
        for step in range(steps):
            behind = state.behind
            plan = choose(state, table)
            observe(state, plan, 0, None, [(alpha, 1.0)] * plan.depth)
            per_depth[plan.depth] += 1
            rows = target_rows(settings, plan.depth)
            timings.add_target(rows, 128, truth.target(rows))
            tokens += sum(alpha ** j for j in range(plan.depth + 1))  # expected: 1 + alpha + ... + alpha^depth
            seconds += truth.step_time_s(step_shape(settings, plan.depth), V)
            if plan.depth:
                shape = step_shape(settings, plan.depth)
                took = truth.draft_time_s(shape, plan.size) + (truth.catch_up_s(1 + behind) if behind else 0.0)
                timings.add_draft(shape, plan.size, 128, behind, took)
                seconds += took - truth.draft_time_s(shape, plan.size)  # the catch-up
            if within and (step + 1) % RESCALE_EVERY == 0:
                table = timings.costs()
        if recalibrate:
            table = timings.costs()
        chosen.append(per_depth)
        speeds.append(tokens / seconds)
    return chosen, speeds


def test_a_wrong_table_entry_is_timed_and_the_choice_moves_to_the_truly_better_length():
    # At acceptance 0.8 a chain of 2 is the best length on the true costs; on the stale table a chain of 3 is, and
    # 2 is 6% behind it (within COST_EXPLORE_LOSS: it is timed).
    state = new_request(ControllerSettings(sizes=(V,)))
    state.agreed, state.tried, state.squared = [40.0] * 6, [50.0] * 6, [40.0] * 6
    true_rates, stale_rates = rates(state, _table(TRUE)), rates(state, _table(STALE))
    assert max(true_rates, key=true_rates.get)[0] == 2 and max(stale_rates, key=stale_rates.get)[0] == 3
    assert stale_rates[(2, V)] >= (1 - COST_EXPLORE_LOSS) * stale_rates[(3, V)]
    fixed, fixed_speed = _simulate(recalibrate=False)
    assert all(steps[3] == sum(steps) for steps in fixed)  # the stale table hides the better length for good
    moved, moved_speed = _simulate(recalibrate=True)
    assert all(steps[2] == sum(steps) for steps in moved[1:])  # timed in the first request, chosen from the next
    assert min(moved_speed[1:]) > 1.04 * fixed_speed[1]  # the true rates' ratio: 1 / 0.959
    # Timing cost the first request less than COST_EXPLORE_LOSS (each timed length was that close to the best).
    assert moved_speed[0] > (1 - COST_EXPLORE_LOSS) * fixed_speed[0]


def test_rescaled_within_a_request_its_own_timings_move_its_later_steps():
    # Rescaled only between requests, the first request spends all its steps timing each length the stale table puts
    # close to its pick; rescaled within it too, what it timed moves its table, and its later steps go to the truly
    # better length.
    between, between_speed = _simulate(recalibrate=True)
    within, within_speed = _simulate(recalibrate=True, within=True)
    assert within[0][2] > between[0][2] + CALIBRATION_SAMPLES // 2
    assert within_speed[0] > 1.02 * between_speed[0]
    assert within[1:] == between[1:]  # from the next request on, both decide by the same timings


def test_a_length_is_timed_only_while_untimed_and_close_to_the_best():
    settings = ControllerSettings(sizes=(V,), depths=(0, 1, 2, 3))
    costs = _table({1: 1.0, 2: 1.02, 3: 1.04, 4: 3.0})  # a chain of 3 is far behind: never timed
    state = new_request(settings, timed_rows={})
    best = rates(state, costs)
    picked = []
    for _ in range(5 * CALIBRATION_SAMPLES):
        plan = choose(state, costs)
        picked.append((plan.depth, plan.timing))
        observe(state, plan, plan.depth, None)
    timed = {depth for depth, timing in picked if timing}
    assert 3 not in {depth for depth, _ in picked}
    # Drafts are timed within COST_EXPLORE_LOSS of the best; plain decoding, the reference, at any rate.
    assert 0 in timed and best[(0, V)] < (1 - COST_EXPLORE_LOSS) * max(best.values())
    assert all(best[(d, V)] >= (1 - COST_EXPLORE_LOSS) * max(best.values()) for d in timed - {0})
    assert all(state.timed_rows[target_rows(settings, d)] >= CALIBRATION_SAMPLES for d in timed)
    assert not any(timing for _, timing in picked[-CALIBRATION_SAMPLES:])  # all timed: it drafts its best
    # Without recalibration (no timed_rows) nothing is drafted for timing.
    state = new_request(settings)
    assert not any(choose(state, costs).timing for _ in range(CALIBRATION_SAMPLES))


def test_plain_decoding_is_timed_where_only_drafts_were_so_a_table_too_cheap_at_several_rows_is_found_out():
    # The table reads 2 rows and more 1.3x too cheap. Timed at drafts alone, rescaling holds their scale down to one
    # row, so plain decoding looks as much dearer and drafting keeps looking paying. The controller times plain
    # decoding too (a few steps, spending no exploration budget), and its rescaled table then has drafting lose.
    settings = ControllerSettings(sizes=(V,), depths=(0, 1))
    table = _table({1: 1.0, 2: 1.5, 3: 2.0})
    truth = {1: 1.0, 2: 1.5 * 1.3, 3: 2.0 * 1.3}  # where even a chain of 1 always accepted loses
    state = new_request(settings, timed_rows={})
    state.agreed, state.tried, state.squared = [45.0] * 6, [50.0] * 6, [45.0] * 6  # 90% accepted
    at_table = rates(state, table)
    assert max(at_table, key=at_table.get)[0] == 1  # drafting pays at the table
    state.explore_budget_s = 0.0  # and the request has no budget left to find out with
    timings = StepTimings(table)
    for _ in range(3 * CALIBRATION_SAMPLES):
        plan = choose(state, timings.costs())
        rows = target_rows(settings, plan.depth)
        timings.add_target(rows, 1, truth[rows])
        observe(state, plan, plan.depth, None)
    assert state.timed_rows[1] >= CALIBRATION_SAMPLES and state.timed_rows[2] >= CALIBRATION_SAMPLES
    rescaled = rates(state, timings.costs())
    assert max(rescaled, key=rescaled.get)[0] == 0  # the true costs: drafting 90% accepted loses
    assert choose(state, timings.costs()).depth == 0
    # Timed at drafts alone (plain decoding's timings withheld), the rescaled table still has drafting pay.
    drafts_only = StepTimings(table)
    drafts_only.target_ratios = {n: r for n, r in timings.target_ratios.items() if n > 1}
    misled = rates(state, drafts_only.costs())
    assert max(misled, key=misled.get)[0] == 1


# -- the engine ---------------------------------------------------------------------------------------------------

_RANKING = named_pair_ranking()


def test_the_engine_recalibrates_between_requests_keeps_the_timings_and_stays_lossless(tmp_path, monkeypatch):
    monkeypatch.setenv("FRSPEC_CACHE", str(tmp_path))
    target, draft = named_tiny_pair()
    prompts = [list(range(3, 3 + n)) for n in (5, 9, 14, 20)]
    greedy = SamplingParams()
    vanilla = build_generator(target)
    refs = [vanilla.generate(input_ids=p, max_new_tokens=20, eos_token_ids=[], sampling=greedy).token_ids
            for p in prompts]
    auto = build_generator(target, draft, _RANKING)
    measured = json.dumps(auto.measured_costs.to_dict())
    forwards = 0
    for prompt, ref in zip(prompts, refs):
        out = auto.generate(input_ids=prompt, max_new_tokens=20, eos_token_ids=[], sampling=greedy)
        assert out.token_ids == ref
        forwards += out.stats.target_forwards
    assert json.dumps(auto.measured_costs.to_dict()) == measured  # the measured table is never modified
    # Every decode forward was timed (up to the window per row count), and some row count often enough to rescale.
    samples = auto.timings.samples()
    assert sum(samples.values()) == forwards or max(samples.values()) == CALIBRATION_WINDOW
    assert auto.costs.provenance["recalibrated"]["target_forwards"] == sum(samples.values())
    kept = list((tmp_path / "step_costs" / "timings").glob("*.json"))
    assert len(kept) == 1
    # A new process (here: a new generator) starts from the kept timings and the same recalibrated table (unless
    # they ran so far off the table that it is measured again, which the tiny models' timings may: not here).
    monkeypatch.setattr(cost_measure, "STALE_LEVEL", float("inf"))
    again = build_generator(target, draft, _RANKING)
    assert again.timings.samples() == auto.timings.samples()
    assert again.costs.to_dict() == auto.costs.to_dict()
    # Without recalibration the costs stay as given and nothing is kept.
    fixed = build_generator(target, draft, _RANKING, costs=auto.measured_costs, recalibrate_costs=False)
    fixed.generate(input_ids=prompts[0], max_new_tokens=20, eos_token_ids=[], sampling=greedy)
    assert fixed.costs is auto.measured_costs and fixed.timings is None
    # Timings taken against another table cannot rescale this one: refused in one line.
    with pytest.raises(FrspecError, match="taken against other costs"):
        SpeculativeGenerator(target, auto.drafter, controller=auto.controller, costs=auto.measured_costs,
                             timings=StepTimings(_table({1: 1.0})))


def _vanilla_answer(target) -> tuple[list[int], SamplingParams, list[int]]:
    """A prompt, greedy sampling and the target's own 40 tokens after it, for the engine's requests to match."""
    prompt, greedy = list(range(3, 12)), SamplingParams()
    ref = build_generator(target).generate(input_ids=prompt, max_new_tokens=40, eos_token_ids=[],
                                           sampling=greedy).token_ids
    return prompt, greedy, ref


def test_the_engines_steps_taken_to_find_out_spend_the_exploration_budget_and_stay_lossless(tmp_path, monkeypatch):
    monkeypatch.setenv("FRSPEC_CACHE", str(tmp_path))
    import frspec.decode.controller as controller
    import frspec.decode.engine as engine
    target, draft = named_tiny_pair()
    prompt, greedy, ref = _vanilla_answer(target)
    plans, counted = [], []
    real_choose, real_count = engine.choose, engine.count_saving

    def choose(state, costs, *args, **kwargs):
        plans.append(real_choose(state, costs, *args, **kwargs))
        return plans[-1]

    def count_saving(state, costs, drafted, size, emitted, context=None, behind=0, finding_out=False, clock_s=None):
        counted.append(finding_out)
        assert clock_s is not None and clock_s > 0  # the engine times every step it counts
        return real_count(state, costs, drafted, size, emitted, context, behind, finding_out, clock_s)

    monkeypatch.setattr(engine, "choose", choose)
    monkeypatch.setattr(engine, "count_saving", count_saving)
    # A fixed table (the tiny models' measured ones vary from run to run) by which a chain of 3 or 4 is best at the
    # prior acceptance and every other length within COST_EXPLORE_LOSS of it: with no row count timed, the first step
    # drafts another length to time it, a step taken to find out; each step's flag is passed on to count_saving.
    measured = build_generator(target, draft, _RANKING).measured_costs
    fixed = replace(measured, target_costs={n: 1.0 + 0.1 * (n - 1) for n in range(1, 8)}, target_by_context={},
                    draft_base_costs={1: 0.05, 64: 0.1, 256: 0.3, 512: 0.6, 1024: 1.2}, draft_base_by_context={})

    def generator() -> SpeculativeGenerator:
        auto = build_generator(target, draft, _RANKING)
        return SpeculativeGenerator(target, auto.drafter, controller=auto.controller, costs=fixed)

    auto = generator()
    assert auto.generate(input_ids=prompt, max_new_tokens=40, eos_token_ids=[], sampling=greedy).token_ids == ref
    assert plans[0].timing and counted == [p.finding_out for p in plans]
    # With no budget to find out, only the best estimate is drafted; still token for token.
    monkeypatch.setattr(controller, "EXPLORE_BUDGET", 0.0)
    plans.clear()
    auto = generator()
    assert auto.generate(input_ids=prompt, max_new_tokens=40, eos_token_ids=[], sampling=greedy).token_ids == ref
    assert plans and not any(p.finding_out for p in plans)


def test_the_engine_rescales_within_a_request_and_stays_lossless(tmp_path, monkeypatch):
    monkeypatch.setenv("FRSPEC_CACHE", str(tmp_path))
    import frspec.decode.engine as engine
    target, draft = named_tiny_pair()
    prompt, greedy, ref = _vanilla_answer(target)
    # A table whose one-row forward reads 4x what it costs: drafting pays by it, so the controller drafts.
    auto = build_generator(target, draft, _RANKING)
    measured = auto.measured_costs

    def dearer(table: dict[int, float]) -> dict[int, float]:
        return {n: (4.0 if n == 1 else 1.0) * t for n, t in table.items()}

    dear = replace(measured, target_costs=dearer(measured.target_costs),
                   target_by_context={c: dearer(t) for c, t in measured.target_by_context.items()})
    auto = SpeculativeGenerator(target, auto.drafter, controller=auto.controller, costs=dear)
    seen = []
    real_choose = engine.choose

    def choose(state, costs, *args, **kwargs):
        seen.append(costs)
        return real_choose(state, costs, *args, **kwargs)

    monkeypatch.setattr(engine, "choose", choose)
    out = auto.generate(input_ids=prompt, max_new_tokens=40, eos_token_ids=[], sampling=greedy)
    assert out.token_ids == ref
    # Every step decides by a table; a new one every RESCALE_EVERY timed forwards, each rescaled from them.
    assert seen[0] is dear and out.stats.target_forwards >= 2 * RESCALE_EVERY
    tables = list(dict.fromkeys(id(c) for c in seen))
    assert len(tables) >= 2
    later = next(c for c in seen if c is not dear)
    assert later.provenance["recalibrated"]["target_forwards"] >= RESCALE_EVERY
    assert auto.costs.provenance["recalibrated"]["target_forwards"] == out.stats.target_forwards


def test_a_cached_table_the_timed_forwards_ran_far_off_is_measured_again(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("FRSPEC_CACHE", str(tmp_path))
    target, draft = named_tiny_pair()
    tables = iter([_table({1: 1.0, 2: 1.0}), _table({1: 0.5, 2: 0.5})])
    monkeypatch.setattr(cost_measure, "measure_step_costs", lambda *a, **k: next(tables))
    drafter = DraftModelDrafter(draft)
    first, kept = cost_measure.cached_step_costs(target, drafter, (128, 256), 2)  # later calls ask for less
    path = kept.path
    assert path == timings_path(cost_measure.step_costs_path(target, drafter)) and not kept.samples()

    def timed(ratio: float, forwards: int) -> None:
        timings = StepTimings(first, path=path)
        for i in range(forwards):
            timings.add_target(1 + i % 2, 100, ratio)
        save_timings(timings)

    # Off by less than STALE_LEVEL, or by more over too few forwards: the cached table stands (and is rescaled).
    timed(1.0 - STALE_LEVEL + 0.01, 4 * STALE_FORWARDS)
    assert cost_measure.cached_step_costs(target, drafter, (256,), 2)[0].to_dict() == first.to_dict()
    timed(0.5, STALE_FORWARDS - 1)
    assert cost_measure.cached_step_costs(target, drafter, (256,), 2)[0].to_dict() == first.to_dict()
    # Off by 50% over enough forwards: measured again, said on stderr; the old timings no longer apply.
    timed(0.5, STALE_FORWARDS)
    with caplog.at_level("INFO", logger="frspec"):
        again, restarted = cost_measure.cached_step_costs(target, drafter, (256,), 2)
    assert again.target(1) == 0.5 and again.provenance["sizes"] == [128, 256]  # the entry's sizes kept
    assert any("50% off what the forwards timed since took: measuring them again" in r.getMessage()
               for r in caplog.records)
    assert load_timings(path, again).samples() == {}
    assert restarted.samples() == {} and restarted.path == path  # the next save replaces the old table's timings
    assert cost_measure.cached_step_costs(target, drafter, (256,), 2)[0].target(1) == 0.5  # and cached
