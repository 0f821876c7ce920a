"""Edges found by review (issue 13, item 3), outside the decode package: one test each."""

from __future__ import annotations

import copy

import pytest
import torch

from frspec.errors import FrspecError
from frspec.models.eagle_loading import build_head
from frspec.models.loading import check_context_length, max_positions_of
from frspec.vocab.token_map import TokenMap

from tests.decode import eagle_tiny
from tests.decode.spec_tiny import tiny_lm

# --- EAGLE-3 configs -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eagle3_checkpoint():
    """(target, config, state) of the tiny oracle EAGLE-3 head, captured from eagle_tiny's own builder."""
    target = eagle_tiny.mostly_bigram(tiny_lm("llama", 72, hidden=32, seed=0, dtype=torch.float32))
    captured = {}

    def capture(config, state, target, what):
        captured.update(config=copy.deepcopy(config), state=dict(state))
        return build_head(config, state, target, what)

    real = eagle_tiny.build_head
    eagle_tiny.build_head = capture
    try:
        eagle_tiny.oracle_eagle3_head(target, draft_ids=torch.arange(0, 72, 2))
    finally:
        eagle_tiny.build_head = real
    return target, captured["config"], captured["state"]


def test_eagle3_aux_layer_ids_at_the_top_level(eagle3_checkpoint):
    """speculators-format heads put eagle_aux_hidden_state_layer_ids at the config's top level."""
    target, config, state = eagle3_checkpoint
    nested = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    top = {k: v for k, v in config.items() if k != "eagle_config"}
    top["eagle_aux_hidden_state_layer_ids"] = [1, 0, 2]
    assert build_head(top, state, target, "top-level").target_layer_ids(2) == [1, 0, 2]
    assert build_head(config, state, target, "nested").target_layer_ids(2) == nested
    both = dict(config, eagle_aux_hidden_state_layer_ids=[1, 0, 2])
    with pytest.raises(FrspecError, match="twice"):
        build_head(both, state, target, "conflicting")
    bad = dict(top, eagle_aux_hidden_state_layer_ids=[0, 9, 1])
    with pytest.raises(FrspecError, match="eagle_aux_hidden_state_layer_ids"):
        build_head(bad, state, target, "out of range")


def test_eagle3_norm_before_residual_takes_the_residual_after_hidden_norm(eagle3_checkpoint):
    target, config, state = eagle3_checkpoint
    plain = build_head(config, state, target, "plain")
    normed = build_head(dict(config, norm_before_residual=True), state, target, "normed")
    layer = normed.midlayer
    assert layer.norm_before_residual and not plain.midlayer.norm_before_residual
    with torch.no_grad():
        layer.hidden_norm.weight.normal_(1.0, 0.3)  # so normalising changes the residual visibly
        plain.midlayer.hidden_norm.weight.copy_(layer.hidden_norm.weight)
    gen = torch.Generator().manual_seed(0)
    embeds, hidden = torch.randn(1, 3, 32, generator=gen), 5 * torch.randn(1, 3, 32, generator=gen)
    positions = torch.arange(3)[None]
    rope = normed.rotary_emb(hidden, positions)
    mask = torch.triu(torch.full((3, 3), float("-inf")), 1)[None, None]
    with torch.no_grad():
        got = layer(embeds, hidden, rope, mask, None)
        # By hand: attention over [input_layernorm(e), hidden_norm(h)], residual = hidden_norm(h), then the MLP.
        h = layer.hidden_norm(hidden)
        attn, _ = layer.self_attn(hidden_states=torch.cat([layer.input_layernorm(embeds), h], -1),
                                  position_embeddings=rope, attention_mask=mask, cache=None)
        want = h + attn + layer.mlp(layer.post_attention_layernorm(h + attn))
        other = plain.midlayer(embeds, hidden, rope, mask, None)
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, other)  # the flag matters
    with pytest.raises(FrspecError, match="norm_before_residual"):
        build_head(dict(config, norm_before_residual="yes"), state, target, "bad flag")


# --- context length --------------------------------------------------------------------------------------------------


def test_context_length_check_names_the_numbers():
    model = tiny_lm("llama", 72, hidden=32, seed=0, dtype=torch.float32)
    model.config.max_position_embeddings = 64
    assert max_positions_of(model) == 64
    check_context_length(model, 10, 54)  # exactly fits: the deepest position used is 62
    with pytest.raises(FrspecError, match=r"prompt \(10 tokens\) \+ max_new_tokens \(55\) = 65 exceeds .* 64"):
        check_context_length(model, 10, 55)
    with pytest.raises(FrspecError, match="at most 54"):
        check_context_length(model, 10, 10**12)  # no allocation happens before the check


# The engine calls check_context_length before it allocates: the bad-input rows `generate-beyond-context` and
# `generate-max-new-tokens-huge` test that end to end.


# --- token-map files in an unexpected format -------------------------------------------------------------------------


def test_map_errors_name_the_file_and_the_format_read_as(tmp_path):
    dup = tmp_path / "dup.pt"
    torch.save([3, 1, 3], dup)
    with pytest.raises(FrspecError, match=r"dup\.pt \(read as a thunlp token map\): .*duplicated id 3"):
        TokenMap.load(dup)
    ragged = tmp_path / "ids.pt"
    torch.save({"ids": [1, 2]}, ragged)
    with pytest.raises(FrspecError, match=r"ids\.pt: .*read as a torch file holding a dict"):
        TokenMap.load(ragged)
    text = tmp_path / "map.json"
    text.write_text("[1, 2, 3]")
    with pytest.raises(FrspecError, match=r"map\.json \(read as a torch file\)"):
        TokenMap.load(text)
    scores = tmp_path / "scores.pt"
    torch.save(torch.tensor([0.5, float("nan")]), scores)
    with pytest.raises(FrspecError, match=r"scores\.pt \(read as a vllm-scores token map\)"):
        TokenMap.load(scores)
    good = tmp_path / "good.safetensors"
    TokenMap([0, 2], 5).save(good)
    assert TokenMap.load(good).ids.tolist() == [0, 2]
