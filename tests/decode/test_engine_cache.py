"""Caches stay in step with the accepted tokens after rejections: truncation, never recomputation."""

from __future__ import annotations

import pytest
import torch

from frspec.decode.kv_cache import cache_length, new_cache
from frspec.decode.factory import build_generator
from frspec.decode.step import decode_step, prefill, start_state
from frspec.decode.sampling import SamplingParams
from frspec.vocab.token_map import TokenMap

from tests.decode.spec_tiny import noisy_copy, tiny_lm

VOCAB = 256


def _fresh_keys(model, ids: torch.Tensor) -> list[torch.Tensor]:
    cache = new_cache(model)
    with torch.no_grad():
        model(input_ids=ids, cache=cache, use_cache=True)
    return [layer.keys for layer in cache.layers]


@pytest.mark.parametrize(
    "sampling", [SamplingParams(), SamplingParams(temperature=1.0, seed=3)], ids=["greedy", "sampling"]
)
def test_caches_match_a_fresh_forward_after_every_step(sampling):
    target = tiny_lm("qwen2", VOCAB, tie=True, seed=0)
    draft = noisy_copy(target, 0.05, seed=1)
    token_map = TokenMap(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0))[:160], VOCAB)
    generator = build_generator(target, draft, token_map, num_spec_tokens=4)
    # The engine's own step functions, one at a time, so the caches can be read between steps.
    generator.drafter.reset()
    req = start_state(target, [7, 8, 9, 10], 40, sampling)
    with torch.inference_mode():
        prefill(target, generator.drafter, req, generator.hidden_layers)
    rejections = 0
    while req.length < 4 + 40 - 5:
        before = req.length
        with torch.inference_mode():
            new = decode_step(target, generator.drafter, req, generator.shape, generator.hidden_layers, 40).tokens
        rejections += len(new) < 5
        assert req.length == before + len(new)
        accepted = req.buf[:, : req.length]
        # Target: holds exactly the accepted tokens but the pending last one, with the same keys as a fresh run.
        assert cache_length(req.cache) == req.length - 1
        for cached, fresh in zip([l.keys for l in req.cache.layers], _fresh_keys(target, accepted[:, :-1])):
            torch.testing.assert_close(cached, fresh, rtol=0, atol=1e-10)
        # Drafter: never holds a rejected token.
        n = cache_length(generator.drafter.cache)
        assert n <= req.length - 1
        for cached, fresh in zip([l.keys for l in generator.drafter.cache.layers], _fresh_keys(draft, accepted[:, :n])):
            torch.testing.assert_close(cached, fresh, rtol=0, atol=1e-10)
    assert rejections > 0
    # The next-token logits from the cached path equal a fresh forward over the whole accepted sequence.
    with torch.no_grad():
        pending = req.buf[:, req.length - 1 : req.length]
        cached_logits = target(input_ids=pending, cache=req.cache, use_cache=True).logits
        fresh_logits = target(input_ids=req.buf[:, : req.length]).logits
    torch.testing.assert_close(cached_logits[0, -1], fresh_logits[0, -1], rtol=0, atol=1e-10)


def test_generator_is_reusable_across_requests():
    target = tiny_lm("llama", VOCAB, seed=2)
    generator = build_generator(target, noisy_copy(target, 0.05, seed=3), num_spec_tokens=3)
    a = generator.generate(input_ids=[1, 2, 3], max_new_tokens=12, eos_token_ids=[])
    generator.generate(input_ids=[40, 50, 60, 70, 80], max_new_tokens=9, eos_token_ids=[])
    b = generator.generate(input_ids=[1, 2, 3], max_new_tokens=12, eos_token_ids=[])
    assert a.token_ids == b.token_ids
    assert a.stats.draft_steps == b.stats.draft_steps  # drafter counters are per request
