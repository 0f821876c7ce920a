"""End to end through build_generator: sampled generations of a tiny model follow the target's joint law.

Each sample is one `generate(max_new_tokens=4)` with its own seed. The prefill emits x1 from the target alone; the
next step drafts up to 2 tokens deep (the engine never drafts past the budget), so (x2, x3) is decided by the
speculative step, with x1's randomness feeding its context. Reference: P(x2, x3) = sum_x1 p(x1) p(x2|x1) p(x3|x1 x2)
from the target's own logits through transformers' processors. Zero-probability pairs must never appear.

Power: `e2e_sample_size` samples over the reference's live cells detect a total variation of E2E_TV = 0.1
(power 0.9, alpha 1e-3; asserted). This is the wiring check (caches, drafter state, maps, d2t, trees inside the
engine); the fixed-logit tests (test_verify_distribution.py) carry the 0.015 power.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from frspec.vocab.token_map import TokenMap

from tests.decode.eagle_tiny import mostly_bigram, oracle_eagle3_head
from tests.decode.spec_tiny import noisy_copy, sharpen, tiny_lm
from tests.lossless.decode_adapter import TreeShape, build_generator, sample_second_and_third
from tests.lossless.lossless_power import E2E_TV, check_distribution
from tests.lossless.lossless_reference import target_joint_after_prompt
from tests.lossless.lossless_sampling import SCALE, e2e_sample_size

V = 16
PROMPT = [3, 9, 1]
T, K, P = 0.9, 6, 0.95


@pytest.fixture(scope="module")
def target():
    return sharpen(mostly_bigram(tiny_lm("llama", V, hidden=32, layers=2, seed=4, dtype=torch.float32), 0.3), 2.0)


@pytest.fixture(scope="module")
def reference(target) -> np.ndarray:
    return target_joint_after_prompt(target, PROMPT, V, T, K, P)


def cases(target) -> dict:
    token_map = TokenMap([0, 2, 3, 5, 6, 8, 9, 11, 12, 15], V)
    return {
        "draft+map-chain": dict(draft=noisy_copy(target, 0.3, seed=1), token_map=token_map, num_spec_tokens=2),
        "draft-static": dict(draft=noisy_copy(target, 0.3, seed=2), tree=TreeShape.static(2, 2)),
        "eagle3-d2t+map-dynamic": dict(eagle=oracle_eagle3_head(target, draft_ids=torch.arange(0, V, 2)[:7],
                                                                 noise=0.3),
                                       token_map=token_map, tree=TreeShape.dynamic(2, 2, 4)),
    }


@pytest.mark.lossless_heavy
@pytest.mark.parametrize("name", ["draft+map-chain", "draft-static", "eagle3-d2t+map-dynamic"])
def test_engine_samples_follow_the_target(target, reference, name):
    generator = build_generator(target, **cases(target)[name])
    n = e2e_sample_size(reference)
    counts, accepted = sample_second_and_third(generator, PROMPT, n, V, dict(temperature=T, top_k=K, top_p=P))
    assert accepted > n // 4, "drafts must be accepted often enough for the check to test speculation"
    tv = check_distribution(counts, reference, f"engine {name}")
    if SCALE >= 1:
        assert tv <= E2E_TV, tv


@pytest.mark.lossless_heavy
@pytest.mark.parametrize("drafter", ["draft", "eagle3-d2t", "draft+context"])
def test_engine_samples_follow_the_target_with_k_changing_every_step(target, reference, monkeypatch, drafter):
    """A ranked head (vocab/ranked_vocab.py) whose map size changes at every step, from a 2-row map to the whole
    head, and whose draft length cycles 2, 1, 0 (a plain step): inside one request (x2, x3) are then drafted at
    different sizes and lengths ("draft+context": with 6 context rows for the request's tokens on top). Same power
    as above: the samples detect a TV of E2E_TV (power 0.9, alpha 1e-3; asserted)."""
    from frspec.decode import engine
    from frspec.decode.controller import Plan, _record
    from frspec.decode.step_costs import StepCosts

    ranking = TokenMap([0, 2, 3, 5, 6, 8, 9, 11, 12, 15], V)
    costs = StepCosts({n: 1.0 for n in range(1, 4)}, {1: 0.01}, {V: {1: 0.001}}, full_size=V)
    kwargs = (dict(eagle=oracle_eagle3_head(target, draft_ids=torch.arange(0, V, 2)[:7], noise=0.3))
              if drafter == "eagle3-d2t" else dict(draft=noisy_copy(target, 0.3, seed=1)))
    if drafter == "draft+context":
        kwargs.update(context_rows=6, context_budget="additive")  # room for generated tokens too
    generator = build_generator(target, token_map=ranking, token_map_size="auto", costs=costs,
                                recalibrate_costs=False, **kwargs)
    sizes = generator.controller.sizes
    assert sizes[0] <= 2 and sizes[-1] == generator.drafter.vocab.full_size and len(sizes) >= 4
    step = iter(range(10**9))
    used = []

    def schedule(state, step_costs, remaining=None, context=None):
        i = next(step)
        depth = min((2, 1, 0)[i % 3], max((remaining or 1) - 1, 0))
        used.append(sizes[i % len(sizes)])
        return _record(state, Plan(depth, sizes[i % len(sizes)]))

    monkeypatch.setattr(engine, "choose", schedule)
    n = e2e_sample_size(reference)
    counts, accepted = sample_second_and_third(generator, PROMPT, n, V, dict(temperature=T, top_k=K, top_p=P))
    assert accepted > n // 8, "drafts must be accepted often enough for the check to test speculation"
    assert all(a != b for a, b in zip(used, used[1:]))
    tv = check_distribution(counts, reference, f"engine {drafter} with k changing every step")
    if SCALE >= 1:
        assert tv <= E2E_TV, tv


@pytest.mark.lossless_heavy
def test_engine_samples_follow_the_target_with_the_drafter_prefilled_late(target, reference, monkeypatch):
    """A draft model that prefills late (controller.plain_tokens_first, forced to 2): x2 comes from a plain step,
    then the drafter reads the prompt and x1 x2, and x3 is drafted (with x4) in a speculative step. Same power as
    above (a TV of E2E_TV, power 0.9, alpha 1e-3; asserted)."""
    from frspec.decode import engine
    from frspec.decode.controller import Plan, _record
    from frspec.decode.step_costs import StepCosts

    costs = StepCosts({n: 1.0 for n in range(1, 4)}, {1: 0.01}, {V: {1: 0.001}}, full_size=V)
    generator = build_generator(target, draft=noisy_copy(target, 0.3, seed=1), token_map_size="auto", costs=costs,
                                recalibrate_costs=False)
    late_prefills = []

    def schedule(state, step_costs, remaining=None, context=None):
        return _record(state, Plan(min(2, max((remaining or 1) - 1, 0)), state.settings.sizes[-1]))

    def late_prefill(*args):
        late_prefills.append(args)
        return real_late_prefill(*args)

    monkeypatch.setattr(engine, "choose", schedule)
    monkeypatch.setattr(engine, "plain_tokens_first", lambda state, step_costs, prefill_tokens: 2)
    real_late_prefill = generator._late_prefill
    monkeypatch.setattr(generator, "_late_prefill", late_prefill)
    n = e2e_sample_size(reference)
    counts, accepted = sample_second_and_third(generator, PROMPT, n, V, dict(temperature=T, top_k=K, top_p=P))
    assert len(late_prefills) == n and accepted > n // 8, "every request must prefill late, then draft"
    tv = check_distribution(counts, reference, "engine draft with a late prefill")
    if SCALE >= 1:
        assert tv <= E2E_TV, tv


@pytest.mark.lossless_heavy
def test_engine_samples_follow_the_target_when_a_chains_length_depends_on_its_draws(target, reference, monkeypatch):
    """A chain that stops after its first token when the draft gave that token less than 0.4, and drafts a second
    otherwise (the controller's chain_rule stops on the drafter's confidence in what it drew): the length of the
    proposal depends on the draw itself, yet (x2, x3) follow the target's joint law. Same power as above (a TV of
    E2E_TV, power 0.9, alpha 1e-3; asserted)."""
    from frspec.decode import engine
    from frspec.decode.controller import Plan, _record
    from frspec.decode.step_costs import StepCosts

    costs = StepCosts({n: 1.0 for n in range(1, 4)}, {1: 0.01}, {V: {1: 0.001}}, full_size=V)
    ranking = TokenMap([0, 2, 3, 5, 6, 8, 9, 11, 12, 15], V)
    generator = build_generator(target, draft=noisy_copy(target, 0.3, seed=1), token_map=ranking,
                                token_map_size="auto", costs=costs, recalibrate_costs=False)
    decided = [0, 0]  # chains stopped after their first token, chains that went on

    def schedule(state, step_costs, remaining=None, context=None):
        longest = min(2, max((remaining or 1) - 1, 0))
        return _record(state, Plan(min(1, longest), state.settings.sizes[-1], longest=longest, rate=1.0))

    def rule(state, step_costs, plan, context=None):
        asked = []

        def keep(probability):
            asked.append(probability)
            go_on = probability >= 0.4
            if len(asked) == 1 and plan.longest == 2:
                decided[go_on] += 1
            return go_on

        return keep

    monkeypatch.setattr(engine, "choose", schedule)
    monkeypatch.setattr(engine, "chain_rule", rule)
    n = e2e_sample_size(reference)
    counts, accepted = sample_second_and_third(generator, PROMPT, n, V, dict(temperature=T, top_k=K, top_p=P))
    assert accepted > n // 8, "drafts must be accepted often enough for the check to test speculation"
    assert min(decided) > n // 10, decided  # both lengths, decided by the draws
    tv = check_distribution(counts, reference, "engine with chains cut by the draft's confidence")
    if SCALE >= 1:
        assert tv <= E2E_TV, tv
