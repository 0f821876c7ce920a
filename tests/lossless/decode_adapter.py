"""The ONE place the lossless tests touch frspec's decode API (drafting, verification and the verifier's pieces).

A "step" here is exactly what the engine does once per speculative step, on fixed logits instead of models: draft
(with the real tree growth, or for today's draft-model chains as DraftModelDrafter.propose draws them), then verify
with the real verifier, returning the emitted tokens (accepted drafts, then the target's token).

Two halves, chosen by what is installed: `frspec.decode` (the redesign: chains are trees of width 1, one `verify`
with `_residual` and `_sibling_proposal` pieces) and, until it lands, `frspec.spec` (spec/verify.py for draft-model
chains, spec/tree.py + spec/tree_verify.py for trees). Delete the second half once frspec.spec is gone.
"""

from __future__ import annotations

import importlib.util
from typing import Callable

import torch

from frspec.vocab.draft_vocab import DraftVocab

# Draft logits at a context: (depth, token) -> hidden state the DraftVocab scores; target logits at a node.
HiddenFn = Callable[[int, int], torch.Tensor]
TargetFn = Callable[[int, int], torch.Tensor]

REDESIGNED = importlib.util.find_spec("frspec.decode") is not None

if REDESIGNED:
    from frspec.decode import verify as _verify
    from frspec.decode.factory import build_generator
    from frspec.decode.sampling import SamplingParams, logits_to_probs
    from frspec.decode.token_tree import TokenTree
    from frspec.decode.tree_growth import grow_tree
    from frspec.decode.tree_shape import TreeShape

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

else:
    from frspec.spec import tree_verify as _tree_verify
    from frspec.spec.drafters import Draft
    from frspec.spec.engine import build_generator
    from frspec.spec.sampling import SamplingParams, logits_to_probs, sample
    from frspec.spec.tree import TokenTree, TreeShape, grow_tree
    from frspec.spec.tree_verify import verify_tree
    from frspec.spec.verify import verify_sampling

    def draft_tree(root: int, shape: TreeShape, vocab: DraftVocab, hidden_at: HiddenFn, params: SamplingParams,
                   gen: torch.Generator) -> TokenTree:
        """The real tree growth (static trees sample children without replacement, dynamic trees the top-k)."""
        return grow_tree(root, vocab.logits(hidden_at(0, root)), shape, _expander(vocab, hidden_at), params, gen,
                         draft_to_target=vocab.target_ids, vocab_size=vocab.vocab_size)

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

    def verify_tree_tokens(tree: TokenTree, target_at: TargetFn, params: SamplingParams,
                           gen: torch.Generator) -> list[int]:
        return verify_tree(tree, _target_logits(tree, target_at), params, gen).tokens

    PIECES = {"residual": (_tree_verify, "_residual")}

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
