"""The ONE place the lossless tests touch frspec's decode API (drafting, verification and the verifier's pieces).

A "step" here is exactly what the engine does once per speculative step, on fixed logits instead of models: draft
(trees with the real `grow_tree`; chains with the real `DraftModelDrafter.propose`, whose base model is replaced by
a stand-in returning the fixed hidden states), then verify with the real verifier, returning the emitted tokens
(accepted drafts, then the target's token).

Chains are trees of width 1 and there is one `verify`, built from the `_residual` and `_sibling_proposal` pieces
that the negative controls replace; the chain's choice of each child is the `add_children` piece, shared with
`grow_tree`.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch
from transformers import DynamicCache

from frspec.decode import draft_model as _draft_model
from frspec.decode import verify as _verify
from frspec.decode.draft_model import DraftModelDrafter
from frspec.decode.drafter import Drafter
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
    """A sampled chain of `depth` drafts after `root`, drafted by DraftModelDrafter's own chain code.

    (EAGLE chains are `grow_tree` with one child per node: the static-tree tests run that loop and `add_children`.)
    """
    drafter = _fixed_hidden_drafter(vocab, hidden_at)
    return drafter.propose(torch.tensor([[root]]), TreeShape.chain(depth), params, gen)


def verify_tree_tokens(tree: TokenTree, target_at: TargetFn, params: SamplingParams,
                       gen: torch.Generator) -> list[int]:
    return _verify.verify(tree, _target_logits(tree, target_at), params, gen).tokens


def verify_chain(draft: TokenTree, target_at: TargetFn, root: int, params: SamplingParams,
                 gen: torch.Generator) -> list[int]:
    return verify_tree_tokens(draft, target_at, params, gen)


# name -> (module, attribute): `residual(p, r)` = normalise(max(p - r, 0)); `sibling_proposal(q_remaining)` =
# q_remaining / q_remaining.sum(), the proposal of the next sampled sibling; `chain_children(tree, parent, logits,
# n, params, generator, vocab)` = the draft-model chain's choice of a node's child (decode/tree_growth.py's
# `add_children`, as draft_model.py calls it).
PIECES = {"residual": (_verify, "_residual"), "sibling_proposal": (_verify, "_sibling_proposal"),
          "chain_children": (_draft_model, "add_children")}

__all__ = ["SamplingParams", "TreeShape", "build_generator", "logits_to_probs", "draft_chain", "verify_chain",
           "draft_tree", "verify_tree_tokens", "PIECES", "ORIGINAL", "replace_piece"]


def _expander(vocab: DraftVocab, hidden_at: HiddenFn):
    def expand(tree: TokenTree, nodes: list[int]) -> torch.Tensor:
        return vocab.logits(torch.stack([hidden_at(tree.depths[n], tree.tokens[n]) for n in nodes]))

    return expand


class _FixedHiddenBase:
    """Stands in for a draft model's base: its i-th forward in a chain returns hidden_at(i, last input token), the
    hidden state the fixed tables give the node at depth i. Ignores the cache (which stays empty)."""

    def __init__(self, hidden_at: HiddenFn):
        self.hidden_at, self.forwards = hidden_at, 0

    def __call__(self, input_ids: torch.Tensor, **_) -> SimpleNamespace:
        hidden = self.hidden_at(self.forwards, int(input_ids[0, -1]))
        self.forwards += 1
        return SimpleNamespace(last_hidden_state=hidden.view(1, 1, -1))


def _fixed_hidden_drafter(vocab: DraftVocab, hidden_at: HiddenFn) -> DraftModelDrafter:
    """A DraftModelDrafter drafting from the fixed tables through `vocab` (which may be any DraftVocab, also an
    EAGLE-3-style head_to_target one the real constructor would not build): its propose/_chain code is unchanged."""
    drafter = DraftModelDrafter.__new__(DraftModelDrafter)
    Drafter.__init__(drafter)
    drafter.vocab, drafter.base, drafter.device = vocab, _FixedHiddenBase(hidden_at), torch.device("cpu")
    drafter.softcap = None  # the fixed tables are the logits: no final soft-capping
    drafter.cache = DynamicCache()
    return drafter


def _target_logits(tree: TokenTree, target_at: TargetFn) -> torch.Tensor:
    return torch.stack([target_at(tree.depths[n], tree.tokens[n]) for n in range(len(tree))])


# --- the verifier's pieces, for negative controls -------------------------------------------------------------------

ORIGINAL = {name: getattr(module, attr) for name, (module, attr) in PIECES.items()}


def replace_piece(name: str, fn: Callable) -> Callable[[], None]:
    """Replace one of the verifier's pieces by `fn`; returns the function that restores it."""
    module, attr = PIECES[name]
    setattr(module, attr, fn)
    return lambda: setattr(module, attr, ORIGINAL[name])


def sample_second_and_third(generator, prompt: list[int], n: int, vocab: int, sampling: dict) -> tuple[np.ndarray, int]:
    """(counts [V, V] of (x2, x3) over n seeded `generate(max_new_tokens=4)` calls, drafts accepted in all): the
    end-to-end tests' sample, whose (x2, x3) a speculative step decides."""
    counts = np.zeros((vocab, vocab), dtype=np.int64)
    accepted = 0
    for seed in range(n):
        out = generator.generate(input_ids=prompt, max_new_tokens=4, eos_token_ids=[],
                                 sampling=SamplingParams(**sampling, seed=seed))
        counts[out.token_ids[1], out.token_ids[2]] += 1
        accepted += sum(out.stats.accepted_per_position)
    return counts, accepted
