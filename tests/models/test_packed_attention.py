"""Grouped-query attention with the heads packed into rows (models/packed_attention.py): the same attention as
transformers' SDPA path for every mask the engine passes, a switch `load_model` makes, and speculative decoding on
a packed target still token for token the target alone."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from frspec.decode.factory import build_generator
from frspec.decode.tree_shape import TreeShape
from frspec.models import packed_attention
from frspec.models.attention import additive_mask, check_arbitrary_masks
from frspec.models.loading import load_model
from frspec.models.packed_attention import PACKED_ROWS, PACKED_SDPA, packed_sdpa_forward, use_packed_attention

from tests.decode.spec_tiny import hf_greedy, noisy_copy, tiny_lm
from tests.models.tiny_gguf_models import tiny_qwen2


def reference(query, key, value, mask, scale):
    """Attention spelt out: every query head against its own copy of its key/value head, in fp64."""
    groups = query.shape[1] // key.shape[1]
    key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
    scores = query @ key.transpose(-1, -2) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return (scores.softmax(-1) @ value).transpose(1, 2)


# Several rows without a mask are transformers' own (causal) case, so only one row goes without.
CASES = [(rows, mask) for rows in (1, 2, 5, PACKED_ROWS) for mask in ("none", "causal-bool", "tree-additive")
         if rows == 1 or mask != "none"]


@pytest.mark.parametrize("groups", [2, 7])
@pytest.mark.parametrize("rows, mask_kind", CASES)
def test_packed_is_the_same_attention(groups, rows, mask_kind):
    gen = torch.Generator().manual_seed(rows * 10 + groups)
    batch, kv_heads, cached, dim, v_dim = 2, 2, 9, 8, 6
    query = torch.randn(batch, kv_heads * groups, rows, dim, generator=gen, dtype=torch.float64)
    key = torch.randn(batch, kv_heads, cached + rows, dim, generator=gen, dtype=torch.float64)
    value = torch.randn(batch, kv_heads, cached + rows, v_dim, generator=gen, dtype=torch.float64)
    allowed = torch.ones(rows, cached + rows, dtype=torch.bool).tril(cached)
    if mask_kind == "tree-additive":  # each row sees the cache, itself and a random subset of the rows before it
        allowed[:, cached:] &= torch.rand(rows, rows, generator=gen).tril() < 0.5
        allowed[:, cached:] |= torch.eye(rows, dtype=torch.bool)
    mask = {"none": None, "causal-bool": allowed[None, None].expand(batch, 1, -1, -1),
            "tree-additive": additive_mask(allowed, dtype=torch.float64)}[mask_kind]
    module = types.SimpleNamespace(num_key_value_groups=groups, is_causal=True, training=False)
    out, weights = packed_sdpa_forward(module, query, key, value, mask, scaling=0.3)
    boolean = None if mask is None else (mask if mask.dtype == torch.bool else mask == 0)
    assert weights is None and out.shape == (batch, rows, kv_heads * groups, v_dim)
    torch.testing.assert_close(out, reference(query, key, value, boolean, 0.3), rtol=1e-10, atol=1e-10)
    plain, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    torch.testing.assert_close(out, plain, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", ["wide", "rows-without-mask", "dropout", "one-head-per-group", "mask-per-head",
                                  "mask-broadcast-over-rows"])
def test_calls_it_cannot_pack_go_to_transformers(monkeypatch, case):
    rows = {"wide": PACKED_ROWS + 1, "rows-without-mask": 3}.get(case, 2)
    groups = 1 if case == "one-head-per-group" else 2
    query, key, value = torch.randn(1, 2 * groups, rows, 4), torch.randn(1, 2, rows, 4), torch.randn(1, 2, rows, 4)
    mask = None if case == "rows-without-mask" else torch.ones(1, 1, rows, rows, dtype=torch.bool).tril()
    if case == "mask-per-head":
        mask = mask.expand(1, 2 * groups, rows, rows)
    if case == "mask-broadcast-over-rows":
        mask = torch.ones(1, 1, 1, rows, dtype=torch.bool)
    seen = []
    monkeypatch.setattr("transformers.integrations.sdpa_attention.sdpa_attention_forward",
                        lambda *a, **k: seen.append(k) or ("delegated", None))
    module = types.SimpleNamespace(num_key_value_groups=groups, is_causal=True, training=False)
    dropout = 0.1 if case == "dropout" else 0.0
    assert packed_sdpa_forward(module, query, key, value, mask, dropout=dropout)[0] == "delegated"
    assert seen and seen[0]["dropout"] == dropout


def test_load_model_switches_a_cpu_model_and_trees_accept_it(tmp_path):
    tiny_qwen2(vocab_size=96).save_pretrained(tmp_path / "m")
    model = load_model(str(tmp_path / "m"), dtype="fp32")
    assert model.config._attn_implementation == PACKED_SDPA
    check_arbitrary_masks(model.config)  # token trees run on it
    eager = tiny_lm("qwen2")
    eager.set_attn_implementation("eager")
    assert not use_packed_attention(eager) and eager.config._attn_implementation == "eager"


def test_a_packed_target_decodes_and_speculates_as_before(monkeypatch):
    """The packed target's greedy text is the sdpa target's, and a speculative chain and tree on the packed target
    (verifying several rows under masks, the packed path) give it token for token; the packed path is taken."""
    calls = []
    original = packed_attention.F.scaled_dot_product_attention
    monkeypatch.setattr(packed_attention.F, "scaled_dot_product_attention",
                        lambda q, *a, **k: calls.append(q.shape[2]) or original(q, *a, **k))
    target = tiny_lm("qwen2", seed=3)
    draft = noisy_copy(target, 0.05, seed=1)
    prompts = [[5, 9, 33, 2, 71], [40, 41, 42, 43, 44, 45, 46, 47, 48]]
    refs = [hf_greedy(target, p, 20) for p in prompts]
    assert use_packed_attention(target) and use_packed_attention(draft)
    assert [hf_greedy(target, p, 20) for p in prompts] == refs
    for shape in (TreeShape.chain(3), TreeShape.parse("static-3x2")):
        generator = build_generator(target, draft, tree=shape)
        for prompt, ref in zip(prompts, refs):
            assert generator.generate(input_ids=prompt, max_new_tokens=20, eos_token_ids=[]).token_ids == ref
    assert {1, 2 * 4} <= set(calls)  # one decode row, and 4 rows (k + 1) packed two heads to a key/value head
