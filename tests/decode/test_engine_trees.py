"""The engine with token trees and EAGLE heads: lossless, caches in step, no extra target forwards."""

from __future__ import annotations

import json
from itertools import zip_longest

import pytest
import torch
from safetensors.torch import save_file

from frspec import cli
from frspec.errors import FrspecError
from frspec.decode.kv_cache import cache_length, new_cache
from frspec.decode.factory import build_generator
from frspec.decode.step import decode_step, prefill, start_state
from frspec.decode.sampling import SamplingParams
from frspec.decode.stats import GenerationStats
from frspec.decode.tree_shape import TreeShape
from frspec.vocab.token_map import TokenMap

from tests.decode.eagle_tiny import mostly_bigram, oracle_eagle2_checkpoint, oracle_eagle2_head, oracle_eagle3_head
from tests.decode.spec_tiny import hf_greedy, noisy_copy, sharpen, tiny_lm, tiny_tokenizer
from tests.decode.test_engine_sampling import chi_square_pvalue, exact_marginals

VOCAB = 256
PROMPT = [5, 17, 99, 3, 42, 8]
SHAPES = {
    "chain": TreeShape.chain(3),
    "static": TreeShape.static(2, 2),
    "dynamic": TreeShape.dynamic(depth=3, topk=3, budget=8),
}


def half_map(seed: int = 0) -> TokenMap:
    return TokenMap(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))[: VOCAB // 2], VOCAB)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def target(request):
    return mostly_bigram(tiny_lm(request.param, VOCAB, layers=2, seed=0))


def drafter_args(kind: str, target) -> dict:
    """build_generator keyword arguments for each kind of drafter (a noisy draft model, or oracle EAGLE heads)."""
    if kind.startswith("draft"):
        args = dict(draft=noisy_copy(target, 0.05, seed=1))
    elif kind.startswith("eagle2"):
        args = dict(eagle=oracle_eagle2_head(target))
    elif kind.startswith("eagle3-d2t"):
        args = dict(eagle=oracle_eagle3_head(target, draft_ids=torch.arange(0, VOCAB, 2)))
    else:
        args = dict(eagle=oracle_eagle3_head(target))
    if kind.endswith("+map"):
        args["token_map"] = half_map()
    return args


KINDS = ["draft", "draft+map", "eagle2", "eagle2+map", "eagle3", "eagle3-d2t", "eagle3-d2t+map"]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_identity_with_trees(target, kind, shape):
    generator = build_generator(target, tree=SHAPES[shape], **drafter_args(kind, target))
    out = generator.generate(input_ids=PROMPT, max_new_tokens=24, eos_token_ids=[])
    assert out.token_ids == hf_greedy(target, PROMPT, 24)
    s = out.stats
    assert s.tree == str(SHAPES[shape]) and s.num_spec_tokens == SHAPES[shape].depth
    # Every step emits its accepted drafts plus one token.
    assert sum(m * c for m, c in enumerate(s.accepted_depth_histogram)) + s.target_forwards == s.decode_tokens
    assert s.draft_tokens >= sum(s.proposed_per_position) and s.draft_steps > 0
    assert generator.method == expected_method(kind)


def expected_method(kind: str) -> str:
    if kind.startswith("draft"):
        return "fr-spec" if kind.endswith("+map") else "draft"
    return "eagle+fr-spec" if kind.endswith("+map") else "eagle"


def test_oracle_heads_get_drafts_accepted(target):
    # Greedy identity alone holds for a drafter that is never right; make sure the accept paths ran too.
    for kind in ("draft", "eagle2", "eagle3"):
        generator = build_generator(target, tree=SHAPES["dynamic"], **drafter_args(kind, target))
        stats = generator.generate(input_ids=PROMPT, max_new_tokens=40, eos_token_ids=[]).stats
        assert stats.acceptance_length > 1.3, (kind, stats.accepted_depth_histogram)
        assert len(stats.accepted_depth_histogram) >= 3  # some step accepted two drafts or more


@pytest.mark.parametrize("shape", ["chain", "static", "dynamic"])
def test_target_as_its_own_draft_accepts_the_whole_depth(shape):
    # Peaked distributions: EAGLE-2's budget keeps the likeliest paths, which must then be the greedy ones.
    target = sharpen(tiny_lm("llama", VOCAB, seed=3), 10.0)
    tree = SHAPES[shape]
    new_tokens = 1 + 8 * (tree.depth + 1)  # the prefill's token, then 8 steps that each accept the whole depth
    generator = build_generator(target, target, tree=tree)
    out = generator.generate(input_ids=PROMPT, max_new_tokens=new_tokens, eos_token_ids=[])
    assert out.token_ids == hf_greedy(target, PROMPT, new_tokens)
    hist = out.stats.accepted_depth_histogram
    assert hist[tree.depth] == 8 and sum(hist) == 8 and out.stats.target_forwards == 8


def test_eagle_chain_is_the_default_and_stats_add_up():
    target = mostly_bigram(tiny_lm("llama", VOCAB, seed=0))
    generator = build_generator(target, eagle=oracle_eagle2_head(target), num_spec_tokens=2)
    assert generator.shape == TreeShape.chain(2) and generator.method == "eagle"
    a = generator.generate(input_ids=PROMPT, max_new_tokens=10, eos_token_ids=[]).stats
    b = generator.generate(input_ids=PROMPT[:3], max_new_tokens=10, eos_token_ids=[]).stats
    total = GenerationStats.aggregate([a, b])
    assert total.tree == "chain-2" and total.draft_tokens == a.draft_tokens + b.draft_tokens
    pairs = zip_longest(a.accepted_depth_histogram, b.accepted_depth_histogram, fillvalue=0)
    assert total.accepted_depth_histogram == [x + y for x, y in pairs]
    assert "tree chain-2" in total.summary() and json.dumps(total.to_dict())


# --- caches after tree steps, and the target's hidden states reach the head without extra forwards ------------------


def _fresh_cache(model, ids):
    cache = new_cache(model)
    with torch.no_grad():
        model(input_ids=ids, cache=cache, use_cache=True)
    return cache


def _assert_same_cache(got, want):
    assert len(got.layers) == len(want.layers)
    for a, b in zip(got.layers, want.layers):
        torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=1e-10)
        torch.testing.assert_close(a.values, b.values, rtol=0, atol=1e-10)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=1.0, seed=3)], ids=["greedy", "t1"])
@pytest.mark.parametrize("kind", ["draft+map", "eagle2", "eagle3-d2t+map"])
def test_caches_after_tree_steps_equal_fresh_forwards(kind, sampling):
    target = mostly_bigram(tiny_lm("qwen2", VOCAB, seed=0))
    generator = build_generator(target, tree=SHAPES["static"], **drafter_args(kind, target))
    calls = []
    hook = target.register_forward_hook(lambda *a: calls.append(1))
    # The engine's own step functions, one at a time, so the caches can be read between steps.
    generator.drafter.reset()
    req = start_state(target, PROMPT, 40, sampling)
    with torch.inference_mode():
        prefill(target, generator.drafter, req, generator.hidden_layers)
    assert len(calls) == 1
    rejections = 0
    while req.length < len(PROMPT) + 30:
        before = len(calls)
        with torch.inference_mode():
            new = decode_step(target, generator.drafter, req, generator.shape, generator.hidden_layers, 40).tokens
        # One target forward per step: the head's hidden states come with the verification forward.
        assert len(calls) == before + 1
        rejections += len(new) < 3
        accepted = req.buf[:, : req.length]
        # The target cache holds the accepted tokens but the pending one, as if they had been run alone.
        assert cache_length(req.cache) == req.length - 1
        _assert_same_cache(req.cache, _fresh_cache(target, accepted[:, :-1]))
        drafter = generator.drafter
        if kind.startswith("draft"):
            n = cache_length(drafter.cache)
            assert n <= req.length - 1
            _assert_same_cache(drafter.cache, _fresh_cache(drafter.model, accepted[:, :n]))
        else:
            # The head's cache holds pairs (x_{t+1}, h_t) for t < n, h from the target's tree forwards; they
            # must equal the pairs built from one fresh target forward over the accepted tokens.
            n = cache_length(drafter.cache)
            assert n <= req.length - 2
            with torch.no_grad():
                out = target(accepted[:, : n], output_hidden_states=True)
                fresh = drafter.head.new_cache()
                drafter.head(accepted[:, 1 : n + 1], drafter.head.features_from_target(out.hidden_states),
                             torch.arange(n)[None], cache=fresh)
            _assert_same_cache(drafter.cache, fresh)
    hook.remove()
    assert rejections > 0


# --- sampling on trees, end to end ---------------------------------------------------------------------------------

SMALL_VOCAB, SMALL_PROMPT, NEW, RUNS = 16, [3, 1, 4], 4, 1000
T1 = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def small():
    target = mostly_bigram(tiny_lm("llama", SMALL_VOCAB, hidden=32, layers=1, seed=0, dtype=torch.float32), 0.3)
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(3.0)  # peaked next-token distributions
    return target


def _min_pvalue(generator, params, target) -> tuple[float, GenerationStats]:
    exact = exact_marginals(target, SMALL_PROMPT, NEW, params)
    counts = torch.zeros(NEW, SMALL_VOCAB, dtype=torch.float64)
    stats = []
    for seed in range(RUNS):
        sampling = SamplingParams(params.temperature, params.top_k, params.top_p, seed=seed)
        out = generator.generate(input_ids=SMALL_PROMPT, max_new_tokens=NEW, sampling=sampling, eos_token_ids=[])
        counts[torch.arange(NEW), torch.tensor(out.token_ids)] += 1
        stats.append(out.stats)
    return min(chi_square_pvalue(counts[j], exact[j]) for j in range(1, NEW)), GenerationStats.aggregate(stats)


def test_eagle2_tree_sampling_follows_the_target_end_to_end(small):
    """An EAGLE-2 head's static tree, sampled at temperature 1.0 (tests/lossless checks draft-model and EAGLE-3
    trees with filtered sampling, with stated power and negative controls)."""
    generator = build_generator(small, tree=TreeShape.static(2, 3), eagle=oracle_eagle2_head(small))
    p, stats = _min_pvalue(generator, T1, small)
    assert p > 1e-3
    hist = stats.accepted_depth_histogram
    assert hist[0] > 0 and sum(hist[1:]) > 0  # rejections and acceptances both happened


# --- refusals and the CLI ------------------------------------------------------------------------------------------


def test_bad_tree_and_eagle_combinations_are_refused():
    target = mostly_bigram(tiny_lm("llama", VOCAB, seed=0))
    head = oracle_eagle2_head(target)
    with pytest.raises(FrspecError, match="not both"):
        build_generator(target, target, eagle=head)
    with pytest.raises(FrspecError, match="drafter"):
        build_generator(target, tree=TreeShape.chain(2))
    with pytest.raises(FrspecError, match="vocabulary"):
        build_generator(target, eagle=head, token_map=TokenMap([1, 2], VOCAB + 1))
    chunked = tiny_lm("qwen2", VOCAB, seed=0)  # sliding windows take trees (test_gemma3.py); chunked layers do not
    chunked.config.layer_types = ["chunked_attention", "full_attention"]
    with pytest.raises(FrspecError, match="chunked_attention"):
        build_generator(chunked, target, tree=TreeShape.static(2, 2))


@pytest.fixture(scope="module")
def cli_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle_cli")
    tok = tiny_tokenizer()
    target = mostly_bigram(tiny_lm("llama", len(tok), seed=0, dtype=torch.float32))
    target.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    config, state = oracle_eagle2_checkpoint(target)
    (root / "head").mkdir()
    (root / "head" / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in state.items()}, str(root / "head" / "model.safetensors"))
    TokenMap(list(range(40)), len(tok)).save(root / "map.frspec")
    return root


def _run(argv, capsys):
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_with_eagle_and_trees(cli_dirs, capsys):
    base = ["generate", "--target", str(cli_dirs / "target"), "--prompt", "hello", "--max-new-tokens", "12",
            "--dtype", "fp32", "--json", "--threads", "1", "--raw"]
    code, out, err = _run(base, capsys)
    assert code == 0, err
    vanilla = json.loads(out)
    runs = [
        (["--eagle", str(cli_dirs / "head"), "--tree-depth", "3", "--tree-branching", "2", "--tree-budget", "6"],
         "eagle", "dynamic-3x2x6"),
        (["--eagle", str(cli_dirs / "head"), "--token-map", str(cli_dirs / "map.frspec"), "--tree-depth", "2",
          "--tree-branching", "2"], "eagle+fr-spec", "static-2x2"),
        (["--eagle", str(cli_dirs / "head"), "--num-spec-tokens", "3"], "eagle", "chain-3"),
        (["--draft", str(cli_dirs / "target"), "--tree-depth", "2"], "draft", "chain-2"),
    ]
    for extra, method, tree in runs:
        code, out, err = _run(base + extra, capsys)
        assert code == 0, err
        record = json.loads(out)
        assert record["method"] == method and record["token_ids"] == vanilla["token_ids"]  # lossless
        assert record["stats"]["tree"] == tree and sum(record["stats"]["accepted_depth_histogram"]) > 0
    streaming = [a for a in base if a != "--json"]
    code, out, err = _run(streaming + ["--eagle", str(cli_dirs / "head"), "--tree-depth", "2"], capsys)
    assert code == 0 and "[eagle]" in err and "tree chain-2" in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tree-depth", "2"], "--draft or --eagle"),
        (["--eagle", "HEAD", "--tree-budget", "5", "--tree-depth", "2"], "--tree-branching"),
        (["--eagle", "HEAD", "--tree-branching", "2"], "--tree-depth"),
        (["--eagle", "HEAD", "--draft", "x"], "give --draft or --eagle, not both"),
        (["--eagle", "HEAD", "--tree-depth", "0"], "depth"),
        (["--eagle", "/no/such/head"], "EAGLE head not found"),
    ],
)
def test_generate_refuses_bad_tree_options(cli_dirs, capsys, extra, message):
    extra = [str(cli_dirs / "head") if x == "HEAD" else x for x in extra]
    code, out, err = _run(["generate", "--target", str(cli_dirs / "target"), "--prompt", "x", "--dtype", "fp32"]
                          + extra, capsys)
    assert code == 2 and err.startswith("frspec: error:") and message in err and err.count("\n") == 1


def test_generators_sharing_one_head_each_draft_with_their_own_map(target):
    head = oracle_eagle2_head(target)
    weight = head.lm_head.weight
    before = weight.detach().clone()
    token_map = half_map()
    mapped = build_generator(target, eagle=head, token_map=token_map, tree=SHAPES["chain"])
    plain = build_generator(target, eagle=head, tree=SHAPES["chain"])  # the same head, no map
    expected = hf_greedy(target, PROMPT, 16)
    for generator, active in ((mapped, token_map), (plain, None), (mapped, token_map)):
        assert generator.generate(input_ids=PROMPT, max_new_tokens=16, eos_token_ids=[]).token_ids == expected
        assert generator.drafter.token_map is active
        assert generator.drafter.vocab.size == (VOCAB // 2 if active is not None else VOCAB)
    # Drafting never touched the shared head: same LM-head tensor, same values, no restriction of its own.
    assert head.lm_head.weight is weight and torch.equal(weight, before)
    assert plain.drafter.vocab.head.weight.data_ptr() == weight.data_ptr()  # unrestricted: used without a copy
    assert torch.equal(head.head_to_target, torch.arange(VOCAB))


def test_generators_sharing_one_draft_model_each_draft_with_their_own_map(target):
    draft = noisy_copy(target, 0.3, seed=1)
    state = {k: v.clone() for k, v in draft.state_dict().items()}
    token_map = half_map()
    mapped = build_generator(target, draft, token_map, tree=SHAPES["static"])
    plain = build_generator(target, draft, num_spec_tokens=3)
    expected = hf_greedy(target, PROMPT, 16)
    for generator in (mapped, plain, mapped):
        assert generator.generate(input_ids=PROMPT, max_new_tokens=16, eos_token_ids=[]).token_ids == expected
    assert mapped.drafter.vocab.size == VOCAB // 2 and plain.drafter.vocab.size == VOCAB
    assert all(torch.equal(v, state[k]) for k, v in draft.state_dict().items())