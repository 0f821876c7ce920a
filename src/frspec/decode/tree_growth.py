"""Drafting policies: how a drafter's logits grow a token tree of a given shape (decode/tree_shape.py).

  chain    one child per node;
  static   B children per node, every node expanded down to depth D;
  dynamic  EAGLE-2: per level, the `branching` best nodes by cumulative draft log-probability are expanded with
           their top-`branching` children; at the end the `budget` best drafted nodes are kept.

`grow_tree` only decides which tokens become nodes; running the drafter on new nodes is the drafter's `expand`
callback, and mapping its draft indices to target ids is its DraftVocab's.
"""

from __future__ import annotations

from typing import Callable

import torch

from frspec.decode.sampling import SamplingParams, logits_to_probs, sample
from frspec.decode.token_tree import TokenTree
from frspec.decode.tree_shape import TreeShape
from frspec.vocab.draft_vocab import DraftVocab

# expand(tree, nodes) runs the drafter on `nodes` (already in `tree`, their ancestors already seen by the drafter)
# and returns its logits at those nodes, [len(nodes), draft_vocab].
ExpandFn = Callable[[TokenTree, list[int]], torch.Tensor]
# keep_drafting(p) is told, after each token a chain drafts, the draft distribution's probability p of that token
# (`pick_probability`), and answers whether to draft another (decode/controller.py's `chain_rule`; after the
# shape's last token the answer is not needed, but the probability is still told). It sees only what the drafter
# drew, never the target, so a chain cut short is as valid a proposal as any other length.
KeepDrafting = Callable[[float], bool]


def grow_tree(
    root_token: int,
    root_logits: torch.Tensor,
    shape: TreeShape,
    expand: ExpandFn,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    vocab: DraftVocab | None = None,
    keep_drafting: KeepDrafting | None = None,
) -> TokenTree:
    """Grow a draft tree of `shape` from the drafter's logits at the root.

    Draft logits are over the drafter's vocabulary `vocab` (its DraftVocab: draft index -> target id, and the
    scatter of a draft distribution to the target vocabulary); None means draft index == target id, which is only
    enough for deterministic children.

    Greedy params (and every dynamic tree) choose children deterministically: the top-`branching` draft tokens.
    Sampling params on chains and static trees draw children from the draft distribution without replacement,
    recording that distribution (over target ids) in `child_probs` for lossless verification.

    `keep_drafting` (chains only) may end the chain before `shape.depth`.
    """
    tree = TokenTree.from_root(root_token)
    if shape.kind == "dynamic":
        _grow_dynamic(tree, root_logits, shape, expand, params, vocab)
        return tree
    frontier, logits = [0], root_logits.reshape(1, -1)
    for level in range(1, shape.depth + 1):
        new_nodes = []
        for row, parent in enumerate(frontier):
            new_nodes.extend(add_children(tree, parent, logits[row], shape.branching, params, generator, vocab))
        go_on = True
        if keep_drafting is not None and shape.kind == "chain" and new_nodes:
            go_on = keep_drafting(pick_probability(tree, frontier[0], new_nodes[0], logits[0], params))
        if level == shape.depth or not new_nodes or not go_on:
            break
        frontier, logits = new_nodes, expand(tree, new_nodes)
    return tree


def add_children(
    tree: TokenTree,
    parent: int,
    logits: torch.Tensor,
    n: int,
    params: SamplingParams,
    generator: torch.Generator | None,
    vocab: DraftVocab | None,
) -> list[int]:
    """Add `parent`'s children to `tree` from the draft logits at it ([draft_vocab]); returns the new nodes.

    Greedy: the top-n draft tokens. Sampling: n draws without replacement from the draft distribution, which is
    recorded (over target ids) in `tree.child_probs[parent]` for the verifier. The one rule by which chains and
    static trees choose children: the draft-model drafter's chains, which run the model a token at a time instead
    of through `grow_tree`, call it too, so the fixed-logit distribution tests cover both.
    """
    if params.is_greedy:
        picks = _topk_draft(logits, n)
    else:
        if vocab is None:
            raise ValueError("sampled children need the drafter's DraftVocab to record their draft distribution")
        probs = logits_to_probs(logits, params)
        picks = _sample_without_replacement(probs, n, generator)
        tree.child_probs[parent] = vocab.to_full(probs)
    return [tree.add_child(parent, _target_id(idx, vocab)) for idx in picks]


def pick_probability(tree: TokenTree, parent: int, child: int, logits: torch.Tensor, params: SamplingParams
                     ) -> float:
    """The draft distribution's probability of `child`, chosen under `parent` from the draft `logits` by
    `add_children`: the drafter's own confidence in it. Sampled: the recorded distribution at the drawn token;
    greedy: the softmax's maximum, the argmax's probability."""
    if params.is_greedy:
        return float(torch.softmax(logits.float(), dim=-1).max())
    return float(tree.child_probs[parent][tree.tokens[child]])


def _grow_dynamic(tree, root_logits, shape, expand, params, vocab) -> None:
    """EAGLE-2's tree: expand the best nodes per level, then keep the `budget` best of all drafted candidates.

    Candidates live in `tree` as they are drafted (the drafter must see expanded nodes as tree nodes); the final
    selection then rebuilds `tree` in place from the kept nodes, which stay in drafting order, so parents still
    precede children.
    """
    k = shape.branching
    scores = [0.0]
    frontier, logits = [0], root_logits.reshape(1, -1)
    for level in range(1, shape.depth + 1):
        logp = _ranking_logprobs(logits, params)
        cands = []  # (score, parent, draft index)
        for row, parent in enumerate(frontier):
            top = torch.topk(logp[row], min(k, logp.shape[-1]))
            for lp, idx in zip(top.values.tolist(), top.indices.tolist()):
                if lp != float("-inf"):
                    cands.append((scores[parent] + lp, parent, idx))
        new_nodes = []
        for score, parent, idx in cands:
            new_nodes.append(tree.add_child(parent, _target_id(idx, vocab)))
            scores.append(score)
        if level == shape.depth or not new_nodes:
            break
        # Only the k best of the k*k candidates are expanded; the others may still be kept as leaves.
        ranked = sorted(new_nodes, key=lambda i: -scores[i])
        frontier = sorted(ranked[:k])
        logits = expand(tree, frontier)
    _keep_best(tree, scores, shape.budget)


def _keep_best(tree: TokenTree, scores: list[float], budget: int) -> None:
    # Cumulative log-probs never increase down a path, and ties go to the shallower (then earlier) node, so every
    # kept node's parent ranks before it: the kept set is closed under parents.
    order = sorted(range(1, len(tree)), key=lambda i: (-scores[i], tree.depths[i], i))
    kept = sorted(order[:budget])
    new_index = {0: 0}
    old = TokenTree(list(tree.tokens), list(tree.parents), list(tree.depths))
    tree.tokens, tree.parents, tree.depths = [old.tokens[0]], [-1], [0]
    for i in kept:
        if old.parents[i] not in new_index:
            raise AssertionError("dynamic tree selection dropped a kept node's parent")
        new_index[i] = tree.add_child(new_index[old.parents[i]], old.tokens[i])


def _ranking_logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The draft log-probabilities trees are ranked by: the distribution the drafter would sample from."""
    if params.is_greedy:
        return torch.log_softmax(logits.float(), dim=-1)
    return torch.log(logits_to_probs(logits, params))


def _topk_draft(logits: torch.Tensor, k: int) -> list[int]:
    return torch.topk(logits.float(), min(k, logits.shape[-1])).indices.tolist()


def _sample_without_replacement(probs: torch.Tensor, n: int, generator: torch.Generator | None) -> list[int]:
    # Sequential draws, each from the distribution renormalised over what is left: the verifier replays exactly
    # this sequence of proposals. Stops early if the support has fewer than n tokens.
    probs = probs.clone()
    picks = []
    for _ in range(n):
        if float(probs.sum()) <= 0.0:
            break
        idx = int(sample(probs, generator))
        picks.append(idx)
        probs[idx] = 0.0
    return picks


def _target_id(draft_idx: int, vocab: DraftVocab | None) -> int:
    """The target id of a draft index: the vocabulary's own mapping (no vocabulary: the index is the id)."""
    return int(draft_idx) if vocab is None else int(vocab.to_target(draft_idx))
