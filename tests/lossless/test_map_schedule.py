"""Losslessness does not depend on the map size or the draft length a step is drafted with: with a ranked head
(vocab/ranked_vocab.py) the controller may change both at every step, and greedy fp32 output stays token for token
the target's own, for a draft model and EAGLE heads, chains and trees.

`k_every_step` replaces the engine's `choose` with a schedule that changes the map size at EVERY step (cycling
through sizes, from the smallest map to the whole head) and, for chains, the draft length too (plain steps
included); the engine then sets the size, drafts, verifies and observes exactly as under the real controller. The
real controller itself runs too, on fake costs under which speculation pays (so it drafts).
The sampling counterpart (a k schedule inside one request) is in test_engine_distribution.py.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from frspec.decode import controller
from frspec.decode import engine as _engine
from frspec.decode.controller import Plan, _record
from frspec.decode.step_costs import StepCosts
from frspec.vocab.token_map import TokenMap
from tests.decode.eagle_tiny import mostly_bigram, oracle_eagle2_head, oracle_eagle3_head
from tests.decode.spec_tiny import hf_greedy, noisy_copy, tiny_lm
from tests.lossless.decode_adapter import SamplingParams, TreeShape, build_generator

VOCAB = 128
PROMPTS = 12
NEW = 24
DEPTHS = (3, 1, 0, 2, 4, 1)

# Fake costs under which drafting pays (a flat target curve, cheap drafts): the real controller speculates.
FLAT = StepCosts({n: 1.0 + 0.01 * n for n in range(1, 10)}, {1: 0.01}, {16: {1: 0.001}, VOCAB: {1: 0.004}},
                 full_size=VOCAB)


@pytest.fixture(scope="module")
def target():
    return mostly_bigram(tiny_lm("llama", VOCAB, hidden=32, layers=2, seed=0, dtype=torch.float32))


@pytest.fixture(scope="module")
def prompts_and_refs(target):
    gen = torch.Generator().manual_seed(21)
    prompts = [torch.randint(0, VOCAB, (int(n),), generator=gen).tolist()
               for n in torch.randint(1, 13, (PROMPTS,), generator=gen)]
    return prompts, [hf_greedy(target, p, NEW) for p in prompts]


def _ranking() -> TokenMap:
    # Half the vocabulary ranked (in a random order); the other half follows by id in the ranked head.
    return TokenMap(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(5))[: VOCAB // 2], VOCAB)


def drafters(target) -> dict:
    draft = noisy_copy(target, 0.05, seed=1)
    e2, e3 = oracle_eagle2_head(target), oracle_eagle3_head(target, draft_ids=torch.arange(0, VOCAB, 2))
    return {
        "draft-chain": dict(draft=draft),
        "draft-static": dict(draft=draft, tree=TreeShape.static(2, 2)),
        "draft-dynamic": dict(draft=draft, tree=TreeShape.dynamic(3, 3, 8)),
        "eagle2-chain": dict(eagle=e2),
        "eagle2-static": dict(eagle=e2, tree=TreeShape.static(2, 2)),
        "eagle3-d2t-chain": dict(eagle=e3),
        "eagle3-d2t-dynamic": dict(eagle=e3, tree=TreeShape.dynamic(3, 3, 8)),
    }


@pytest.fixture
def k_every_step(monkeypatch):
    """Replace the controller's choice with a schedule changing the map size every step; returns the sizes used
    per step, in order (checked against what the drafter's head really scored)."""
    used: list[int] = []

    def install(generator):
        sizes = generator.controller.sizes
        assert len(sizes) >= 3, sizes
        cycle = itertools.count()
        vocab = generator.drafter.vocab
        real_set_size = vocab.set_size

        def set_size(k):
            used.append(int(k))
            real_set_size(k)

        monkeypatch.setattr(vocab, "set_size", set_size)

        def schedule(state, costs, remaining=None, context=None):
            i = next(cycle)
            depths = [d for d in state.settings.depths if d] or [0]
            depth = DEPTHS[i % len(DEPTHS)] if state.settings.shape is None else depths[0]
            depth = min(depth, max((remaining or 1) - 1, 0))
            # Never the same size twice in a row: each step's k differs from the previous step's.
            return _record(state, Plan(depth, sizes[i % len(sizes)]))

        monkeypatch.setattr(_engine, "choose", schedule)
        return used

    return install


@pytest.mark.parametrize("name", ["draft-chain", "draft-static", "draft-dynamic", "eagle2-chain", "eagle2-static",
                                  "eagle3-d2t-chain", "eagle3-d2t-dynamic"])
def test_greedy_identity_with_k_changing_every_step(target, prompts_and_refs, k_every_step, name):
    prompts, refs = prompts_and_refs
    kwargs = drafters(target)[name]
    generator = build_generator(target, token_map=_ranking(), token_map_size="auto", costs=FLAT,
                                recalibrate_costs=False, **kwargs)
    used = k_every_step(generator)
    accepted = 0
    for prompt, ref in zip(prompts, refs):
        out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
        assert out.token_ids == ref, f"{name} prompt={prompt}"
        accepted += sum(out.stats.accepted_per_position)
        assert len(out.stats.chosen_map_sizes) >= 2
    assert accepted > 0, "no draft was ever accepted: the identity check would be vacuous"
    assert len(used) > 2 * PROMPTS and all(a != b for a, b in zip(used, used[1:]))
    sizes = generator.controller.sizes
    assert {sizes[0], sizes[-1]} <= set(used)  # the smallest map and the whole head (no map) both drafted


@pytest.mark.parametrize("name", ["draft-chain", "eagle3-d2t-chain", "draft-static"])
def test_greedy_identity_under_the_real_controller(target, prompts_and_refs, name):
    prompts, refs = prompts_and_refs
    generator = build_generator(target, token_map=_ranking(), token_map_size="auto", costs=FLAT,
                                recalibrate_costs=False, **drafters(target)[name])
    assert generator.controller is not None
    chosen = set()
    for prompt, ref in zip(prompts, refs):
        out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
        assert out.token_ids == ref, f"{name} prompt={prompt}"
        chosen |= set(out.stats.chosen_map_sizes)
        assert sum(out.stats.chosen_depth_histogram[1:]) > 0  # it drafted
    assert chosen


@pytest.mark.parametrize("name", ["draft-chain", "eagle2-chain", "eagle3-d2t-chain"])
def test_greedy_identity_with_chains_cut_by_the_drafts_confidence(target, prompts_and_refs, monkeypatch, name):
    """Chains whose length follows what the drafter drew: every step may draft up to 5 tokens and stops after a
    pick whose draft probability falls in a third of a scatter of fine intervals (the controller's chain_rule
    decides from learned bins; this rule stops chains at every length, whatever the tiny models' confidences).
    Token for token the target's greedy output."""
    prompts, refs = prompts_and_refs
    generator = build_generator(target, token_map=_ranking(), token_map_size="auto", costs=FLAT,
                                recalibrate_costs=False, **drafters(target)[name])
    sizes = generator.controller.sizes
    step = itertools.count()

    def schedule(state, costs, remaining=None, context=None):
        longest = min(5, max((remaining or 1) - 1, 0))
        return _record(state, Plan(min(1, longest), sizes[next(step) % len(sizes)], longest=longest, rate=1.0))

    def rule(state, costs, plan, context=None):
        return lambda probability: int(probability * 1e6) % 3 != 0

    monkeypatch.setattr(_engine, "choose", schedule)
    monkeypatch.setattr(_engine, "chain_rule", rule)
    lengths = [0] * 6
    for prompt, ref in zip(prompts, refs):
        out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
        assert out.token_ids == ref, f"{name} prompt={prompt}"
        lengths = [a + b for a, b in zip(lengths, out.stats.chosen_depth_histogram + [0] * 6)]
    assert lengths[1] > 0 and sum(lengths[2:5]) > 0 and lengths[5] > 0, lengths  # cut early, cut later, ran long


# k + 1 rows cost k + 1 one-row forwards (the 2-core EPYC in bf16): no draft can pay.
LINEAR = StepCosts({n: 1.0 * n for n in range(1, 10)}, {1: 0.01}, {16: {1: 0.001}, VOCAB: {1: 0.004}},
                   full_size=VOCAB)


@pytest.mark.parametrize("name", ["draft-chain", "eagle3-d2t-chain"])
def test_where_no_draft_can_pay_requests_decode_plainly_without_touching_the_drafter(target, prompts_and_refs, name):
    prompts, refs = prompts_and_refs
    generator = build_generator(target, token_map=_ranking(), costs=LINEAR,
                                recalibrate_costs=False, **drafters(target)[name])
    assert generator.plain_only
    for prompt, ref in zip(prompts[:4], refs[:4]):
        out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
        assert out.token_ids == ref
        assert out.stats.chosen_depth_histogram == [out.stats.target_forwards]  # every step plain
        assert out.stats.draft_steps == 0 and out.stats.draft_time_s == 0.0
    assert generator.drafter.steps == 0
    if name == "draft-chain":  # not even prefilled: its cache never saw the prompt
        from frspec.decode.kv_cache import cache_length

        assert cache_length(generator.drafter.cache) == 0


@pytest.mark.parametrize("name", ["draft-chain", "draft-static", "eagle3-d2t-dynamic"])
def test_greedy_identity_with_context_rows_on_a_ranked_head_and_k_changing_every_step(
        target, prompts_and_refs, k_every_step, name):
    """Context-aware rows (the request's own tokens) on top of the ranked head's first k rows, k changing at every
    step: still token for token the target's greedy output."""
    prompts, refs = prompts_and_refs
    generator = build_generator(target, token_map=_ranking(), token_map_size="auto", costs=FLAT,
                                recalibrate_costs=False, context_rows=6, context_budget="additive", **drafters(target)[name])
    vocab = generator.drafter.vocab
    assert vocab.extra_rows == 6 and vocab.context_floor == generator.controller.sizes[0]
    used = k_every_step(generator)
    accepted, context = 0, 0
    for prompt, ref in zip(prompts, refs):
        out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
        assert out.token_ids == ref, f"{name} prompt={prompt}"
        accepted += sum(out.stats.accepted_per_position)
        context += vocab.n_ctx
    assert accepted > 0 and context > 0, "drafts accepted and context rows taken: the check is not vacuous"
    assert all(a != b for a, b in zip(used, used[1:]))


@pytest.mark.parametrize("name", ["draft-chain", "eagle2-chain"])
def test_greedy_identity_under_the_controller_without_a_map(target, prompts_and_refs, name):
    """No map: the controller chooses only the length, over the drafter's plain (unranked) vocabulary."""
    prompts, refs = prompts_and_refs
    generator = build_generator(target, costs=FLAT, recalibrate_costs=False, **drafters(target)[name])
    assert generator.controller is not None and generator.controller.sizes == (VOCAB,)
    drafted = 0
    for prompt, ref in zip(prompts[:4], refs[:4]):
        out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
        assert out.token_ids == ref
        drafted += sum(out.stats.chosen_depth_histogram[1:])
    assert drafted > 0


def _by_context(short: StepCosts, long: StepCosts, at_short: int, at_long: int) -> StepCosts:
    """`short`'s target and draft costs up to `at_short` tokens of context, `long`'s from `at_long` on (linear in
    between), as the controller's measurement records them per context (decode/cost_measure.py)."""
    return StepCosts(dict(short.target_costs), dict(short.draft_base_costs), dict(short.head_costs),
                     full_size=short.full_size, context=at_short,
                     target_by_context={at_short: dict(short.target_costs), at_long: dict(long.target_costs)},
                     draft_base_by_context={at_short: dict(short.draft_base_costs),
                                            at_long: dict(long.draft_base_costs)})


@pytest.mark.parametrize("name", ["draft-chain", "eagle3-d2t-chain"])
def test_greedy_identity_when_the_context_moves_the_controller_from_plain_to_drafting(target, name):
    """Costs under which no draft pays at a short context and drafting pays at a long one: a request growing across
    them decodes plainly first and drafts later, a short request never touches the drafter, and every output is
    the target's own greedy output."""
    costs = _by_context(LINEAR, FLAT, 32, 96)
    generator = build_generator(target, token_map=_ranking(), costs=costs,
                                recalibrate_costs=False, **drafters(target)[name])
    assert not generator.plain_only  # drafting pays at some context
    gen = torch.Generator().manual_seed(3)
    long_prompt = torch.randint(0, VOCAB, (44,), generator=gen).tolist()
    out = generator.generate(input_ids=long_prompt, max_new_tokens=48, eos_token_ids=[])
    assert out.token_ids == hf_greedy(target, long_prompt, 48)
    depths = out.stats.chosen_depth_histogram
    assert depths[0] > 0 and sum(depths[1:]) > 0  # plain at first, drafting once the context is long
    short_prompt = long_prompt[:6]
    out = generator.generate(input_ids=short_prompt, max_new_tokens=12, eos_token_ids=[])
    assert out.token_ids == hf_greedy(target, short_prompt, 12)
    assert out.stats.chosen_depth_histogram == [out.stats.target_forwards]  # a plain request
    assert out.stats.draft_steps == 0 and generator.drafter.steps == 0
    if name == "draft-chain":  # not even prefilled: its cache never saw the prompt
        from frspec.decode.kv_cache import cache_length

        assert cache_length(generator.drafter.cache) == 0


def test_the_first_step_takes_the_prompts_tokens_as_evidence_of_coverage(target, monkeypatch):
    """A prompt whose tokens lie beyond the smallest map's rows (another language, to a ranking of English): the
    request's first draft is over a larger map; a prompt inside them: the smallest. Outputs stay the target's."""
    ranking = _ranking()  # no counts: the corpus's coverage is taken as 1 at every size
    firsts: list[Plan] = []
    real_choose = _engine.choose

    def recorded(state, costs, remaining=None, context=None):
        plan = real_choose(state, costs, remaining, context)
        firsts.append(plan)
        return plan

    monkeypatch.setattr(_engine, "choose", recorded)
    generator = build_generator(target, draft=noisy_copy(target, 0.05, seed=1), token_map=ranking,
                                token_map_size="auto", costs=FLAT, recalibrate_costs=False)
    smallest = generator.controller.sizes[0]
    assert smallest == 16
    first = {}
    for name, ids in (("inside", ranking.ids[:smallest]), ("beyond", ranking.ids[smallest:VOCAB // 2])):
        prompt = ids.tolist() * 12
        firsts.clear()
        out = generator.generate(input_ids=prompt, max_new_tokens=6, eos_token_ids=[])
        assert out.token_ids == hf_greedy(target, prompt, 6)
        first[name] = firsts[0]
    assert first["inside"].depth and first["inside"].size == smallest
    assert first["beyond"].depth and first["beyond"].size > smallest


def test_a_request_starts_from_the_confidence_bins_its_generators_last_request_of_those_settings_left(
        target, prompts_and_refs, monkeypatch):
    """The controller's confidence bins carry from request to request within a generator, one set per sampling
    setting (a sampled request neither reads nor overwrites the greedy ones), and greedy output stays the target's."""
    prompts, refs = prompts_and_refs
    given = []
    real_new_request = _engine.new_request

    def recorded(*args, **kwargs):
        state = real_new_request(*args, **kwargs)
        given.append((args[4] if len(args) > 4 else kwargs.get("confidence"), state))
        return state

    monkeypatch.setattr(_engine, "new_request", recorded)
    generator = build_generator(target, draft=noisy_copy(target, 0.05, seed=1), token_map=_ranking(),
                                token_map_size="auto", costs=FLAT, recalibrate_costs=False)
    hot = SamplingParams(temperature=1.0, seed=3)
    for i, sampling in enumerate([SamplingParams(), SamplingParams(), hot, SamplingParams(), hot]):
        out = generator.generate(input_ids=prompts[i], max_new_tokens=NEW, eos_token_ids=[], sampling=sampling)
        if sampling.is_greedy:
            assert out.token_ids == refs[i]
    (first, s0), (second, s1), (third, s2), (fourth, _), (fifth, _) = given
    assert first is None and third is None  # nothing carried yet for either setting
    assert sum(s0.confident_drafts) > 0  # the first request drafted and filled its bins ...
    assert second == (s0.confident_accepted, s0.confident_drafts)  # ... and the second started from them
    assert fourth == (s1.confident_accepted, s1.confident_drafts)  # the sampled request in between left them alone
    assert fifth == (s2.confident_accepted, s2.confident_drafts)


def test_a_request_starts_from_what_drafting_saved_on_its_generators_earlier_requests_of_its_kind(
        target, prompts_and_refs, monkeypatch):
    """What drafting saved against what was expected before the first step (controller.carry_worth) carries from
    request to request within a generator, one worth per sampling setting and class of prompt length, into the
    drafter-prefill decision; greedy output stays the target's."""
    prompts, refs = prompts_and_refs
    given = []
    real_new_request = _engine.new_request

    def recorded(*args, **kwargs):
        state = real_new_request(*args, **kwargs)
        given.append((kwargs.get("worth"), state))
        return state

    monkeypatch.setattr(_engine, "new_request", recorded)
    generator = build_generator(target, draft=noisy_copy(target, 0.05, seed=1), token_map=_ranking(),
                                token_map_size="auto", costs=FLAT, recalibrate_costs=False)
    long_prompt = torch.randint(0, VOCAB, (140,), generator=torch.Generator().manual_seed(4)).tolist()
    hot = SamplingParams(temperature=1.0, seed=3)
    requests = [(prompts[0], SamplingParams()), (prompts[1], SamplingParams()), (prompts[2], hot),
                (long_prompt, SamplingParams()), (prompts[3], SamplingParams())]
    for prompt, sampling in requests:
        out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[], sampling=sampling)
        if sampling.is_greedy:
            assert out.token_ids == hf_greedy(target, prompt, NEW)
    (first, s0), (second, s1), (third, _), (fourth, _), (fifth, _) = given
    assert first is None and third is None and fourth is None  # nothing carried yet for that setting or length
    # The first request drafted from its whole prompt; the steps' saving (at the costs) over its NEW - 1 stepped
    # tokens, against the saving expected before its first step, is the second's worth.
    assert s0.expected_saving > 0 and s0.counted_tokens == NEW - 1
    assert second.weight == pytest.approx(min((NEW - 1) / controller.WORTH_TOKENS, 1.0))
    assert second.ratios / second.weight == pytest.approx(s0.saved_s / s0.counted_tokens / s0.expected_saving)
    assert s1.worth == pytest.approx(second.scale)
    # The sampled request and the long prompt's (another kind each) left the short greedy prompts' worth alone.
    assert fifth == controller.carry_worth(second, s1, counts=True)
