"""build_generator: a SpeculativeGenerator for the usual methods, with every check before any weight is copied."""

from __future__ import annotations

import os

import torch

from frspec.decode.draft_model import DraftModelDrafter
from frspec.decode.drafter import Drafter, check_token_map
from frspec.decode.eagle_drafter import EagleDrafter
from frspec.decode.engine import SpeculativeGenerator
from frspec.decode.tree_shape import TreeShape, check_num_spec_tokens
from frspec.errors import FrspecError
from frspec.models.eagle import EagleHead
from frspec.models.eagle_loading import load_eagle_head
from frspec.models.loading import check_same_vocab, vocab_size_of
from frspec.vocab.token_map import TokenMap


def build_drafter(
    target: torch.nn.Module,
    draft: torch.nn.Module | None = None,
    token_map: TokenMap | None = None,
    tokenizer=None,
    eagle: EagleHead | str | os.PathLike | None = None,
    context_rows: int = 0,
    context_budget: str = "fixed",
    head_quant: str | None = None,
) -> Drafter | None:
    """The drafter for `target`: None (vanilla), a draft model's (restricted to `token_map` when given), or an EAGLE
    head's (a loaded head, or a directory / hub id to load one from). Every check (vocabularies, map size, context
    rows) runs before its DraftVocab copies any LM-head rows. `head_quant` quantizes a draft model's drafter head
    (full or FR-Spec pruned) once its rows are selected; EAGLE heads stay float. What build_generator, the bench
    and the tuner draft with."""
    context = dict(context_rows=context_rows, context_budget=context_budget)
    if context_rows:
        if draft is None and eagle is None:
            raise FrspecError("context rows extend a drafter's token map: give a draft model or an EAGLE head")
        if token_map is None:
            raise FrspecError("a context-aware draft vocabulary extends a token map: give one (--token-map)")
    if eagle is not None:
        if draft is not None:
            raise FrspecError("give a draft model or an EAGLE head, not both")
        if token_map is not None:
            check_token_map(token_map, vocab_size_of(target), "the target model", tokenizer)
        head = eagle if isinstance(eagle, EagleHead) else load_eagle_head(eagle, target)
        return EagleDrafter(head, int(target.config.num_hidden_layers), token_map, **context)
    if draft is None:
        if token_map is not None:
            raise FrspecError("a token map restricts a drafter's LM head: give a draft model too")
        return None
    vocab_size = check_same_vocab(target, draft)
    if token_map is not None:
        check_token_map(token_map, vocab_size, "the target model", tokenizer)
    return DraftModelDrafter(draft, token_map, **context, head_quant=head_quant)


def build_generator(
    target: torch.nn.Module,
    draft: torch.nn.Module | Drafter | None = None,
    token_map: TokenMap | None = None,
    num_spec_tokens: int = 4,
    tokenizer=None,
    eagle: EagleHead | str | os.PathLike | None = None,
    tree: TreeShape | None = None,
    context_rows: int = 0,
    context_budget: str = "fixed",
    draft_head_quant: str | None = None,
) -> SpeculativeGenerator:
    """A generator for the usual methods: vanilla (no draft), draft model, or draft model + FR-Spec token map;
    or an EAGLE head (a loaded head, or a directory / hub id to load one from), + FR-Spec on the head with a map;
    or a drafter built already (`build_drafter`), shared by several generators.

    `tree` drafts token trees (chain, static or dynamic, see TreeShape) instead of num_spec_tokens chains.
    `context_rows` > 0 makes the drafter's vocabulary context-aware (vocab/context_vocab.py): the map's rows plus
    up to that many rows for the request's prompt and accepted tokens, within the map's k rows
    (`context_budget="fixed"`) or added to them ("additive"); it needs a token map and a drafter built here.
    `draft_head_quant` quantizes a draft model's drafter head (build_drafter's head_quant).
    Every check (depth, vocabularies, map size) runs before the drafter's DraftVocab copies any LM-head rows. Models
    and heads are shared, never modified: several generators may draft with one draft model or EAGLE head.
    """
    check_num_spec_tokens(num_spec_tokens)
    if isinstance(draft, Drafter):
        if context_rows:
            raise FrspecError("give the context rows to the drafter itself, not to build_generator")
        if eagle is not None:
            raise FrspecError("give a draft model or an EAGLE head, not both")
        if token_map is not None:
            raise FrspecError("give the token map to the drafter itself, not to build_generator")
        drafter = draft
    else:
        drafter = build_drafter(target, draft, token_map, tokenizer, eagle, context_rows, context_budget,
                                draft_head_quant)
    return SpeculativeGenerator(target, drafter, tokenizer, num_spec_tokens, tree)
