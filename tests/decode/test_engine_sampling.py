"""Speculative sampling at temperature 1.0 without filters, by per-position marginals over three generated tokens.

The target has a 16-token vocabulary, so the exact distribution of the i-th generated token (marginalised over
everything before it) is computed by enumerating all prefixes. Generated tokens 1..3 come from one decode step
(drafts at positions 0 and 1, then a correction or the bonus), so their law depends on the acceptance rule; a
chi-square test at fixed seeds compares them.

What this file adds to tests/lossless (which checks every drafter, map and tree shape with filtered sampling, with
stated power and negative controls): plain sampling with no drafter, and FR-Spec at temperature 1.0 with neither
top-k nor top-p, with a map that leaves out the target's most likely tokens. A deliberately wrong rule must fail the
same test.
"""

from __future__ import annotations

import pytest
import torch

import frspec.decode.verify as verify
from frspec.decode.factory import build_generator
from frspec.decode.sampling import SamplingParams, logits_to_probs
from frspec.vocab.token_map import TokenMap

from tests.decode.spec_tiny import noisy_copy, sharpen, tiny_lm

VOCAB = 16
PROMPT = [3, 1, 4]
NEW = 4  # generated token 0 from the prefill, 1..3 from the first decode step
RUNS = 1200
T1 = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def models():
    target = sharpen(tiny_lm("llama", VOCAB, hidden=32, layers=1, seed=0, dtype=torch.float32), 2.0)
    draft = noisy_copy(target, 0.3, seed=1)
    return target, draft


def exact_marginals(model, prompt: list[int], positions: int, params: SamplingParams) -> torch.Tensor:
    """[positions, V]: the probability of each token at each generated position, by enumerating all prefixes."""
    seqs = torch.tensor([prompt])
    weights = torch.ones(1, dtype=torch.float64)
    out = []
    with torch.no_grad():
        for _ in range(positions):
            p = logits_to_probs(model(seqs).logits[:, -1].double(), params).double()
            joint = weights[:, None] * p  # [S, V]
            out.append(joint.sum(0))
            weights = joint.reshape(-1)
            seqs = torch.cat([seqs.repeat_interleave(VOCAB, 0), torch.arange(VOCAB).repeat(len(seqs))[:, None]], 1)
    return torch.stack(out)


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square goodness of fit; cells expected below 5 are pooled."""
    n = counts.sum()
    expected = probs * n
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    keep = exp > 0
    assert bool((obs[~keep] == 0).all()), "a token with probability zero was emitted"
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def sampled_counts(generator, params: SamplingParams) -> tuple[torch.Tensor, object]:
    counts = torch.zeros(NEW, VOCAB, dtype=torch.float64)
    stats = []
    for seed in range(RUNS):
        sampling = SamplingParams(params.temperature, params.top_k, params.top_p, seed=seed)
        out = generator.generate(input_ids=PROMPT, max_new_tokens=NEW, sampling=sampling, eos_token_ids=[])
        assert len(out.token_ids) == NEW
        counts[torch.arange(NEW), torch.tensor(out.token_ids)] += 1
        stats.append(out.stats)
    from frspec.decode.stats import GenerationStats

    return counts, GenerationStats.aggregate(stats)


def min_pvalue(generator, params, target) -> tuple[float, object]:
    exact = exact_marginals(target, PROMPT, NEW, params)
    counts, stats = sampled_counts(generator, params)
    # Position 0 (prefill) is plain sampling; 1..3 are where drafts and the acceptance rule decide.
    return min(chi_square_pvalue(counts[j], exact[j]) for j in range(1, NEW)), stats


def map_without_top_tokens(target, params, n_excluded: int = 4) -> TokenMap:
    exact = exact_marginals(target, PROMPT, NEW, params)[1:].sum(0)
    order = exact.argsort(descending=True).tolist()
    return TokenMap(order[n_excluded : n_excluded + 8], VOCAB)


def test_vanilla_sampling_follows_target(models):
    target, _ = models
    p, stats = min_pvalue(build_generator(target), T1, target)
    assert p > 1e-3 and stats.acceptance_length == 1.0


def test_frspec_sampling_follows_target_even_for_tokens_outside_the_map(models):
    target, draft = models
    token_map = map_without_top_tokens(target, T1)
    p, stats = min_pvalue(build_generator(target, draft, token_map, num_spec_tokens=3), T1, target)
    assert p > 1e-3
    assert 0 < sum(stats.accepted_per_position) < sum(stats.proposed_per_position)


def _wrong_rule_resample_from_p(p, r):
    """Negative control: on rejection sample from p instead of the residual max(p - q, 0)."""
    return p


def test_the_statistical_test_rejects_a_wrong_acceptance_rule(models, monkeypatch):
    """The per-position check (also test_engine_trees.py's and test_context_drafter.py's) at this size fails a wrong
    rule."""
    target, draft = models
    token_map = map_without_top_tokens(target, T1)
    monkeypatch.setattr(verify, "_residual", _wrong_rule_resample_from_p)
    p, _ = min_pvalue(build_generator(target, draft, token_map, num_spec_tokens=3), T1, target)
    assert p < 1e-6


def test_seeded_sampling_is_reproducible(models):
    target, draft = models
    generator = build_generator(target, draft, num_spec_tokens=3)
    params = SamplingParams(temperature=1.0, seed=42)
    a = generator.generate(input_ids=PROMPT, max_new_tokens=30, sampling=params, eos_token_ids=[])
    b = generator.generate(input_ids=PROMPT, max_new_tokens=30, sampling=params, eos_token_ids=[])
    c = generator.generate(input_ids=PROMPT, max_new_tokens=30, sampling=SamplingParams(1.0, seed=43), eos_token_ids=[])
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids
