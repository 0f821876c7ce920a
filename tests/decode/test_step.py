"""The one decode step: stats count only emitted drafts, chains take the crop path, tree masks need eager/sdpa."""

from __future__ import annotations

import pytest
import torch

import frspec.decode.kv_cache as kv_cache
from frspec.decode.draft_model import DraftModelDrafter
from frspec.decode.factory import build_generator
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError

from tests.decode.spec_tiny import TOKENIZER_VOCAB, hf_greedy, noisy_copy, tiny_lm, tiny_tokenizer

VOCAB = 64
PROMPT = [3, 1, 4, 1, 5]
K = 4


def _first_new_token_index(ref: list[int]) -> int:
    """Index j >= 1 of the first token that does not occur before it (so an EOS there ends generation there)."""
    return next(j for j in range(1, len(ref)) if ref[j] not in ref[:j])


def test_drafts_accepted_after_an_eos_are_not_counted():
    target = tiny_lm("llama", VOCAB, seed=3)
    ref = hf_greedy(target, PROMPT, 12)
    j = _first_new_token_index(ref)
    assert j <= K, "the test needs the EOS inside the first accepted draft"
    # The target drafts for itself: every draft is accepted, so the first step accepts K drafts, and the EOS
    # among them ends generation with only j of those drafts emitted.
    generator = build_generator(target, target, num_spec_tokens=K)
    out = generator.generate(input_ids=PROMPT, max_new_tokens=12, eos_token_ids=[ref[j]])
    assert out.token_ids == ref[: j + 1] and out.finish_reason == "eos"
    s = out.stats
    assert s.target_forwards == 1 and s.decode_tokens == j
    assert s.accepted_per_position == [1] * j + [0] * (K - j)
    assert s.proposed_per_position == [1] * K
    assert s.accepted_depth_histogram[j] == 1 and sum(s.accepted_depth_histogram) == 1
    assert s.acceptance_length == j  # emitted decode tokens per target forward


def test_the_drafters_prefill_is_timed_apart_and_counts_as_decoding(monkeypatch):
    """The drafter's prefill is speculation's cost: timed apart from the target's prefill, and inside the decoding
    time the bench's throughput divides (GenerationStats.decode_tokens_per_s)."""
    import time

    target = tiny_lm("llama", VOCAB, seed=3)
    generator = build_generator(target, noisy_copy(target, 0.05, seed=1), num_spec_tokens=K)
    slow = 0.2
    prefill = type(generator.drafter).prefill

    def slow_prefill(self, context, window=None):
        time.sleep(slow)
        return prefill(self, context, window=window)

    monkeypatch.setattr(type(generator.drafter), "prefill", slow_prefill)
    s = generator.generate(input_ids=PROMPT, max_new_tokens=8).stats
    assert s.draft_prefill_time_s >= slow > s.prefill_time_s
    assert s.wall_time_s - s.prefill_time_s >= slow + s.target_time_s + s.draft_time_s
    assert s.decode_tokens_per_s == pytest.approx(s.decode_tokens / (s.wall_time_s - s.prefill_time_s))
    assert s.overhead_time_s >= 0


def test_drafts_accepted_after_a_stop_string_are_not_counted():
    tok = tiny_tokenizer()
    target = tiny_lm("llama", TOKENIZER_VOCAB, seed=11)
    generator = build_generator(target, target, num_spec_tokens=8, tokenizer=tok)
    ref = generator.generate(prompt="the cat", max_new_tokens=10, eos_token_ids=[])
    assert ref.stats.target_forwards == 1 and ref.stats.accepted_per_position == [1] * 8
    # A stop string completed by decode token 2 (the third generated token): drafts 3.. are cut.
    upto = tok.decode(ref.token_ids[:3], skip_special_tokens=True)
    before = tok.decode(ref.token_ids[:2], skip_special_tokens=True)
    if len(upto) <= len(before):
        pytest.skip("the tiny tokenizer decoded token 2 to nothing")
    stop = upto[len(before) - 1:] if len(before) else upto
    out = generator.generate(prompt="the cat", max_new_tokens=10, eos_token_ids=[], stop_strings=[stop])
    assert out.finish_reason == "stop_string"
    kept_drafts = len(out.token_ids) - 1
    assert kept_drafts < 8
    assert out.stats.accepted_per_position == [1] * kept_drafts + [0] * (8 - kept_drafts)
    assert sum(out.stats.accepted_depth_histogram) == 1


def test_chains_crop_the_cache_and_only_branching_trees_gather(monkeypatch):
    target = tiny_lm("llama", VOCAB, seed=3)
    gathers = []
    real = kv_cache.keep_cache_entries
    monkeypatch.setattr(kv_cache, "keep_cache_entries", lambda *a: gathers.append(1) or real(*a))
    expected = hf_greedy(target, PROMPT, 40)
    draft = noisy_copy(target, 0.5, seed=1)  # often right, not always first: non-first children get accepted
    chain = build_generator(target, draft, tree=TreeShape.chain(3))
    assert chain.generate(input_ids=PROMPT, max_new_tokens=40, eos_token_ids=[]).token_ids == expected
    assert gathers == []  # an accepted chain path is always a prefix of node order: a crop
    tree = build_generator(target, draft, tree=TreeShape.static(2, 3))
    assert tree.generate(input_ids=PROMPT, max_new_tokens=40, eos_token_ids=[]).token_ids == expected
    assert gathers  # some accepted path was not the first child at every level


@pytest.mark.parametrize("who", ["target", "draft"])
def test_tree_masks_need_an_attention_that_applies_them(who):
    target = tiny_lm("llama", VOCAB, seed=3)
    draft = tiny_lm("llama", VOCAB, seed=4)
    (target if who == "target" else draft).config._attn_implementation = "flash_attention_2"
    with pytest.raises(FrspecError, match="flash_attention_2"):
        build_generator(target, draft, tree=TreeShape.static(2, 2))
    # Chains use the model's own causal path, which every implementation runs.
    build_generator(target, draft, num_spec_tokens=3)
    if who == "draft":
        with pytest.raises(FrspecError, match="attention implementation"):
            DraftModelDrafter(draft).check_shape(TreeShape.dynamic(3, 2, 4))


def test_keep_path_gathers_full_and_sliding_layers_only():
    """A sliding-window layer is gathered like a full one (Gemma 3 end to end: test_gemma3.py); a layer of another
    kind is refused before any layer is changed."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.cache_utils import DynamicIndexedLayer, DynamicSlidingWindowLayer

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=16,
                      max_window_layers=1)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    cache = kv_cache.new_cache(model)
    with torch.no_grad():
        model(input_ids=torch.tensor([PROMPT]), cache=cache, use_cache=True)
    assert kv_cache.cache_length(cache) == len(PROMPT)
    assert any(type(layer) is DynamicSlidingWindowLayer for layer in cache.layers)
    keys = [layer.keys.clone() for layer in cache.layers]
    kv_cache.keep_path(cache, 2, [0, 2])  # not a prefix: a gather, in the full and the sliding layer
    assert kv_cache.cache_length(cache) == 4
    for layer, before in zip(cache.layers, keys):
        assert torch.equal(layer.keys, before[:, :, [0, 1, 2, 4]])
    kv_cache.keep_path(cache, 2, [0, 1])  # a prefix: a crop, which every layer supports
    assert kv_cache.cache_length(cache) == 4
    cache.layers.append(DynamicIndexedLayer())
    with pytest.raises(FrspecError, match="cannot drop tree entries"):
        kv_cache.keep_path(cache, 2, [0, 2])
    assert kv_cache.cache_length(cache) == 4  # nothing changed


def test_an_eagle_head_needs_an_attention_that_applies_tree_masks():
    from tests.decode.eagle_tiny import mostly_bigram, oracle_eagle2_head

    target = mostly_bigram(tiny_lm("llama", VOCAB, seed=0))
    head = oracle_eagle2_head(target)
    build_generator(target, eagle=head, num_spec_tokens=2)
    head.config._attn_implementation = "flash_attention_2"  # the head drafts even a chain under a tree mask
    with pytest.raises(FrspecError, match="EAGLE head"):
        build_generator(target, eagle=head, num_spec_tokens=2)
