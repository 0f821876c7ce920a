"""Draw many speculative steps on the fixed-logit problem and count the first two emitted tokens."""

from __future__ import annotations

import os

import numpy as np
import torch

from tests.lossless import decode_adapter as dec
from tests.lossless.decode_adapter import TreeShape
from tests.lossless.lossless_power import E2E_TV, samples_for_tv
from tests.lossless.lossless_problem import PARAMS, ROOT, V, Problem

SHAPES = {
    "chain": TreeShape.chain(2),
    "static": TreeShape.static(2, 2),  # 2 siblings per node, sampled without replacement
    "dynamic": TreeShape.dynamic(2, 3, 6),
}

# FRSPEC_LOSSLESS_SCALE < 1 shrinks every sample count (quick local runs); CI uses the full size.
SCALE = float(os.environ.get("FRSPEC_LOSSLESS_SCALE", "1"))


def sample_size(problem: Problem) -> int:
    """Enough that the check detects TV <= TARGET_TV over this problem's possible outcomes (power 0.9)."""
    cells = int((problem.reference_joint > 0).sum())
    return max(int(SCALE * samples_for_tv(cells)), 1000)


def e2e_sample_size(reference: np.ndarray) -> int:
    """Generations an end-to-end test draws: enough that the check detects TV <= E2E_TV over the reference's
    possible outcomes (power 0.9)."""
    return max(int(SCALE * samples_for_tv(int((reference > 0).sum()), E2E_TV)), 300)


@torch.inference_mode()
def count_first_two(problem: Problem, method: str, variant: str, n: int, seed: int) -> np.ndarray:
    """Counts [V, V] of (x1, x2) over n independent steps from ROOT.

    When a step emits only x1, x2 is drawn from the reference P(x2 | x1): that is what the next step must produce,
    and it keeps the check on this step's own verification (the next step is the same procedure at another root).
    """
    vocab = problem.draft_vocab(variant)
    gen = torch.Generator().manual_seed(seed)
    shape = SHAPES[method]
    fixed_tree = None
    if method == "dynamic":  # deterministic children: the same tree every step, grown once (and checked so)
        fixed_tree = dec.draft_tree(ROOT, shape, vocab, problem.hidden_at, PARAMS, gen)
        again = dec.draft_tree(ROOT, shape, vocab, problem.hidden_at, PARAMS, gen)
        assert (fixed_tree.tokens, fixed_tree.parents) == (again.tokens, again.parents)
    first = np.empty(n, dtype=np.int64)
    second = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        if method == "chain":
            draft = dec.draft_chain(ROOT, shape.depth, vocab, problem.hidden_at, PARAMS, gen)
            tokens = dec.verify_chain(draft, problem.target_at, ROOT, PARAMS, gen)
        else:
            tree = fixed_tree or dec.draft_tree(ROOT, shape, vocab, problem.hidden_at, PARAMS, gen)
            tokens = dec.verify_tree_tokens(tree, problem.target_at, PARAMS, gen)
        first[i] = tokens[0]
        if len(tokens) > 1:
            second[i] = tokens[1]
    rng = np.random.default_rng(seed)
    missing = second < 0
    cdf = problem.reference_second.cumsum(-1)
    u = rng.random(int(missing.sum()))
    rows = cdf[first[missing]]
    second[missing] = np.minimum((u[:, None] > rows).sum(-1), V - 1)
    counts = np.zeros((V, V), dtype=np.int64)
    np.add.at(counts, (first, second), 1)
    return counts
