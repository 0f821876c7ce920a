"""Greedy speculative decoding is token-for-token transformers' greedy generate, whatever the drafter or map."""

from __future__ import annotations

import pytest
import torch

from frspec.decode.factory import build_generator
from frspec.vocab.token_map import TokenMap

from tests.decode.spec_tiny import hf_greedy, noisy_copy, tiny_lm

VOCAB = 256
NEW = 16


def _setup(family: str, tie: bool):
    target = tiny_lm(family, VOCAB, tie=tie, seed=0)
    gen = torch.Generator().manual_seed(123)
    lengths = torch.randint(1, 13, (5,), generator=gen).tolist()
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in lengths]
    refs = [hf_greedy(target, p, NEW) for p in prompts]
    picked = torch.tensor(sorted({t for r in refs for t in r}))
    # A map that keeps half the vocabulary but leaves out half of the tokens the target actually picks.
    excluded = set(picked[torch.randperm(len(picked), generator=gen)[: len(picked) // 2]].tolist())
    keep = [i for i in torch.randperm(VOCAB, generator=gen).tolist() if i not in excluded][: VOCAB // 2]
    token_map = TokenMap(keep, VOCAB)
    drafters = {
        "vanilla": (None, None),
        "random-draft": (tiny_lm(family, VOCAB, tie=tie, seed=7), None),
        "noisy-draft": (noisy_copy(target, 0.05, seed=1), None),
        "noisy-draft+map": (noisy_copy(target, 0.05, seed=1), token_map),
        "target-as-draft+map": (target, token_map),
    }
    return target, prompts, refs, drafters, excluded


@pytest.fixture(scope="module", params=[("llama", False), ("qwen2", True)], ids=["llama", "qwen2-tied"])
def setup(request):
    return _setup(*request.param)


@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_identity_with_every_drafter(setup, k):
    target, prompts, refs, drafters, excluded = setup
    for name, (draft, token_map) in drafters.items():
        generator = build_generator(target, draft, token_map, num_spec_tokens=k)
        accepted = proposed = 0
        for prompt, ref in zip(prompts, refs):
            out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
            assert out.token_ids == ref, f"{name} k={k} prompt={prompt}"
            assert out.finish_reason == "length"
            s = out.stats
            assert s.tokens == NEW and s.decode_tokens == NEW - 1
            assert 1.0 <= s.acceptance_length <= k + 1
            accepted += sum(s.accepted_per_position)
            proposed += sum(s.proposed_per_position)
        if name == "noisy-draft":
            assert 0 < accepted < proposed, "the noisy draft should be accepted sometimes and rejected sometimes"
        if name == "target-as-draft+map":
            # The target's own choices outside the map can never be drafted, so some drafts must be rejected.
            assert 0 < accepted < proposed
    assert any(t in excluded for r in refs for t in r)


def test_target_as_draft_accepts_everything():
    target = tiny_lm("llama", VOCAB, seed=3)
    prompt = [5, 6, 7]
    ref = hf_greedy(target, prompt, 25)
    for k in (1, 4, 8):
        out = build_generator(target, target, num_spec_tokens=k).generate(
            input_ids=prompt, max_new_tokens=25, eos_token_ids=[]
        )
        assert out.token_ids == ref
        s = out.stats
        assert s.acceptance_rate_per_position == [1.0] * k
        # 24 decode tokens, at most k + 1 per forward; the last step may be shortened by the token budget.
        assert s.target_forwards == -(-24 // (k + 1))
        assert s.acceptance_length == pytest.approx(24 / s.target_forwards)
        assert s.draft_steps > 0 and s.forward_ratio is not None


def test_vanilla_acceptance_length_is_one():
    target = tiny_lm("qwen2", VOCAB, tie=True, seed=4)
    out = build_generator(target).generate(input_ids=[1, 2, 3], max_new_tokens=10, eos_token_ids=[])
    s = out.stats
    assert s.acceptance_length == 1.0 and s.target_forwards == 9
    assert s.num_spec_tokens == 0 and s.accepted_per_position == [] and s.forward_ratio is None
    assert out.token_ids == hf_greedy(target, [1, 2, 3], 10)


@pytest.mark.parametrize("draft_kind", ["target", "noisy"])
def test_max_new_tokens_reached_mid_draft(draft_kind):
    target = tiny_lm("llama", VOCAB, seed=5)
    draft = target if draft_kind == "target" else noisy_copy(target, 0.05, seed=2)
    prompt = [9, 8, 7, 6]
    ref = hf_greedy(target, prompt, 13)
    generator = build_generator(target, draft, num_spec_tokens=4)
    for m in range(0, 14):
        out = generator.generate(input_ids=prompt, max_new_tokens=m, eos_token_ids=[])
        assert out.token_ids == ref[:m]
        assert out.stats.tokens == m


def test_eos_inside_an_accepted_draft():
    target = tiny_lm("llama", VOCAB, seed=6)
    prompt = [3, 1, 4, 1, 5]
    ref = hf_greedy(target, prompt, 20)
    j = next(i for i in range(2, 8) if ref[i] not in ref[:i])
    eos = ref[j]
    out = build_generator(target, target, num_spec_tokens=8).generate(
        input_ids=prompt, max_new_tokens=20, eos_token_ids=[eos]
    )
    assert out.token_ids == ref[: j + 1] == hf_greedy(target, prompt, 20, eos=eos)
    assert out.finish_reason == "eos"
    # One decode step drafted past the EOS and had it accepted; nothing after it was emitted.
    assert out.stats.target_forwards == 1 and out.stats.accepted_per_position[0] == 1
    assert out.stats.tokens == j + 1


def test_default_eos_comes_from_generation_config():
    target = tiny_lm("llama", VOCAB, seed=6)
    prompt = [3, 1, 4, 1, 5]
    ref = hf_greedy(target, prompt, 20)
    j = next(i for i in range(2, 8) if ref[i] not in ref[:i])
    target.generation_config.eos_token_id = [VOCAB - 1, ref[j]]
    out = build_generator(target, target, num_spec_tokens=3).generate(input_ids=prompt, max_new_tokens=20)
    assert out.token_ids == ref[: j + 1]
