"""Lossless verification of a token tree against the target's outputs at every node.

The target has run once over all tree nodes; row i of its logits is its prediction for the token after node i
(after the path root -> i). Both verifiers walk down from the root and commit the accepted path's drafted tokens
plus one token from the target, so one step always yields at least one token.

Greedy: follow the child whose token is the target's argmax at its parent. The output is token-for-token the
target's greedy output.

Sampling: recursive rejection over siblings. At a node the target distribution is p. Its children x_1, x_2, ...
are tried in drafting order; child i was proposed from distribution r_i:
    r_i = the draft distribution q with x_1..x_{i-1} removed and renormalised, for children sampled from q without
          replacement (chains and static trees under sampling; TokenTree.child_probs holds q);
    r_i = one-hot(x_i) for children chosen deterministically (greedy drafts, EAGLE-2's top-k dynamic trees).
Child i is accepted with probability min(1, p(x_i) / r_i(x_i)); on acceptance we descend into it and start again
with the target's distribution there. On rejection p <- normalise(max(p - r_i, 0)) and the next sibling is tried.
If every child is rejected (or the node is a leaf) one token is sampled from the current p.

Why this is exact: for one proposal x ~ r, "accept with min(1, p/r), else draw from normalise(max(p - r, 0))"
outputs exactly p (the standard speculative sampling lemma). Here the "else" branch is itself the same procedure
one sibling later, with target normalise(max(p - r_i, 0)), which depends only on the siblings before x_i; given
those, x_{i+1} ~ r_{i+1} is a fresh proposal. By induction from the last sibling, the token emitted at a node has
exactly the target's distribution at that node, and descending into an accepted child continues the same argument
for the next position. docs/trees.md has the longer explanation and the tests in tests/spec/test_tree_verify.py
check it statistically.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from frspec.spec.sampling import SamplingParams, logits_to_probs, sample
from frspec.spec.tree import TokenTree


@dataclass
class TreeVerdict:
    """The outcome of verifying one tree.

    path    accepted node indices from the root (path[0] == 0); path[-1] is the deepest accepted node.
    tokens  the tokens to commit: the drafted tokens of path[1:], then one token from the target.
    """

    path: list[int]
    tokens: list[int]

    @property
    def num_accepted(self) -> int:
        """Accepted drafted tokens (the accepted depth); the step commits num_accepted + 1 tokens."""
        return len(self.path) - 1


def verify_tree(
    tree: TokenTree,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> TreeVerdict:
    """Verify `tree` given the target's logits [len(tree), V] at its nodes, greedily or by sampling per `params`."""
    if target_logits.shape[0] != len(tree):
        raise ValueError(f"got target logits for {target_logits.shape[0]} nodes, the tree has {len(tree)}")
    if params.is_greedy:
        return verify_tree_greedy(tree, target_logits)
    return verify_tree_sampling(tree, logits_to_probs(target_logits, params), generator)


def verify_tree_greedy(tree: TokenTree, target_logits: torch.Tensor) -> TreeVerdict:
    """Accept the longest path whose every token is the target's argmax at its parent, plus the argmax after it."""
    best = target_logits.argmax(dim=-1).tolist()
    node, path, tokens = 0, [0], []
    while True:
        child = next((c for c in tree.children(node) if tree.tokens[c] == best[node]), None)
        tokens.append(best[node])
        if child is None:
            return TreeVerdict(path=path, tokens=tokens)
        path.append(child)
        node = child


def verify_tree_sampling(
    tree: TokenTree, target_probs: torch.Tensor, generator: torch.Generator | None = None
) -> TreeVerdict:
    """Recursive rejection over siblings (module docstring); target_probs [len(tree), V] from `logits_to_probs`."""
    node, path, tokens = 0, [0], []
    while True:
        p = target_probs[node].double()
        q = tree.child_probs.get(node)
        q = None if q is None else q.to(device=p.device, dtype=torch.float64).clone()
        accepted = None
        for child in tree.children(node):
            x = tree.tokens[child]
            if q is None:
                r = torch.zeros_like(p)
                r[x] = 1.0
            else:
                r = q / q.sum()
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            if u * float(r[x]) < float(p[x]):
                accepted = child
                break
            p = _residual(p, r)
            if q is not None:
                q[x] = 0.0  # the next sibling was drawn without replacement
        if accepted is None:
            tokens.append(int(sample(p, generator)))
            return TreeVerdict(path=path, tokens=tokens)
        path.append(accepted)
        tokens.append(tree.tokens[accepted])
        node = accepted


def _residual(p: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    res = torch.clamp(p - r, min=0.0)
    total = float(res.sum())
    # total == 0 means p == r, where rejection has probability 0; keeping p is as good as any choice.
    return p if total <= 0.0 else res / total
