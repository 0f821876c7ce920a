"""EAGLE heads: the published layouts load, compute what the EAGLE equations say, and refuse heads for other targets."""

import json

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from frspec.errors import FrspecError
from frspec.models.eagle import Eagle2Head, Eagle3Head
from frspec.models.eagle_loading import load_eagle_head
from frspec.decode.token_tree import TokenTree
from frspec.vocab.token_map import TokenMap

from tests.models.eagle_layouts import (
    HEADS,
    KV_HEADS,
    eagle2_tensors,
    eagle3_tensors,
    head_config,
    write_checkpoint,
)

H, VOCAB, TARGET_LAYERS = 32, 128, 4


def tiny_target(family: str = "llama", hidden: int = H, layers: int = TARGET_LAYERS, vocab: int = VOCAB):
    torch.manual_seed(0)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=64, num_hidden_layers=layers,
                  num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=256,
                  tie_word_embeddings=False)
    if family == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common)).eval()
    return LlamaForCausalLM(LlamaConfig(**common)).eval()


# --- independent reference math for one token at position 0 (attention over a single key is just o(v(x))) -----------


def rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def lin(t, name, x):
    bias = t.get(name + ".bias")
    return F.linear(x, t[name + ".weight"], bias)


def one_token_attention(t, p, x):
    v = lin(t, p + "self_attn.v_proj", x).view(KV_HEADS, -1)
    v = v.repeat_interleave(HEADS // KV_HEADS, dim=0).flatten()
    return lin(t, p + "self_attn.o_proj", v)


def mlp(t, p, x):
    y = rms(x, t[p + "post_attention_layernorm.weight"])
    return lin(t, p + "mlp.down_proj", F.silu(lin(t, p + "mlp.gate_proj", y)) * lin(t, p + "mlp.up_proj", y))


def reference_eagle2_logits(t, target, token, hidden):
    e = target.get_input_embeddings().weight[token]
    x = lin(t, "fc", torch.cat([e, hidden]))
    x = x + one_token_attention(t, "layers.0.", x)  # layer 0: no input norm
    x = x + mlp(t, "layers.0.", x)
    return target.get_output_embeddings()(x)


def reference_eagle3_logits(t, target, token, fused_target_hidden):
    e = target.get_input_embeddings().weight[token]
    hid = lin(t, "fc", fused_target_hidden)
    z = torch.cat([rms(e, t["midlayer.input_layernorm.weight"]), rms(hid, t["midlayer.hidden_norm.weight"])])
    x = hid + one_token_attention(t, "midlayer.", z)
    x = x + mlp(t, "midlayer.", x)
    return F.linear(rms(x, t["norm.weight"]), t["lm_head.weight"])


def head_logits_one_token(head, token, hidden):
    features = head(torch.tensor([[token]]), hidden.view(1, 1, -1), torch.tensor([[0]]))
    return head.draft_logits(features)[0, 0]


# --- loading each layout -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["bin", "safetensors", "sharded"])
@torch.no_grad()
def test_eagle2_layouts_load_and_compute_the_eagle_equations(tmp_path, fmt):
    target = tiny_target()
    tensors = eagle2_tensors(H, VOCAB)
    head = load_eagle_head(write_checkpoint(tmp_path / "h", head_config(H, VOCAB, 1, bias=True), tensors, fmt), target)
    assert isinstance(head, Eagle2Head) and head.version == 2
    assert head.embed_tokens is target.get_input_embeddings() and head.lm_head is target.get_output_embeddings()
    assert isinstance(head.layers[0].input_layernorm, torch.nn.Identity)
    hidden = torch.randn(H)
    want = reference_eagle2_logits(tensors, target, 7, hidden)
    torch.testing.assert_close(head_logits_one_token(head, 7, hidden), want)
    assert torch.equal(head.head_to_target, torch.arange(VOCAB))

    # The state it drafts from is the target's final-normed one, the input of the target's LM head; asking the
    # target for just that index returns it too.
    ids = torch.randint(VOCAB, (1, 5))
    assert head.target_layer_ids(TARGET_LAYERS) == [TARGET_LAYERS]
    for selection in (True, head.target_layer_ids(TARGET_LAYERS)):
        out = target(ids, output_hidden_states=selection)
        features = head.features_from_target(out.hidden_states)
        torch.testing.assert_close(target.get_output_embeddings()(features), out.logits)


@torch.no_grad()
def test_eagle2_qwen2_head_with_qkv_bias_and_two_layers(tmp_path):
    target = tiny_target("qwen2")
    tensors = eagle2_tensors(H, VOCAB, layers=2, qkv_bias=True)
    tensors["layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)  # saved by old transformers; ignored
    config = head_config(H, VOCAB, 2, qkv_bias=True, model_type="qwen2")
    head = load_eagle_head(write_checkpoint(tmp_path / "h", config, tensors, "bin"), target)
    assert type(head.layers[0]).__name__ == "Qwen2DecoderLayer" and len(head.layers) == 2
    assert not isinstance(head.layers[1].input_layernorm, torch.nn.Identity)
    torch.testing.assert_close(head.layers[0].self_attn.q_proj.bias, tensors["layers.0.self_attn.q_proj.bias"])
    torch.testing.assert_close(head.layers[1].input_layernorm.weight, tensors["layers.1.input_layernorm.weight"])


@torch.no_grad()
def test_embedding_in_checkpoint_is_shared_when_equal_and_kept_when_not(tmp_path):
    target = tiny_target()
    same = eagle2_tensors(H, VOCAB, embed=target.get_input_embeddings().weight)
    head = load_eagle_head(write_checkpoint(tmp_path / "a", head_config(H, VOCAB, 1), same), target)
    assert head.embed_tokens is target.get_input_embeddings()
    other = target.get_input_embeddings().weight + 1.0
    head = load_eagle_head(write_checkpoint(tmp_path / "b", head_config(H, VOCAB, 1),
                                            eagle2_tensors(H, VOCAB, embed=other)), target)
    assert head.embed_tokens is not target.get_input_embeddings()
    torch.testing.assert_close(head.embed_tokens.weight, other)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@torch.no_grad()
def test_eagle3_layout_loads_and_computes_the_eagle3_equations(tmp_path, fmt):
    target = tiny_target()
    draft_ids = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))[:40].sort().values
    tensors = eagle3_tensors(H, H, VOCAB, draft_ids)
    config = head_config(H, VOCAB, 1, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=40)
    head = load_eagle_head(write_checkpoint(tmp_path / "h", config, tensors, fmt), target)
    assert isinstance(head, Eagle3Head) and head.version == 3 and head.draft_vocab_size == 40
    assert torch.equal(head.head_to_target, draft_ids) and torch.equal(head.t2d, tensors["t2d"])

    # The head reads the inputs of target layers 2, N/2, N-3 -- for N = 4 that is hidden_states[2], [2], [1].
    ids = torch.randint(VOCAB, (1, 5))
    out = target(ids, output_hidden_states=True)
    assert head.target_layer_ids(TARGET_LAYERS) == [2, 2, 1]
    fused_input = torch.cat([out.hidden_states[2], out.hidden_states[2], out.hidden_states[1]], -1)
    want = F.linear(fused_input, tensors["fc.weight"])
    torch.testing.assert_close(head.features_from_target(out.hidden_states), want)

    raw = torch.randn(3 * H)
    got = head_logits_one_token(head, 9, F.linear(raw, head.fc.weight))
    torch.testing.assert_close(got, reference_eagle3_logits(tensors, target, 9, raw))


@torch.no_grad()
def test_eagle3_variants_full_vocab_renamed_layer_and_aux_ids(tmp_path):
    target = tiny_target(layers=6)
    tensors = eagle3_tensors(H, H, VOCAB, None)  # draft vocab == target vocab: no d2t needed
    tensors = {k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}
    config = head_config(H, VOCAB, 1, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 5]})
    head = load_eagle_head(write_checkpoint(tmp_path / "h", config, tensors, "safetensors"), target)
    assert head.version == 3 and torch.equal(head.head_to_target, torch.arange(VOCAB))
    assert head.target_layer_ids(6) == [1, 3, 5]
    torch.testing.assert_close(head.midlayer.hidden_norm.weight, tensors["layers.0.hidden_norm.weight"])


def test_eagle3_with_a_smaller_hidden_size_needs_its_own_embedding(tmp_path):
    target = tiny_target(hidden=48)
    tensors = eagle3_tensors(H, 48, VOCAB, None)
    path = write_checkpoint(tmp_path / "a", head_config(H, VOCAB, 1, draft_vocab_size=VOCAB), tensors)
    with pytest.raises(FrspecError, match="no embedding of its own"):
        load_eagle_head(path, target)
    tensors["embed_tokens.weight"] = torch.randn(VOCAB, H)
    path = write_checkpoint(tmp_path / "b", head_config(H, VOCAB, 1, draft_vocab_size=VOCAB), tensors)
    assert load_eagle_head(path, target).hidden_size == H


# --- refusals ------------------------------------------------------------------------------------------------------


def _eagle3_ckpt(tmp_path, mutate=None, config_extra=None, name="h"):
    tensors = eagle3_tensors(H, H, VOCAB, torch.arange(0, VOCAB, 2))
    if mutate:
        mutate(tensors)
    config = head_config(H, VOCAB, 1, draft_vocab_size=VOCAB // 2, **(config_extra or {}))
    return write_checkpoint(tmp_path / name, config, tensors, "safetensors")


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda p: write_checkpoint(p / "h", head_config(48, VOCAB, 1), eagle2_tensors(48, VOCAB)), "hidden size 32"),
        (lambda p: write_checkpoint(p / "h", head_config(H, 500, 1), eagle2_tensors(H, 500)), "vocabulary of 500"),
        (lambda p: write_checkpoint(p / "h", head_config(H, VOCAB, 1),
                                    eagle2_tensors(H, VOCAB, embed=torch.zeros(300, H))), "embeds 300 tokens"),
        (lambda p: _eagle3_ckpt(p, lambda t: (t.pop("d2t"), t.pop("t2d"))), "no d2t map"),
        (lambda p: _eagle3_ckpt(p, lambda t: t.__setitem__("d2t", t["d2t"] + VOCAB)), "outside the target"),
        (lambda p: _eagle3_ckpt(p, lambda t: t.__setitem__("t2d", torch.ones(7, dtype=torch.bool))), "t2d has 7"),
        (lambda p: _eagle3_ckpt(p, lambda t: t.__setitem__("fc.weight", torch.zeros(H, 2 * H))), "3 x 32"),
        (lambda p: _eagle3_ckpt(p, lambda t: t.pop("midlayer.hidden_norm.weight")), "missing midlayer.hidden_norm"),
        (lambda p: _eagle3_ckpt(p, lambda t: t.__setitem__("extra.weight", torch.zeros(2))), "unexpected extra"),
        (lambda p: _eagle3_ckpt(p, lambda t: t.__setitem__("norm.weight", torch.zeros(5))), "norm.weight has shape"),
        (lambda p: write_checkpoint(p / "h", head_config(H, VOCAB, 1), {"x": torch.zeros(1)}), "no 'fc.weight'"),
    ],
    ids=["hidden", "vocab", "embed-rows", "no-d2t", "d2t-range", "t2d-size", "fc-width", "missing", "unexpected",
         "shape", "not-eagle"],
)
def test_heads_for_another_target_are_refused(tmp_path, make, match):
    with pytest.raises(FrspecError, match=match):
        load_eagle_head(make(tmp_path), tiny_target())


def test_eagle3_needs_three_target_layers(tmp_path):
    with pytest.raises(FrspecError, match="at least 3 layers"):
        load_eagle_head(_eagle3_ckpt(tmp_path), tiny_target(layers=2))


def test_bad_sources_are_refused(tmp_path):
    target = tiny_target()
    with pytest.raises(FrspecError, match="not found"):
        load_eagle_head(tmp_path / "nope", target)
    (tmp_path / "file").write_text("x")
    with pytest.raises(FrspecError, match="is a file"):
        load_eagle_head(tmp_path / "file", target)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FrspecError, match="no config.json"):
        load_eagle_head(tmp_path / "empty", target)
    (tmp_path / "empty" / "config.json").write_text("{not json")
    with pytest.raises(FrspecError, match="not valid JSON"):
        load_eagle_head(tmp_path / "empty", target)
    (tmp_path / "empty" / "config.json").write_text(json.dumps(head_config(H, VOCAB, 1)))
    with pytest.raises(FrspecError, match="no EAGLE weights"):
        load_eagle_head(tmp_path / "empty", target)
    (tmp_path / "empty" / "pytorch_model.bin").write_bytes(b"garbage")
    with pytest.raises(FrspecError, match="cannot read"):
        load_eagle_head(tmp_path / "empty", target)


def test_hub_ids_resolve_through_the_hub_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    repo = tmp_path / "hub" / "models--someone--EAGLE-tiny"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    tensors = eagle2_tensors(H, VOCAB)
    write_checkpoint(repo / "snapshots" / commit, head_config(H, VOCAB, 1), tensors, "safetensors")
    head = load_eagle_head("someone/EAGLE-tiny", tiny_target())
    torch.testing.assert_close(head.fc.weight, tensors["fc.weight"])
    with pytest.raises(FrspecError, match="cannot fetch EAGLE head 'someone/absent'"):
        load_eagle_head("someone/absent", tiny_target())


# --- FR-Spec on the head -------------------------------------------------------------------------------------------


@torch.no_grad()
def test_token_map_restricts_the_shared_lm_head_of_an_eagle2_head(tmp_path):
    target = tiny_target()
    head = load_eagle_head(write_checkpoint(tmp_path / "h", head_config(H, VOCAB, 1), eagle2_tensors(H, VOCAB)), target)
    features = head(torch.tensor([[3, 4]]), torch.randn(1, 2, H), torch.tensor([[0, 1]]))
    full = head.draft_logits(features)
    token_map = TokenMap(torch.tensor([5, 90, 17, 64]), VOCAB)
    vocab = head.draft_vocab(token_map)  # a drafter's own restriction; the head itself is not changed
    assert torch.equal(vocab.target_ids, token_map.ids) and vocab.size == 4
    assert vocab.head.weight.shape == (4, H)  # the LM head now costs k/V of the full one
    torch.testing.assert_close(vocab.logits(head.lm_head_input(features)), full[..., token_map.ids])
    unrestricted = head.draft_vocab(None)
    assert unrestricted.size == VOCAB and torch.equal(unrestricted.logits(head.lm_head_input(features)), full)
    assert head.draft_vocab_size == VOCAB and torch.equal(head.draft_logits(features), full)
    with pytest.raises(FrspecError, match="vocabulary"):
        head.draft_vocab(TokenMap([1, 2], VOCAB + 1))


@torch.no_grad()
def test_token_map_composes_with_eagle3_d2t(tmp_path):
    target = tiny_target()
    draft_ids = torch.arange(0, VOCAB, 2)  # even target ids only
    config = head_config(H, VOCAB, 1, draft_vocab_size=VOCAB // 2)
    head = load_eagle_head(write_checkpoint(tmp_path / "h", config, eagle3_tensors(H, H, VOCAB, draft_ids)), target)
    features = head(torch.tensor([[3]]), torch.randn(1, 1, H), torch.tensor([[0]]))
    full = head.draft_logits(features)[0, 0]
    vocab = head.draft_vocab(TokenMap([10, 11, 4, 13, 100], VOCAB))  # odd ids are not in the draft vocabulary
    assert vocab.target_ids.tolist() == [10, 4, 100]
    torch.testing.assert_close(vocab.logits(head.lm_head_input(features))[0, 0], full[torch.tensor([5, 2, 50])])
    with pytest.raises(FrspecError, match="no token in common"):
        head.draft_vocab(TokenMap([1, 3, 5], VOCAB))


# --- the head under a tree mask, with a filled cache ----------------------------------------------------------------


@pytest.mark.parametrize("version", [2, 3])
@torch.no_grad()
def test_head_tree_forward_matches_per_branch_forwards(tmp_path, version):
    target = tiny_target("qwen2")
    if version == 2:
        ckpt = write_checkpoint(tmp_path / "h", head_config(H, VOCAB, 1, qkv_bias=True),
                                eagle2_tensors(H, VOCAB, qkv_bias=True))
    else:
        ckpt = write_checkpoint(tmp_path / "h", head_config(H, VOCAB, 1, draft_vocab_size=VOCAB),
                                eagle3_tensors(H, H, VOCAB, None))
    head = load_eagle_head(ckpt, target)
    gen = torch.Generator().manual_seed(5)
    prefix_ids, prefix_hidden = torch.randint(VOCAB, (1, 6), generator=gen), torch.randn(1, 6, H, generator=gen)
    tree = TokenTree.from_parents([3, 4, 5, 6, 7, 8], [-1, 0, 0, 1, 1, 3])
    node_hidden = torch.randn(1, len(tree), H, generator=gen)  # what each node is paired with

    cache = head.new_cache()
    head(prefix_ids, prefix_hidden, torch.arange(6)[None], cache=cache)
    got = head(tree.tokens_tensor()[None], node_hidden, tree.position_ids(6), tree.attention_mask(6), cache)
    for node in range(len(tree)):
        path = tree.path_to(node)
        ids = torch.cat([prefix_ids, torch.tensor([[tree.tokens[i] for i in path]])], 1)
        hid = torch.cat([prefix_hidden, node_hidden[:, path]], 1)
        ref = head(ids, hid, torch.arange(ids.shape[1])[None])
        torch.testing.assert_close(got[0, node], ref[0, -1], atol=1e-5, rtol=1e-5)
