"""Context-aware drafting (ContextVocab in DraftModelDrafter) is lossless: greedy output is the target's own.

The map leaves out every token the target picks on these prompts, and the target drafts for itself, so with the
static map every draft is rejected (acceptance exactly 1.0), while the context-aware rows hold the prompt's and
the generated tokens: a position whose token occurred before is then drafted right. Identity holds either way.
"""

from __future__ import annotations

import pytest
import torch
from spec_tiny import hf_greedy, tiny_lm

from frspec.decode.draft_model import DraftModelDrafter
from frspec.decode.factory import build_generator
from frspec.errors import FrspecError
from frspec.vocab.context_vocab import ContextVocab
from frspec.vocab.token_map import TokenMap

VOCAB = 256
NEW = 24


@pytest.fixture(scope="module")
def setup():
    target = tiny_lm("qwen2", VOCAB, tie=True, seed=0)  # tied: a tiny model like this repeats tokens often
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (3, 7, 12)]
    refs = [hf_greedy(target, p, NEW) for p in prompts]
    picked = {t for r in refs for t in r}
    token_map = TokenMap([i for i in range(VOCAB) if i not in picked][: VOCAB // 2], VOCAB)
    # Precondition: some decoded token (after the first, which prefill yields) occurred before in its request.
    repeats = sum(r[i] in set(p) | set(r[:i]) for p, r in zip(prompts, refs) for i in range(1, NEW))
    assert repeats > 0
    return target, prompts, refs, token_map


@pytest.mark.parametrize("budget", ["fixed", "additive"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_context_rows_are_lossless_and_draft_what_the_static_map_cannot(setup, budget, k):
    target, prompts, refs, token_map = setup
    static = build_generator(target, target, token_map, num_spec_tokens=k)
    drafter = DraftModelDrafter(target, token_map, context_rows=64, context_budget=budget)
    assert isinstance(drafter.vocab, ContextVocab)
    context = build_generator(target, drafter, num_spec_tokens=k)
    accepted = {"static": 0, "context": 0}
    for prompt, ref in zip(prompts, refs):
        for name, generator in (("static", static), ("context", context)):
            out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
            assert out.token_ids == ref, f"{name} budget={budget} k={k} prompt={prompt}"
            accepted[name] += sum(out.stats.accepted_per_position)
    assert accepted["static"] == 0  # no token the target picks is in the map
    assert accepted["context"] > 0


def test_context_rows_need_a_map(setup):
    target = setup[0]
    with pytest.raises(FrspecError, match="extends a token map"):
        DraftModelDrafter(target, None, context_rows=8)
