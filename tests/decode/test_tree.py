import math

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from frspec.errors import FrspecError
from frspec.decode.sampling import SamplingParams
from frspec.decode.kv_cache import keep_cache_entries
from frspec.decode.token_tree import TokenTree, check_tree_support
from frspec.decode.tree_growth import grow_tree
from frspec.decode.tree_shape import TreeShape
from frspec.models.attention import additive_mask, causal_mask, check_arbitrary_masks
from frspec.vocab.draft_vocab import DraftVocab

GREEDY = SamplingParams()

#        0 (root 5)
#       / \
#      1   2          tokens 7, 8
#     / \   \
#    3   4   5        tokens 9, 10, 11
#    |
#    6                token 12
PARENTS = [-1, 0, 0, 1, 1, 2, 3]
TOKENS = [5, 7, 8, 9, 10, 11, 12]


def example_tree() -> TokenTree:
    return TokenTree.from_parents(TOKENS, PARENTS)


def test_tree_structure_queries():
    tree = example_tree()
    assert len(tree) == 7 and tree.num_drafts == 6 and tree.max_depth == 3
    assert tree.depths == [0, 1, 1, 2, 2, 2, 3]
    assert tree.children(0) == [1, 2] and tree.children(1) == [3, 4] and tree.children(6) == []
    assert tree.path_to(6) == [0, 1, 3, 6] and tree.path_to(0) == [0]
    anc = tree.ancestor_mask()
    for i in range(len(tree)):
        assert set(torch.nonzero(anc[i]).flatten().tolist()) == set(tree.path_to(i))


def test_chain_is_a_path():
    tree = TokenTree.chain(1, [2, 3, 4])
    assert tree.parents == [-1, 0, 1, 2] and tree.tokens == [1, 2, 3, 4]
    assert torch.equal(tree.attention_mask(0), causal_mask(4, 0))


@pytest.mark.parametrize("tokens, parents", [([1, 2], [0, 0]), ([1, 2, 3], [-1, 2, 0]), ([1], [-1, 0]), ([], [])])
def test_bad_parent_lists_are_refused(tokens, parents):
    with pytest.raises(FrspecError):
        TokenTree.from_parents(tokens, parents)


def test_attention_mask_and_positions():
    tree = example_tree()
    mask = tree.attention_mask(past_len=3)
    assert mask.shape == (1, 1, 7, 10)
    visible = mask[0, 0] == 0
    assert torch.all(visible[:, :3])  # every node sees the committed prefix
    assert visible[6, 3:].nonzero().flatten().tolist() == [0, 1, 3, 6]
    assert visible[5, 3:].nonzero().flatten().tolist() == [0, 2, 5]
    assert torch.all(mask[~(mask == 0)] == float("-inf"))
    assert tree.position_ids(3).tolist() == [[3, 4, 4, 5, 5, 5, 6]]
    # A subset of queries against the nodes a drafter has cached so far, in its cache order.
    sub = tree.attention_mask(past_len=2, query_nodes=[3, 4], key_nodes=[0, 2, 1, 3, 4])
    assert (sub[0, 0] == 0).tolist() == [
        [True, True, True, False, True, True, False],
        [True, True, True, False, True, False, True],
    ]


def test_additive_mask_dtype():
    m = additive_mask(torch.tensor([[True, False]]), dtype=torch.bfloat16)
    assert m.dtype == torch.bfloat16 and m.shape == (1, 1, 1, 2) and m[0, 0, 0, 1] == float("-inf")


def test_tree_shape_kinds_and_limits():
    assert TreeShape.chain(4).kind == "chain" and TreeShape.chain(4).max_drafts == 4
    assert TreeShape.static(3, 2).kind == "static" and TreeShape.static(3, 2).max_drafts == 2 + 4 + 8
    dyn = TreeShape.dynamic(depth=5, topk=4, budget=20)
    assert dyn.kind == "dynamic" and dyn.max_drafts == 20 and "x20" in str(dyn)
    for bad in [dict(depth=0), dict(depth=2, branching=0), dict(depth=2, branching=2, budget=0)]:
        with pytest.raises(FrspecError):
            TreeShape(**bad)
    with pytest.raises(FrspecError, match="static tree"):
        TreeShape.static(8, 8)


# --- growing trees from a fake drafter whose logits are a fixed function of the path -------------------------------

V = 12


def path_logits(path_tokens: tuple[int, ...]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(hash(path_tokens) % (2**31))
    return torch.randn(V, generator=gen) * 2


class FakeDrafter:
    """Remembers which nodes it has 'run' so tests can check parents are always run before their children."""

    def __init__(self):
        self.calls: list[list[int]] = []
        self.seen: set[int] = {0}

    def root_logits(self, root: int) -> torch.Tensor:
        return path_logits((root,))

    def expand(self, tree: TokenTree, nodes: list[int]) -> torch.Tensor:
        for n in nodes:
            assert tree.parents[n] in self.seen, "a node was expanded before its parent"
        self.seen.update(nodes)
        self.calls.append(list(nodes))
        return torch.stack([path_logits(tuple(tree.tokens[i] for i in tree.path_to(n))) for n in nodes])


def test_greedy_chain_follows_the_draft_argmax():
    fake = FakeDrafter()
    tree = grow_tree(3, fake.root_logits(3), TreeShape.chain(4), fake.expand, GREEDY)
    assert tree.parents == [-1, 0, 1, 2, 3]
    for node in range(1, 5):
        parent_path = tuple(tree.tokens[i] for i in tree.path_to(node - 1))
        assert tree.tokens[node] == int(path_logits(parent_path).argmax())
    assert len(fake.calls) == 3  # the last level is never expanded


def test_greedy_static_tree_is_full_and_takes_top_children():
    fake = FakeDrafter()
    tree = grow_tree(3, fake.root_logits(3), TreeShape.static(3, 2), fake.expand, GREEDY)
    assert tree.num_drafts == 2 + 4 + 8
    for node in range(len(tree)):
        kids = tree.children(node)
        if tree.depths[node] < 3:
            parent_path = tuple(tree.tokens[i] for i in tree.path_to(node))
            assert [tree.tokens[k] for k in kids] == torch.topk(path_logits(parent_path), 2).indices.tolist()
        else:
            assert kids == []
    assert [len(c) for c in fake.calls] == [2, 4]


def test_draft_to_target_maps_draft_indices():
    fake = FakeDrafter()
    to_target = torch.arange(V) * 3 + 100
    vocab = DraftVocab.build(torch.zeros(V, 1), head_to_target=to_target, vocab_size=3 * V + 100)
    tree = grow_tree(0, fake.root_logits(0), TreeShape.chain(1), fake.expand, GREEDY, vocab=vocab)
    assert tree.tokens[1] == 100 + 3 * int(fake.root_logits(0).argmax())


@pytest.mark.parametrize("depth, topk, budget", [(4, 3, 10), (3, 2, 100), (5, 4, 7), (1, 3, 2)])
def test_dynamic_tree_keeps_the_best_candidates(depth, topk, budget):
    fake = FakeDrafter()
    tree = grow_tree(3, fake.root_logits(3), TreeShape.dynamic(depth, topk, budget), fake.expand, GREEDY)
    n_candidates = topk + (depth - 1) * topk * topk
    assert tree.num_drafts == min(budget, n_candidates)
    assert all(tree.parents[i] < i for i in range(1, len(tree)))
    assert tree.max_depth <= depth
    # Each level expands the topk best candidates drafted at the previous level.
    assert len(fake.calls) == depth - 1 and all(len(c) == topk for c in fake.calls[1:])
    # Reference: enumerate every candidate the EAGLE-2 procedure drafts and rank them by cumulative log-prob.
    frontier = [((3,), 0.0)]
    candidates = []
    for _ in range(depth):
        level = []
        for path, score in frontier:
            logp = torch.log_softmax(path_logits(path), -1)
            for tok in torch.topk(logp, topk).indices.tolist():
                level.append((path + (tok,), score + float(logp[tok])))
        candidates += level
        frontier = sorted(level, key=lambda c: -c[1])[:topk]
    best = sorted(candidates, key=lambda c: (-c[1], len(c[0])))[:budget]
    kept_paths = sorted(tuple(tree.tokens[i] for i in tree.path_to(n)) for n in range(1, len(tree)))
    assert kept_paths == sorted(p for p, _ in best)


def test_sampled_static_tree_draws_distinct_siblings_and_records_q():
    fake = FakeDrafter()
    params = SamplingParams(temperature=1.0, seed=0)
    to_target = torch.arange(V) + 5
    gen = torch.Generator().manual_seed(0)
    tree = grow_tree(
        1, fake.root_logits(1), TreeShape.static(2, 3), fake.expand, params, gen,
        vocab=DraftVocab.build(torch.zeros(V, 1), head_to_target=to_target, vocab_size=V + 5),
    )
    assert tree.num_drafts == 3 + 9
    for node in range(len(tree)):
        kids = tree.children(node)
        if kids:
            toks = [tree.tokens[k] for k in kids]
            assert len(set(toks)) == len(toks)
            q = tree.child_probs[node]
            assert q.shape == (V + 5,) and torch.all(q[:5] == 0) and math.isclose(float(q.sum()), 1.0, rel_tol=1e-5)
            assert all(q[t] > 0 for t in toks)
    with pytest.raises(ValueError):
        grow_tree(1, fake.root_logits(1), TreeShape.chain(2), fake.expand, params, gen)


def test_sampled_tree_stops_at_a_small_support():
    fake = FakeDrafter()
    params = SamplingParams(temperature=1.0, top_k=2)
    tree = grow_tree(1, fake.root_logits(1), TreeShape.static(1, 5), fake.expand, params, vocab=DraftVocab.build(torch.zeros(V, 1)))
    assert tree.num_drafts == 2


# --- the mask through real HF models, with a filled cache ------------------------------------------------------------


def tiny_llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


def tiny_qwen2():
    torch.manual_seed(1)
    cfg = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return Qwen2ForCausalLM(cfg).eval()


def random_tree(seed: int, n: int, vocab: int) -> TokenTree:
    gen = torch.Generator().manual_seed(seed)
    tree = TokenTree.from_root(int(torch.randint(vocab, (1,), generator=gen)))
    for _ in range(n - 1):
        parent = int(torch.randint(len(tree), (1,), generator=gen))
        tree.add_child(parent, int(torch.randint(vocab, (1,), generator=gen)))
    return tree


@pytest.mark.parametrize("make_model", [tiny_llama, tiny_qwen2], ids=["llama", "qwen2"])
@torch.no_grad()
def test_tree_forward_matches_per_branch_forwards_and_cache_compaction(make_model):
    model = make_model()
    prompt = torch.randint(96, (1, 7), generator=torch.Generator().manual_seed(2))
    tree = random_tree(3, 12, 96)
    cache = DynamicCache()
    model(prompt, cache=cache, use_cache=True)
    past = prompt.shape[1]
    out = model(
        tree.tokens_tensor()[None], cache=cache, use_cache=True,
        attention_mask=tree.attention_mask(past), position_ids=tree.position_ids(past),
    )
    for node in range(len(tree)):
        path = torch.tensor([[tree.tokens[i] for i in tree.path_to(node)]])
        ref = model(torch.cat([prompt, path], 1)).logits[0, -1]
        torch.testing.assert_close(out.logits[0, node], ref, atol=1e-5, rtol=1e-5)

    # Keep only one branch: the cache must equal a fresh one over prompt + that branch.
    deepest = max(range(len(tree)), key=lambda i: tree.depths[i])
    keep = tree.path_to(deepest)
    keep_cache_entries(cache, past, keep)
    fresh = DynamicCache()
    path = torch.tensor([[tree.tokens[i] for i in keep]])
    model(torch.cat([prompt, path], 1), cache=fresh, use_cache=True)
    assert cache.get_seq_length() == past + len(keep)
    for got, want in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=1e-5)
    # ... and decoding goes on from it exactly as from the fresh cache.
    nxt = torch.tensor([[11]])
    a = model(nxt, cache=cache, use_cache=True).logits
    b = model(nxt, cache=fresh, use_cache=True).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_keep_cache_entries_checks_indices():
    cache = DynamicCache()
    cache.update(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4), 0)
    with pytest.raises(ValueError):
        keep_cache_entries(cache, 3, [0, 2])
    keep_cache_entries(cache, 3, [1])
    assert cache.get_seq_length() == 4


def test_tree_support_takes_sliding_windows_and_refuses_other_layers():
    """Sliding-window layers take trees (their own mask: models/attention.layer_masks; Gemma 3 end to end in
    test_gemma3.py); chunked layers and a window on every layer without layer types (Mistral-style) are refused."""
    check_tree_support(tiny_qwen2())
    cfg = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, use_sliding_window=True, sliding_window=8, max_window_layers=0)
    check_tree_support(Qwen2ForCausalLM(cfg), "the target")
    cfg.layer_types = ["chunked_attention", "full_attention"]
    with pytest.raises(FrspecError, match="chunked_attention"):
        check_tree_support(Qwen2ForCausalLM(cfg), "the target")
    from transformers import MistralConfig

    mistral = MistralConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, sliding_window=8)
    with pytest.raises(FrspecError, match="every layer"):
        check_arbitrary_masks(mistral, "the target")
