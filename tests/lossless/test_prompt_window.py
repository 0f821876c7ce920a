"""What a draft model's prefill reads changes what it proposes from, never what is emitted.

A window of a long prompt (decode/draft_model.py: its first half from the prompt's start, its second from the end):
greedy fp32 output stays token for token the target's, for chains with plain steps between (the drafter then falls
behind and catches up) and for trees, and the windowed drafter proposes exactly what a drafter given the shortened
prompt itself proposes. Its drafting is timed at its own, shorter context.

A late prefill (decode/controller.py, `plain_tokens_first`: the request first decodes a few tokens plainly, then the
drafter reads the prompt and those tokens): token for token too, whole prompt or window, and a request whose answer
ends before that prefill never runs the drafter. Heads that read the target's states at the prompt's positions
(EAGLE, MTP) cannot prefill late and never do. (Sampling: test_engine_distribution.py.)"""

from __future__ import annotations

import itertools

import pytest
import torch

from frspec.decode import engine as _engine
from frspec.decode.answer_lengths import LENGTH_HISTORY
from frspec.decode.controller import Plan, _record
from frspec.decode.draft_model import DraftModelDrafter
from frspec.decode.kv_cache import cache_length
from frspec.decode.sampling import SamplingParams, make_generator
from frspec.decode.step_costs import StepCosts
from frspec.errors import FrspecError
from tests.decode.eagle_tiny import mostly_bigram, oracle_eagle2_head
from tests.decode.spec_tiny import hf_greedy, noisy_copy, tiny_lm
from tests.lossless.decode_adapter import TreeShape, build_generator

VOCAB = 128
NEW = 24
WINDOW = 48

# Fake costs under which drafting pays (a flat target curve, cheap drafts): the real controller speculates.
FLAT = StepCosts({n: 1.0 + 0.01 * n for n in range(1, 10)}, {1: 0.01}, {VOCAB: {1: 0.004}}, full_size=VOCAB)


@pytest.fixture(scope="module")
def target():
    return mostly_bigram(tiny_lm("llama", VOCAB, hidden=32, layers=2, seed=0, dtype=torch.float32))


@pytest.fixture(scope="module")
def prompts_and_refs(target):
    gen = torch.Generator().manual_seed(31)
    prompts = [torch.randint(0, VOCAB, (int(n),), generator=gen).tolist()
               for n in torch.randint(WINDOW + 1, 3 * WINDOW, (8,), generator=gen)]
    return prompts, [hf_greedy(target, p, NEW) for p in prompts]


@pytest.fixture
def windowed(monkeypatch):
    """Every request's drafter reads a WINDOW-token window of its prompt (the controller's choice, forced), and
    chains alternate with plain steps (after which the drafter catches up on the tokens it did not see)."""
    monkeypatch.setattr(_engine, "drafter_prefill_tokens", lambda state, costs, prompt, new, windows, **_: WINDOW)
    depths = itertools.cycle((3, 0, 2, 0, 0, 1))

    def schedule(state, costs, remaining=None, context=None):
        return _record(state, Plan(min(next(depths), max((remaining or 1) - 1, 0)), state.settings.sizes[-1]))

    monkeypatch.setattr(_engine, "choose", schedule)


@pytest.mark.parametrize("tree", [None, TreeShape.static(2, 2), TreeShape.dynamic(3, 3, 8)],
                         ids=["chain", "static", "dynamic"])
def test_greedy_identity_with_the_drafter_prefilled_over_a_window(target, prompts_and_refs, windowed, tree):
    prompts, refs = prompts_and_refs
    generator = build_generator(target, draft=noisy_copy(target, 0.05, seed=1), costs=FLAT,
                                recalibrate_costs=False, tree=tree, token_map_size=None if tree else "auto")
    if tree is not None:  # a fixed tree has no controller: force the window where the engine reads it
        generator._drafter_prompt = lambda control, prompt_tokens, max_new, lengths: WINDOW
    accepted = plain = 0
    for prompt, ref in zip(prompts, refs):
        out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
        assert out.token_ids == ref, f"prompt of {len(prompt)}"
        assert out.stats.draft_prompt_tokens == WINDOW
        # The drafter's cache holds the window and what it caught up on since, never the tokens left out.
        assert generator.drafter.skipped == len(prompt) - WINDOW
        assert cache_length(generator.drafter.cache) <= WINDOW + NEW
        accepted += sum(out.stats.accepted_per_position)
        plain += (out.stats.chosen_depth_histogram or [0])[0]
    assert accepted > 0, "no draft was ever accepted: the identity check would be vacuous"
    if tree is None:
        assert plain > 0, "no plain step: the catch-up after one went unchecked"


def test_a_windowed_drafter_proposes_what_it_proposes_given_the_shortened_prompt(target):
    draft = noisy_copy(target, 0.05, seed=2)
    prompt = torch.randint(0, VOCAB, (1, 100), generator=torch.Generator().manual_seed(3))
    # The window over the prompt the drafter prefills (all but the root, the last token), then the root.
    shortened = torch.cat([prompt[:, : WINDOW // 2], prompt[:, -(WINDOW // 2 + 1) :]], dim=1)
    sampling = SamplingParams(temperature=0.8)
    proposals = []
    for context, window in ((prompt, WINDOW), (shortened, None)):
        drafter = DraftModelDrafter(draft)
        drafter.reset()
        drafter.prefill(context[:, :-1], window=window)
        with torch.inference_mode():
            proposals.append(drafter.propose(context, TreeShape.chain(4), sampling, make_generator(7)))
        drafter.rollback(context.shape[1] - 1)  # the root kept, the drafts rejected
        assert cache_length(drafter.cache) == shortened.shape[1] - 1
    windowed, direct = proposals
    assert windowed.tokens == direct.tokens
    torch.testing.assert_close(windowed.child_probs, direct.child_probs, rtol=0, atol=0)
    # A window as long as the prompt or longer reads the whole prompt; one too short for a start and an end is
    # refused.
    drafter = DraftModelDrafter(draft)
    drafter.reset()
    drafter.prefill(prompt, window=prompt.shape[1])
    assert drafter.skipped == 0 and cache_length(drafter.cache) == prompt.shape[1]
    drafter.reset()
    with pytest.raises(FrspecError, match="2 tokens or more, not 1"):
        drafter.prefill(prompt, window=1)


def test_a_request_reads_a_window_where_only_that_prefill_is_won_back(target, prompts_and_refs):
    """Under costs where the drafter's prefill costs 0.2 s a prompt token and drafting is cheap, the saving drafting
    is expected to make over 24 tokens wins back a WINDOW-token prefill but not one over twice that: long prompts
    draft after a windowed prefill, and, with no window to read, decode plainly."""
    prompts, refs = prompts_and_refs
    costs = StepCosts({n: 1.0 + 0.01 * n for n in range(1, 10)}, {1: 0.01, 64: 0.01 + 0.2 * 63},
                      {VOCAB: {1: 0.004}}, full_size=VOCAB)
    generator = build_generator(target, draft=noisy_copy(target, 0.05, seed=1), costs=costs,
                                recalibrate_costs=False)
    long = [(p, r) for p, r in zip(prompts, refs) if len(p) >= 2 * WINDOW]
    assert long
    for windows, read in (((WINDOW,), WINDOW), ((), 0)):
        generator.drafter.prompt_windows = windows
        for prompt, ref in long:
            out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
            assert out.token_ids == ref
            assert out.stats.draft_prompt_tokens == read
            assert (sum(out.stats.chosen_depth_histogram[1:]) > 0) == bool(read)  # drafted only after a prefill


def test_a_kinds_first_request_finds_out_through_a_window_and_its_drafts_are_carried_apart(target, prompts_and_refs):
    """Under costs where no draft pays at the prior acceptance and the whole prompt's prefill costs more than
    EXPLORE_PREFILL_SHARE of the request (decode/controller.py), a kind's first long request finds out through a
    window; its drafts are carried under the kind's windows, not its whole prompts; greedy output stays the
    target's."""
    from frspec.decode.controller import EXPLORE_PREFILL_SHARE

    prompts, refs = prompts_and_refs
    # One target row 0.3 s, two 0.5 s: a draft loses at the prior; the drafter's prefill 0.012 s a prompt token.
    costs = StepCosts({n: 0.3 + 0.2 * (n - 1) for n in range(1, 10)}, {1: 0.02, 64: 0.02 + 0.012 * 63},
                      {VOCAB: {1: 0.004}}, full_size=VOCAB)
    long = [(p, r) for p, r in zip(prompts, refs) if len(p) >= 2 * WINDOW]
    assert len(long) >= 2
    allowed = EXPLORE_PREFILL_SHARE * NEW * costs.step_time_s(None)
    assert costs.drafter_prefill_s(WINDOW) <= allowed < costs.drafter_prefill_s(2 * WINDOW)
    generator = build_generator(target, draft=noisy_copy(target, 0.05, seed=1), costs=costs,
                                recalibrate_costs=False)
    generator.drafter.prompt_windows = (WINDOW,)
    outs = [generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[]) for prompt, _ in long[:2]]
    assert [out.token_ids for out in outs] == [ref for _, ref in long[:2]]
    assert outs[0].stats.draft_prompt_tokens == WINDOW and sum(outs[0].stats.chosen_depth_histogram[1:]) > 0
    windowed = {key: worth for key, worth in generator.worth.items() if key[-1] == "window"}
    assert len(windowed) == 1 and next(iter(windowed.values())).tried > 0
    kind = next(iter(windowed))[:-1]
    assert generator.worth[kind].tried == 0  # the kind's whole-prompt drafts: none


def test_a_windowed_drafters_steps_are_timed_at_its_own_context(target, prompts_and_refs, windowed, monkeypatch):
    """The engine rescales its costs from timed drafting (decode/cost_calibration.py); a windowed drafter's forwards
    run over its own cache, `skipped` tokens shorter than the target's context, and are timed against the table
    there: at the target's context they would read as a fast drafter and scale every drafting cost down."""
    from frspec.decode.cost_calibration import StepTimings

    prompts, refs = prompts_and_refs
    recorded = []
    real_add_draft = StepTimings.add_draft

    def add_draft(self, shape, k, context, behind, seconds):
        recorded.append(context)
        real_add_draft(self, shape, k, context, behind, seconds)

    monkeypatch.setattr(StepTimings, "add_draft", add_draft)
    generator = build_generator(target, draft=noisy_copy(target, 0.05, seed=1), costs=FLAT, token_map_size="auto")
    assert generator.timings is not None  # recalibration on, as by default
    prompt, ref = max(zip(prompts, refs), key=lambda pair: len(pair[0]))
    out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
    assert out.token_ids == ref and out.stats.draft_prompt_tokens == WINDOW
    assert recorded and all(WINDOW < context <= WINDOW + NEW for context in recorded), (len(prompt), recorded)


def test_an_eagle_head_reads_no_window(target):
    """EAGLE and MTP heads read the target's state at every prompt position: they offer no window, and one asked of
    them is refused in one line."""
    from tests.decode.eagle_tiny import oracle_eagle2_head

    generator = build_generator(target, eagle=oracle_eagle2_head(target), costs=FLAT, recalibrate_costs=False)
    assert generator.drafter.prompt_windows == ()
    with pytest.raises(FrspecError, match="EAGLE head reads the whole prompt"):
        generator.drafter.prefill(torch.zeros((1, 8), dtype=torch.long), window=4)


LATE = 6  # tokens emitted (the target prefill's first one included) before a late drafter prefill


@pytest.fixture
def late(monkeypatch):
    monkeypatch.setattr(_engine, "plain_tokens_first", lambda state, costs, prefill_tokens: LATE)


@pytest.mark.parametrize("window", [None, WINDOW], ids=["whole", "window"])
def test_greedy_identity_with_the_drafter_prefilled_after_plain_tokens(target, prompts_and_refs, late, monkeypatch,
                                                                      window):
    prompts, refs = prompts_and_refs
    if window is not None:  # the controller's choice, at the start and again at the late prefill
        monkeypatch.setattr(_engine, "drafter_prefill_tokens", lambda state, costs, prompt, new, windows, **_: window)
    generator = build_generator(target, draft=noisy_copy(target, 0.05, seed=1), costs=FLAT,
                                recalibrate_costs=False, token_map_size="auto")
    accepted = 0
    for prompt, ref in zip(prompts, refs):
        out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
        assert out.token_ids == ref, f"prompt of {len(prompt)}"
        stats = out.stats
        assert stats.draft_prompt_tokens == (window or len(prompt)) and stats.draft_prefill_time_s > 0
        # The first LATE - 1 steps were plain; the drafter's own forwards came after them.
        assert stats.chosen_depth_histogram[0] >= LATE - 1
        assert generator.drafter.skipped == (len(prompt) - window if window else 0)
        assert cache_length(generator.drafter.cache) <= (window or len(prompt)) + NEW
        accepted += sum(stats.accepted_per_position)
    assert accepted > 0, "no draft was ever accepted: the identity check would be vacuous"


def test_a_request_whose_answer_ends_before_the_late_prefill_never_runs_the_drafter(target, prompts_and_refs, late):
    prompts, refs = prompts_and_refs
    generator = build_generator(target, draft=noisy_copy(target, 0.05, seed=1), costs=FLAT,
                                recalibrate_costs=False, token_map_size="auto")
    prompt, ref = prompts[0], refs[0]
    stop = ref[LATE - 3]  # its first emission ends the request within the plain tokens
    end = ref.index(stop) + 1
    assert end < LATE
    out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[stop])
    assert out.token_ids == ref[:end] and out.finish_reason == "eos"
    assert out.stats.draft_prompt_tokens == 0 and out.stats.draft_prefill_time_s == 0.0
    assert generator.drafter.steps == 0 and cache_length(generator.drafter.cache) == 0
    # The same request with the drafter prefilled late does draft once its answer goes on.
    out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
    assert out.token_ids == ref and generator.drafter.steps > 0


def test_a_head_that_reads_the_targets_prompt_states_prefills_with_the_target(target, prompts_and_refs, late):
    prompts, refs = prompts_and_refs
    generator = build_generator(target, eagle=oracle_eagle2_head(target), costs=FLAT, recalibrate_costs=False,
                                token_map_size="auto")
    assert not generator.drafter.late_prefill
    out = generator.generate(input_ids=prompts[0], max_new_tokens=NEW, eos_token_ids=[])
    assert out.token_ids == refs[0]
    assert out.stats.draft_prompt_tokens == len(prompts[0]) and out.stats.chosen_depth_histogram[0] < LATE - 1


def test_a_request_whose_kind_ends_early_skips_a_prefill_that_only_a_full_answer_wins_back(target, prompts_and_refs):
    """Under the costs of the window test above, drafting over a full 24-token answer wins back a whole prefill of
    a prompt under 2 x WINDOW tokens. After two answers of that kind (greedy, a short prompt) ended at their second
    token, a request is expected to emit (24 + 2 + 2) / 3 tokens (decode/answer_lengths.py): it decodes plainly,
    never running the drafter, and still emits the target's own tokens. Answers that run to the cap bring the
    prefill back (here the fifth: the expectation then (24 + 2 + 2 + 5 x 24) / 8 = 18.5 tokens)."""
    prompts, refs = prompts_and_refs
    costs = StepCosts({n: 1.0 + 0.01 * n for n in range(1, 10)}, {1: 0.01, 64: 0.01 + 0.2 * 63},
                      {VOCAB: {1: 0.004}}, full_size=VOCAB)
    generator = build_generator(target, draft=noisy_copy(target, 0.05, seed=1), costs=costs,
                                recalibrate_costs=False)
    generator.drafter.prompt_windows = ()
    prompt, ref = min(zip(prompts, refs), key=lambda pair: len(pair[0]))
    assert len(prompt) < 2 * WINDOW
    out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
    assert out.token_ids == ref and out.stats.draft_prompt_tokens == len(prompt)  # a fresh generator prefills
    generator.carry_from(((), (), ()))  # forget it: only the two short answers below come before
    for _ in range(2):
        out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[ref[1]])
        assert out.token_ids == ref[:ref.index(ref[1]) + 1] and out.finish_reason == "eos"
    steps = generator.drafter.steps
    out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
    assert out.token_ids == ref
    assert out.stats.draft_prompt_tokens == 0 and out.stats.draft_prefill_time_s == 0.0
    assert generator.drafter.steps == steps
    full = 0
    while out.stats.draft_prompt_tokens == 0:  # full answers: the expectation climbs back towards the cap
        out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
        assert out.token_ids == ref
        full += 1
        assert full < LENGTH_HISTORY, "the short answers aged out and still no prefill"
    assert out.stats.draft_prompt_tokens == len(prompt)
