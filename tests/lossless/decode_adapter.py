"""The ONE place the lossless tests touch frspec's decode API (drafting, verification and the verifier's pieces).

Today that is frspec.spec (spec/verify.py for draft-model chains, spec/tree.py + spec/tree_verify.py for trees);
when the decode redesign lands (frspec.decode: one verifier for chains and trees), only this file changes.

A "step" here is exactly what the engine does once per speculative step, on fixed logits instead of models:
draft (a chain as DraftModelDrafter.propose does, or a tree with the real `grow_tree`), then verify with the real
verifier, returning the emitted tokens (accepted drafts, then the target's token).
"""

from __future__ import annotations

from typing import Callable

import torch

from frspec.spec import tree_verify as _tree_verify
from frspec.spec.drafters import Draft
from frspec.spec.engine import build_generator  # noqa: F401  (re-exported: the end-to-end tests' entry point)
from frspec.spec.sampling import SamplingParams, logits_to_probs, sample
from frspec.spec.tree import TokenTree, TreeShape, grow_tree
from frspec.spec.tree_verify import verify_tree
from frspec.spec.verify import verify_sampling
from frspec.vocab.draft_vocab import DraftVocab

__all__ = ["SamplingParams", "TreeShape", "build_generator", "logits_to_probs"]

# Draft logits at a context: (depth, token) -> hidden state the DraftVocab scores; target logits at a node.
HiddenFn = Callable[[int, int], torch.Tensor]
TargetFn = Callable[[int, int], torch.Tensor]


def draft_chain(root: int, depth: int, vocab: DraftVocab, hidden_at: HiddenFn, params: SamplingParams,
                gen: torch.Generator) -> Draft:
    """A sampled chain of `depth` drafts after `root`, drawn as DraftModelDrafter.propose draws them."""
    indices, probs, token = [], [], root
    for d in range(depth):
        q = logits_to_probs(vocab.logits(hidden_at(d, token))[None], params)
        idx = sample(q, gen)
        probs.append(q)
        indices.append(idx)
        token = int(vocab.to_target(idx))
    index_t = torch.cat(indices)
    return Draft(token_ids=vocab.to_target(index_t), indices=index_t, probs=torch.cat(probs),
                 support=vocab.target_ids)


def verify_chain(draft: Draft, target_at: TargetFn, root: int, params: SamplingParams,
                 gen: torch.Generator) -> list[int]:
    """The engine's chain verification: target probabilities at root and every draft, then verify_sampling."""
    context = [root] + draft.token_ids.tolist()
    logits = torch.stack([target_at(d, tok) for d, tok in enumerate(context)])
    accepted, nxt = verify_sampling(logits_to_probs(logits, params), draft, gen)
    return draft.token_ids[:accepted].tolist() + [nxt]


def draft_tree(root: int, shape: TreeShape, vocab: DraftVocab, hidden_at: HiddenFn, params: SamplingParams,
               gen: torch.Generator) -> TokenTree:
    """The real tree growth (static trees sample children without replacement, dynamic trees take the top-k)."""

    def expand(tree: TokenTree, nodes: list[int]) -> torch.Tensor:
        return vocab.logits(torch.stack([hidden_at(tree.depths[n], tree.tokens[n]) for n in nodes]))

    return grow_tree(root, vocab.logits(hidden_at(0, root)), shape, expand, params, gen,
                     draft_to_target=vocab.target_ids, vocab_size=vocab.vocab_size)


def verify_tree_tokens(tree: TokenTree, target_at: TargetFn, params: SamplingParams,
                       gen: torch.Generator) -> list[int]:
    logits = torch.stack([target_at(tree.depths[n], tree.tokens[n]) for n in range(len(tree))])
    return verify_tree(tree, logits, params, gen).tokens


# --- the verifier's pieces, for negative controls -------------------------------------------------------------------

# name -> (module, attribute): `residual(p, r)` = normalise(max(p - r, 0)); the redesigned verifier adds
# `sibling_proposal(q_remaining)` = q_remaining / q_remaining.sum().
PIECES = {"residual": (_tree_verify, "_residual")}
ORIGINAL = {name: getattr(module, attr) for name, (module, attr) in PIECES.items()}


def replace_piece(name: str, fn: Callable) -> Callable[[], None]:
    """Replace one of the verifier's pieces by `fn`; returns the function that restores it."""
    module, attr = PIECES[name]
    setattr(module, attr, fn)
    return lambda: setattr(module, attr, ORIGINAL[name])
