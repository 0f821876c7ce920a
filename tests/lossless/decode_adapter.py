"""The ONE place the lossless tests touch frspec's decode API (drafting, verification and the verifier's pieces).

A "step" here is exactly what the engine does once per speculative step, on fixed logits instead of models: draft
(with the real tree growth, or for today's draft-model chains as DraftModelDrafter.propose draws them), then verify
with the real verifier, returning the emitted tokens (accepted drafts, then the target's token).

Chains are trees of width 1 and there is one `verify`, built from the `_residual` and `_sibling_proposal` pieces
that the negative controls replace.
"""

from __future__ import annotations

from typing import Callable

import torch

from frspec.decode import verify as _verify
from frspec.decode.factory import build_generator
from frspec.decode.sampling import SamplingParams, logits_to_probs
from frspec.decode.token_tree import TokenTree
from frspec.decode.tree_growth import grow_tree
from frspec.decode.tree_shape import TreeShape
from frspec.vocab.draft_vocab import DraftVocab

# Draft logits at a context: (depth, token) -> hidden state the DraftVocab scores; target logits at a node.
HiddenFn = Callable[[int, int], torch.Tensor]
TargetFn = Callable[[int, int], torch.Tensor]


def draft_tree(root: int, shape: TreeShape, vocab: DraftVocab, hidden_at: HiddenFn, params: SamplingParams,
               gen: torch.Generator) -> TokenTree:
    """The real tree growth (static trees sample children without replacement, dynamic trees the top-k)."""
    return grow_tree(root, vocab.logits(hidden_at(0, root)), shape, _expander(vocab, hidden_at), params, gen,
                     vocab=vocab)


def draft_chain(root: int, depth: int, vocab: DraftVocab, hidden_at: HiddenFn, params: SamplingParams,
                gen: torch.Generator) -> TokenTree:
    """A sampled chain of `depth` drafts after `root`: a tree of width 1, as every drafter drafts it."""
    return draft_tree(root, TreeShape.chain(depth), vocab, hidden_at, params, gen)


def verify_tree_tokens(tree: TokenTree, target_at: TargetFn, params: SamplingParams,
                       gen: torch.Generator) -> list[int]:
    return _verify.verify(tree, _target_logits(tree, target_at), params, gen).tokens


def verify_chain(draft: TokenTree, target_at: TargetFn, root: int, params: SamplingParams,
                 gen: torch.Generator) -> list[int]:
    return verify_tree_tokens(draft, target_at, params, gen)


# name -> (module, attribute): `residual(p, r)` = normalise(max(p - r, 0)); `sibling_proposal(q_remaining)` =
# q_remaining / q_remaining.sum(), the proposal of the next sampled sibling.
PIECES = {"residual": (_verify, "_residual"), "sibling_proposal": (_verify, "_sibling_proposal")}

__all__ = ["SamplingParams", "TreeShape", "build_generator", "logits_to_probs", "draft_chain", "verify_chain",
           "draft_tree", "verify_tree_tokens", "PIECES", "ORIGINAL", "replace_piece"]


def _expander(vocab: DraftVocab, hidden_at: HiddenFn):
    def expand(tree: TokenTree, nodes: list[int]) -> torch.Tensor:
        return vocab.logits(torch.stack([hidden_at(tree.depths[n], tree.tokens[n]) for n in nodes]))

    return expand


def _target_logits(tree: TokenTree, target_at: TargetFn) -> torch.Tensor:
    return torch.stack([target_at(tree.depths[n], tree.tokens[n]) for n in range(len(tree))])


# --- the verifier's pieces, for negative controls -------------------------------------------------------------------

ORIGINAL = {name: getattr(module, attr) for name, (module, attr) in PIECES.items()}


def replace_piece(name: str, fn: Callable) -> Callable[[], None]:
    """Replace one of the verifier's pieces by `fn`; returns the function that restores it."""
    module, attr = PIECES[name]
    setattr(module, attr, fn)
    return lambda: setattr(module, attr, ORIGINAL[name])
