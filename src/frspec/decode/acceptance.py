"""What a sampled chain step tells the controller about acceptance: expectations, not coin flips.

When sampling, whether a drafted token is accepted is a coin flip (verify.py: accept x ~ r with probability
min(1, p(x) / r(x))), and the controller's estimate of acceptance (decode/controller.py) built from those flips is
noisy: at temperature 1.0 a few unlucky rejections early in a request are enough to make plain decoding look
better for many steps. But at every chain node the step reached, the target's p and the proposal r are both known,
so the flip's probability itself can be recorded instead of its outcome:

    beta = sum_x min(p(x), r(x))     the probability that the node's drafted child is accepted
    mass = sum_{x in the rows} p(x)  the target's probability inside the rows the child was drafted from

Why these are the controller's counts in expectation (so its estimates keep their meaning with less variance, a
Rao-Blackwellisation): with coin flips, a reached node adds agreed = 1, tried = 1 when its child is accepted, and
agreed = 0, tried = [the token the target then emits is inside the rows] when it is rejected. E[agreed] = beta.
On rejection the target emits from normalise(max(p - r, 0)); r is zero outside the rows, so that residual puts
sum_{x in rows} max(p - r, 0) = mass - beta of its total 1 - beta inside them, and
E[tried] = beta + (1 - beta) * (mass - beta) / (1 - beta) = mass. Which nodes are reached depends only on the
flips of the nodes above, so every reached node's pair has these expectations whatever happened before.

Only chains: with several siblings a node's acceptance depends on the order they are tried in, and the controller
drafts chains. Greedy steps need none of this: there the outcome given the prefix is certain.
"""

from __future__ import annotations

import torch

from frspec.decode.sampling import SamplingParams, logits_to_probs
from frspec.decode.token_tree import TokenTree


def expected_acceptance(
    tree: TokenTree,
    target_logits: torch.Tensor,
    path: list[int],
    sampling: SamplingParams,
    inside: torch.Tensor | None = None,
) -> list[tuple[float, float]] | None:
    """(beta, mass) for each node of the accepted `path` that has a drafted child, root first (module docstring);
    `target_logits` [len(tree), V] are the verified step's, `inside` a bool mask over V of the rows the chain was
    drafted from (None: every token counts as inside, mass 1). None when the step was greedy or is not a chain."""
    return chain_acceptance(tree, target_logits, path, sampling, inside)[0]


def drawn_acceptance(tree: TokenTree, target_logits: torch.Tensor, path: list[int],
                     sampling: SamplingParams) -> list[float] | None:
    """For each node of the accepted `path` that has a drafted child, root first: the probability that this very
    child was accepted, given what was drawn: min(1, p(x) / r(x)) for the child x drafted from r (verify.py's
    test), which for a deterministic child (greedy) is 1 if x is the target's token and 0 if not. What the
    controller's `chain_rule` learns from: how acceptance follows the drafter's confidence in its pick. Unlike
    `expected_acceptance` it is about the drawn token, not the average draw, so it holds for greedy steps too.
    None when the step is not a chain."""
    return chain_acceptance(tree, target_logits, path, sampling)[1]


def chain_acceptance(
    tree: TokenTree,
    target_logits: torch.Tensor,
    path: list[int],
    sampling: SamplingParams,
    inside: torch.Tensor | None = None,
) -> tuple[list[tuple[float, float]] | None, list[float] | None]:
    """Both records of a verified chain step, `expected_acceptance`'s and `drawn_acceptance`'s, from one softmax
    of the target's logits at the reached nodes (the engine needs both after every sampled step)."""
    children = [tree.children(node) for node in path]
    if any(len(c) > 1 for c in children):
        return None, None
    reached = [(node, kids[0]) for node, kids in zip(path, children) if kids]  # the path's last node may be a leaf
    if not reached:
        return (None if sampling.is_greedy else []), []
    rows = target_logits[[node for node, _ in reached]]
    if sampling.is_greedy:  # the outcome given the prefix is certain: only the drawn record
        best = rows.float().argmax(-1).tolist()  # verify.py's greedy token
        return None, [float(tree.tokens[child] == b) for (_, child), b in zip(reached, best)]
    # The controller's estimates, not the verifier's test: float32 probabilities as verify.py computes them, summed
    # in float64, with no float64 copy of the [n, V] rows: 1.1 ms for three nodes over a 152k vocabulary, 1.6 ms
    # with the copies (2-core AMD EPYC, AVX-512).
    probs = logits_to_probs(rows, sampling)
    masses = [1.0] * len(reached) if inside is None else \
        probs.masked_fill(~inside.to(probs.device), 0.0).sum(-1, dtype=torch.float64).tolist()
    expected, drawn = [], []
    for (node, child), p, mass in zip(reached, probs, masses):
        x = tree.tokens[child]
        q = tree.child_probs.get(node)
        if q is None:  # a deterministic child: its proposal is all mass on x
            beta, r = float(p[x]), 1.0
        else:
            q = q.to(device=p.device, dtype=p.dtype)
            total = float(q.sum(dtype=torch.float64))
            beta = float(torch.minimum(p * total, q).sum(dtype=torch.float64)) / total
            r = float(q[x]) / total
        expected.append((min(beta, mass), mass))
        drawn.append(min(1.0, float(p[x]) / r) if r > 0 else 0.0)
    return expected, drawn
