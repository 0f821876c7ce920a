"""Context-aware drafting (ContextVocab in DraftModelDrafter) is lossless: greedy output is the target's own.

The map leaves out every token the target picks on these prompts, and the target drafts for itself, so with the
static map every draft is rejected (acceptance exactly 1.0), while the context-aware rows hold the prompt's and
the generated tokens: a position whose token occurred before is then drafted right. Identity holds either way.
"""

from __future__ import annotations

import pytest
import torch

from frspec.decode.draft_model import DraftModelDrafter
from frspec.decode.factory import build_generator
from frspec.errors import FrspecError
from frspec.vocab.context_vocab import ContextVocab
from frspec.vocab.token_map import TokenMap

from tests.decode.spec_tiny import hf_greedy, tiny_lm

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


# --- every drafter of the engine: build_generator's context_rows, EAGLE heads, trees, fp32 ------------------------

from tests.decode.eagle_tiny import mostly_bigram, oracle_eagle2_head, oracle_eagle3_head  # noqa: E402
from tests.decode.spec_tiny import noisy_copy  # noqa: E402
from tests.decode.test_engine_sampling import chi_square_pvalue, exact_marginals  # noqa: E402

from frspec.decode.eagle_drafter import EagleDrafter  # noqa: E402
from frspec.decode.sampling import SamplingParams  # noqa: E402
from frspec.decode.tree_shape import TreeShape  # noqa: E402

SHAPES = {"chain": TreeShape.chain(3), "static": TreeShape.static(2, 2), "dynamic": TreeShape.dynamic(3, 3, 8)}
EVEN = torch.arange(0, VOCAB, 2)  # an EAGLE-3 head's own draft vocabulary: the even target ids


@pytest.fixture(scope="module")
def bigram():
    """An fp32 target whose next token depends mostly on the current one (so oracle heads are often right), the
    prompts, its greedy outputs, and a map that lacks every token it picks."""
    target = mostly_bigram(tiny_lm("qwen2", VOCAB, layers=2, seed=0, dtype=torch.float32))
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (4, 9)]
    refs = [hf_greedy(target, p, NEW) for p in prompts]
    picked = {t for r in refs for t in r}
    token_map = TokenMap([i for i in range(VOCAB) if i not in picked][: VOCAB // 2], VOCAB)
    return target, prompts, refs, token_map


def drafter_kwargs(kind: str, target) -> dict:
    if kind == "draft":
        return dict(draft=noisy_copy(target, 0.05, seed=1))
    if kind == "eagle2":
        return dict(eagle=oracle_eagle2_head(target))
    return dict(eagle=oracle_eagle3_head(target, draft_ids=EVEN))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["draft", "eagle2", "eagle3-d2t"])
@pytest.mark.parametrize("budget", ["fixed", "additive"])
def test_every_drafter_with_context_rows_is_lossless_in_fp32(bigram, kind, shape, budget):
    target, prompts, refs, token_map = bigram
    args = drafter_kwargs(kind, target)
    static = build_generator(target, token_map=token_map, tree=SHAPES[shape], **args)
    context = build_generator(target, token_map=token_map, tree=SHAPES[shape], context_rows=48,
                              context_budget=budget, **args)
    assert isinstance(context.drafter.vocab, ContextVocab) and context.drafter.vocab.slots.budget == budget
    assert context.method == static.method  # still FR-Spec (the bench labels the context rows itself)
    accepted = {"static": 0, "context": 0}
    for prompt, ref in zip(prompts, refs):
        for name, generator in (("static", static), ("context", context)):
            out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
            assert out.token_ids == ref, f"{name} {kind} {shape} {budget} prompt={prompt}"
            accepted[name] += sum(out.stats.accepted_per_position)
    assert accepted["static"] == 0  # the map lacks every token the target picks
    if kind != "eagle3-d2t":
        assert accepted["context"] > 0  # the request's rows let the drafter propose them
    assert context.drafter.vocab.context_rows > 0


def test_eagle3_context_rows_are_only_tokens_the_head_can_score(bigram):
    target, _, _, _ = bigram
    head = oracle_eagle3_head(target, draft_ids=EVEN)
    token_map = TokenMap(list(range(0, 40, 2)), VOCAB)
    drafter = EagleDrafter(head, int(target.config.num_hidden_layers), token_map, context_rows=16,
                           context_budget="additive")
    drafter.vocab.begin_request(torch.arange(100, 140))  # 20 even (scorable) and 20 odd ids
    ids = drafter.vocab.target_ids
    assert drafter.vocab.context_rows == 16 and bool((ids % 2 == 0).all())
    assert set(ids[20:].tolist()) <= set(range(100, 140, 2))
    # The rows score exactly what the head's full LM head scores for those target ids.
    hidden = torch.randn(3, target.config.hidden_size)
    full = head.draft_logits(hidden)  # row i is target id EVEN[i]
    torch.testing.assert_close(drafter._logits(hidden), full[:, ids // 2])


@pytest.mark.parametrize("shape", ["chain", "static", "dynamic"])
@pytest.mark.parametrize("kind", ["draft", "eagle2"])
def test_sampled_q_is_zero_outside_the_active_rows(bigram, kind, shape, monkeypatch):
    """Every draft distribution the verifier gets is the drafter's softmax over exactly the rows active when it
    proposed (map and request rows), zero elsewhere, and the request rows do carry mass. (A dynamic tree picks its
    children deterministically and carries no q: its drafted tokens must lie in the active rows.)"""
    target, prompts, _, token_map = bigram
    generator = build_generator(target, token_map=token_map, tree=SHAPES[shape], context_rows=32,
                                **drafter_kwargs(kind, target))
    drafter = generator.drafter
    seen = {"trees": 0, "context_mass": 0.0}
    propose = drafter.propose

    def checked(*a, **kw):
        tree = propose(*a, **kw)
        active = torch.zeros(VOCAB, dtype=torch.bool)
        active[drafter.vocab.target_ids] = True
        request_rows = active.clone()
        request_rows[token_map.ids] = False
        drafted = torch.tensor(tree.tokens[1:])
        assert bool(active[drafted].all())
        seen["context_mass"] += float(request_rows[drafted].sum()) if shape == "dynamic" else 0.0
        assert bool(tree.child_probs) == (shape != "dynamic"), "sampled children carry their q"
        for q in tree.child_probs.values():
            assert float(q[~active].abs().max()) == 0.0
            torch.testing.assert_close(q.sum().double(), torch.tensor(1.0, dtype=torch.float64), atol=1e-5, rtol=0)
            seen["context_mass"] += float(q[request_rows].sum())
        seen["trees"] += 1
        return tree

    monkeypatch.setattr(drafter, "propose", checked)
    for i, prompt in enumerate(prompts):
        generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[],
                           sampling=SamplingParams(temperature=1.0, seed=i))
    assert seen["trees"] > 4 and seen["context_mass"] > 0.5


def test_context_rows_sample_the_target_distribution():
    """Statistical check (chi-square per position, 1,000 runs, 16 tokens, p > 1e-3) that sampling through a
    context-aware drafter follows the target: the map holds half the vocabulary, the request rows the rest."""
    from tests.decode import test_engine_sampling as sampling_tests

    vocab = sampling_tests.VOCAB
    target = mostly_bigram(tiny_lm("llama", vocab, hidden=32, layers=1, seed=0, dtype=torch.float32), 0.3)
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(3.0)
    prompt, new, runs = [3, 1, 4, 9, 12], 4, 1000
    generator = build_generator(target, noisy_copy(target, 0.3, seed=1), TokenMap(list(range(8)), vocab),
                                tree=TreeShape.static(2, 2), context_rows=3, context_budget="fixed")
    params = SamplingParams(temperature=1.0)
    exact = exact_marginals(target, prompt, new, params)
    counts = torch.zeros(new, vocab, dtype=torch.float64)
    for seed in range(runs):
        out = generator.generate(input_ids=prompt, max_new_tokens=new, eos_token_ids=[],
                                 sampling=SamplingParams(1.0, seed=seed))
        counts[torch.arange(new), torch.tensor(out.token_ids)] += 1
    assert min(chi_square_pvalue(counts[j], exact[j]) for j in range(1, new)) > 1e-3


@pytest.mark.parametrize("args, message", [
    (dict(), "give a draft model or an EAGLE head"),
    (dict(draft="model"), "extends a token map"),
    (dict(draft="model", token_map="map", context_budget="both"), "context budget must be one of"),
])
def test_build_generator_refuses_bad_context_options(setup, args, message):
    target = setup[0]
    args = {k: target if v == "model" else setup[3] if v == "map" else v for k, v in args.items()}
    with pytest.raises(FrspecError, match=message):
        build_generator(target, context_rows=args.pop("context_rows", 8), **args)
