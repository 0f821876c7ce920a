"""Sampling is lossless: the first two emitted tokens of a speculative step follow the target's joint law exactly.

Fixed logit tables over a 10-token vocabulary (lossless_problem.py), the real drafting (chains by the draft-model
drafter's own `propose`, its base model replaced by the fixed hidden states; trees by `grow_tree`; both choose each
child with tree_growth's `add_children`) and the real verifier (decode_adapter.py), temperature 0.8, top-k 5 and
top-p 0.95 on target and drafter alike. For each shape (chain; static tree, 2 children per node sampled without
replacement; EAGLE-2 dynamic tree, deterministic top-3 children, budget 6) and each draft vocabulary (full; an
FR-Spec map; an EAGLE-3 head_to_target composed with a map) we draw `sample_size` steps (50,419).

Power (lossless_power.py): the reference P(x1, x2) is computed with transformers' logits processors; outcomes it
gives probability 0 must never occur, and the chi-square check at ALPHA = 1e-3 detects any deviation of total
variation >= DETECTED_TV = TARGET_TV = 0.015 with probability >= 0.9 (asserted per test from its sample size and
cell count).

Negative controls: three subtle wrong residual rules, patched into the real tree verifier (static tree), and two
wrong chain rules, patched into the draft-model chain's choice of a child (recording the unfiltered q; recording
the root's q at every node), must fail the same check (same function, same alpha) at fewer samples than the positive
tests draw, each at its size in CONTROLS. The subtle three (unfiltered_q, not_renormalised, chain_unfiltered_q) draw
30,000, 0.6x the positive size: the subtlest of them gave a chi-square of 99 over 24 cells at 40,000 samples, a
noncentrality of about 0.0019 per sample, so at the positive tests' size the check rejects it with probability above
0.9999 (and at 30,000 with 0.978; it does fail, deterministically at seed 11). wrong_sibling and chain_stale_q move
the law far more (chi-square 733 and 1,272 over 24 cells at 10,000 samples, against a critical value of 49.7), so
5,000 samples catch them with certainty.
"""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
import torch

from tests.lossless import decode_adapter as dec
from tests.lossless.decode_adapter import logits_to_probs
from tests.lossless.lossless_power import TARGET_TV, DistributionMismatch, check_distribution
from tests.lossless.lossless_problem import DEPTHS, PARAMS, V, VARIANTS, make_problem
from tests.lossless.lossless_sampling import SCALE, SHAPES, count_first_two, sample_size

DETECTED_TV = TARGET_TV  # the total variation every positive test below detects (power 0.9, alpha 1e-3)
PROBLEM = make_problem(0)


def _count_worker(args):
    method, variant, n, seed, control = args
    torch.set_num_threads(1)
    restore = _apply_control(control, variant) if control else None
    try:
        return count_first_two(PROBLEM, method, variant, n, seed)
    finally:
        if restore:
            restore()


def counts(method: str, variant: str, seed: int, control: str | None = None, n: int | None = None) -> np.ndarray:
    """n (default sample_size(PROBLEM)) steps, split over two processes (fixed seeds per half)."""
    n = sample_size(PROBLEM) if n is None else n
    halves = [(method, variant, n // 2, 2 * seed, control), (method, variant, n - n // 2, 2 * seed + 1, control)]
    with mp.get_context("fork").Pool(2) as pool:
        parts = pool.map(_count_worker, halves)
    return parts[0] + parts[1]


def test_problem_is_hard_enough():
    """The settings really filter: zero cells exist for the target and inside every draft vocabulary."""
    joint = PROBLEM.reference_joint
    assert (joint == 0).sum() > 50 and (joint > 0).sum() >= 20
    for variant in VARIANTS:
        vocab = PROBLEM.draft_vocab(variant)
        q = logits_to_probs(vocab.logits(PROBLEM.hidden_at(0, 0)), PARAMS)
        assert 0 < int((q > 0).sum()) < vocab.size, variant  # draft-side top-k/top-p removes mapped tokens
    # the map leaves out tokens the target emits, so the rejection branch must produce them
    assert joint[[4, 6, 8], :].sum() + joint[:, [4, 6, 8]].sum() > 0.05


@pytest.mark.lossless_heavy
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("method", list(SHAPES))
def test_first_two_tokens_follow_the_target(method, variant):
    c = counts(method, variant, seed=11)
    tv = check_distribution(c, PROBLEM.reference_joint, f"{method}/{variant}")
    if SCALE >= 1:
        assert c.sum() >= sample_size(PROBLEM) and tv <= DETECTED_TV, tv


# --- negative controls ---------------------------------------------------------------------------------------------
# Each replaces a piece of the tree verifier by a subtly wrong one. Residual controls keep acceptance right; the
# draft distribution a residual came from is recovered from its values (the tables are fixed), so they need no other
# hook. Where the verifier has a `sibling_proposal` piece, `not_renormalised` is that bug itself (acceptance too).


def _draft_tables(variant: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(filtered q, unfiltered softmax(logits / T)) over target ids, [DEPTHS * V, V] for every context."""
    vocab = PROBLEM.draft_vocab(variant)
    logits = vocab.logits(torch.stack([PROBLEM.hidden_at(d, t) for d in range(DEPTHS) for t in range(V)]))
    filtered = vocab.to_full(logits_to_probs(logits, PARAMS)).double()
    unfiltered = vocab.to_full(torch.softmax(logits.float() / PARAMS.temperature, -1)).double()
    return filtered, unfiltered


def _apply_control(control: str, variant: str):
    if control.startswith("chain_"):
        return _apply_chain_control(control)
    filtered, unfiltered = _draft_tables(variant)

    def source(r: torch.Tensor) -> tuple[int, torch.Tensor]:
        """(context, removed siblings) of a sibling proposal r = q with earlier siblings removed, renormalised: the
        first context whose q is positive on r's support and, renormalised there, equals r (all contexts at once)."""
        live = r > 0
        q = filtered[:, live]
        renormalised = q / q.sum(-1, keepdim=True).clamp_min(1e-300)
        match = (q > 0).all(-1) & ((renormalised - r[live].double()).abs() <= 1e-6 + 1e-5 * renormalised.abs()).all(-1)
        if not bool(match.any()):
            raise AssertionError("a residual proposal that matches no draft distribution")
        c = int(match.nonzero()[0])
        return c, (filtered[c] > 0) & ~live

    if control == "not_renormalised" and "sibling_proposal" in dec.PIECES:
        return dec.replace_piece("sibling_proposal", lambda q_remaining: q_remaining)  # the bug itself

    def wrong(p: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        c, removed = source(r)
        if control == "unfiltered_q":  # the residual subtracts q before top-k / top-p
            bad = unfiltered[c].masked_fill(removed, 0.0)
            bad = bad / bad.sum()
        elif control == "wrong_sibling":  # a depth-1 node's residual uses its sibling node's draft distribution
            depth, token = divmod(c, V)
            other = filtered[depth * V + (token + 1) % V] if depth > 0 else filtered[c]
            bad = other.masked_fill(removed, 0.0)
            bad = bad / bad.sum() if float(bad.sum()) > 0 else filtered[c] / filtered[c].sum()
        elif control == "not_renormalised":  # earlier siblings removed, the rest not renormalised
            bad = filtered[c].masked_fill(removed, 0.0)
        else:
            raise ValueError(control)
        return dec.ORIGINAL["residual"](p, bad)

    return dec.replace_piece("residual", wrong)


def _apply_chain_control(control: str):
    """Wrong chain rules, patched into the draft-model drafter's choice of a child (the `chain_children` piece): the
    token is still drawn from the filtered q, but the verifier is told another distribution. Since the chain tests
    run DraftModelDrafter's real chain code, these fail only if that code is what the tests run."""

    def wrong_children(tree, parent, logits, n, params, generator, vocab):
        nodes = dec.ORIGINAL["chain_children"](tree, parent, logits, n, params, generator, vocab)
        if control == "chain_unfiltered_q":  # records the draft's q before top-k / top-p
            tree.child_probs[parent] = vocab.to_full(torch.softmax(logits.float() / params.temperature, -1))
        elif control == "chain_stale_q":  # every node records the root's q (a q not updated down the chain)
            tree.child_probs[parent] = tree.child_probs[0]
        else:
            raise ValueError(control)
        return nodes

    return dec.replace_piece("chain_children", wrong_children)


# (shape, wrong rule, samples drawn): the module docstring says why each size catches its rule.
CONTROLS = [("static", "unfiltered_q", 30_000), ("static", "wrong_sibling", 5_000),
            ("static", "not_renormalised", 30_000), ("chain", "chain_unfiltered_q", 30_000),
            ("chain", "chain_stale_q", 5_000)]


@pytest.mark.lossless_heavy
@pytest.mark.parametrize("method,control,n", CONTROLS)
def test_negative_controls_fail_the_same_check(method, control, n):
    if SCALE < 1:
        pytest.skip("a wrong rule is only sure to be caught at full size (FRSPEC_LOSSLESS_SCALE < 1)")
    c = counts(method, "map", seed=11, control=control, n=n)
    with pytest.raises(DistributionMismatch):
        check_distribution(c, PROBLEM.reference_joint, f"{method}/map with {control}")
