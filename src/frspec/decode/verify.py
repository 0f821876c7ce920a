"""The one verifier: given the target's logits at every node of a draft tree, decide what is committed.

The target has run once over all tree nodes; row i of its logits is its prediction for the token after node i
(after the path root -> i). Verification walks down from the root and commits the accepted path's drafted tokens
plus one token from the target, so one step always yields at least one token. A chain is a tree of width 1 and a
root-only tree is vanilla decoding: the same rule decides all of them.

Greedy: follow the child whose token is the target's argmax at its parent. The output is token-for-token the
target's greedy output.

Sampling: recursive rejection over siblings. At a node the target distribution is p. Its children x_1, x_2, ...
are tried in drafting order; child i was proposed from distribution r_i:
    r_i = the draft distribution q with x_1..x_{i-1} removed and renormalised, for children sampled from q without
          replacement (`_sibling_proposal`; the node's q is recorded in `TokenTree.child_probs`),
    r_i = the one-hot of x_i, for children chosen deterministically (top-k, argmax).
Child i is accepted with probability min(1, p(x_i) / r_i(x_i)); on acceptance we descend into it and start again
with the target's distribution there. On rejection p <- normalise(max(p - r_i, 0)) (`_residual`) and the next
sibling is tried. If every child is rejected (or the node is a leaf) one token is sampled from the current p.

Why this is exact: for one proposal x ~ r, "accept with min(1, p/r), else draw from normalise(max(p - r, 0))"
outputs exactly p (the standard speculative sampling lemma). Here the "else" branch is itself the same procedure
one sibling later, with target normalise(max(p - r_i, 0)), which depends only on the siblings before x_i; given
those, x_{i+1} ~ r_{i+1} is a fresh proposal. By induction from the last sibling, the token emitted at a node has
exactly the target's distribution at that node, and descending into an accepted child continues the same argument
for the next position. A chain's single child per node makes this plain speculative sampling (Leviathan et al.
2023; Chen et al. 2023). Draft distributions over an FR-Spec map are zero outside it, so the residual keeps all of
p's mass there and tokens the drafter cannot propose are still produced at their rate. docs/trees.md has the
longer explanation; tests/decode/test_tree_verify.py and test_engine_sampling.py check it statistically.

The arithmetic is float64 on the target's device; every random draw passes the generator and that device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from frspec.decode.sampling import SamplingParams, logits_to_probs, sample
from frspec.decode.token_tree import TokenTree


@dataclass
class Verdict:
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


def verify(
    tree: TokenTree,
    target_logits: torch.Tensor,
    sampling: SamplingParams,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Verify `tree` given the target's logits [len(tree), V] at its nodes, greedily or by sampling."""
    if target_logits.shape[0] != len(tree):
        raise ValueError(f"got target logits for {target_logits.shape[0]} nodes, the tree has {len(tree)}")
    if sampling.is_greedy:
        return verify_greedy(tree, target_logits)
    return verify_sampling(tree, logits_to_probs(target_logits, sampling), generator)


def verify_greedy(tree: TokenTree, target_logits: torch.Tensor) -> Verdict:
    """Accept the longest path whose every token is the target's argmax at its parent, plus the argmax after it."""
    best = target_logits.argmax(dim=-1).tolist()
    node, path, tokens = 0, [0], []
    while True:
        child = next((c for c in tree.children(node) if tree.tokens[c] == best[node]), None)
        tokens.append(best[node])
        if child is None:
            return Verdict(path=path, tokens=tokens)
        path.append(child)
        node = child


def verify_sampling(tree: TokenTree, target_probs: torch.Tensor, generator: torch.Generator | None) -> Verdict:
    """Recursive rejection over siblings (module docstring); target_probs [len(tree), V] from `logits_to_probs`."""
    node, path, tokens = 0, [0], []
    while True:
        p = target_probs[node].double()
        q = tree.child_probs.get(node)
        q = None if q is None else q.to(device=p.device, dtype=torch.float64).clone()
        accepted = None
        for child in tree.children(node):
            x = tree.tokens[child]
            r = _one_hot(x, p) if q is None else _sibling_proposal(q)
            u = float(torch.rand((), generator=generator, dtype=torch.float64, device=p.device))
            if u * float(r[x]) < float(p[x]):
                accepted = child
                break
            p = _residual(p, r)
            if q is not None:
                q[x] = 0.0  # the next sibling was drawn without replacement
        if accepted is None:
            tokens.append(int(sample(p, generator)))
            return Verdict(path=path, tokens=tokens)
        path.append(accepted)
        tokens.append(tree.tokens[accepted])
        node = accepted


def _one_hot(x: int, like: torch.Tensor) -> torch.Tensor:
    """The proposal of a deterministically chosen child: all mass on its token."""
    r = torch.zeros_like(like)
    r[x] = 1.0
    return r


def _sibling_proposal(q_remaining: torch.Tensor) -> torch.Tensor:
    """The distribution the next sampled sibling was drawn from: q with the siblings tried before it removed
    (`q_remaining`, zero there), renormalised."""
    return q_remaining / q_remaining.sum()


def _residual(p: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """What is left of the target's p once proposal r was rejected: normalise(max(p - r, 0))."""
    res = torch.clamp(p - r, min=0.0)
    total = float(res.sum())
    # total == 0 means p == r, where rejection has probability 0; keeping p is as good as any choice.
    return p if total <= 0.0 else res / total
