"""build_generator: a SpeculativeGenerator for the usual methods, with every check before any weight is copied."""

from __future__ import annotations

import os

import torch

from frspec.decode.draft_model import DraftModelDrafter
from frspec.decode.drafter import Drafter, check_token_map
from frspec.decode.eagle_drafter import EagleDrafter
from frspec.decode.engine import SpeculativeGenerator
from frspec.decode.mtp_drafter import MtpDrafter
from frspec.decode.tree_shape import TreeShape, check_num_spec_tokens
from frspec.errors import FrspecError
from frspec.models.eagle import EagleHead
from frspec.models.eagle_loading import load_eagle_head
from frspec.models.loading import check_same_vocab, vocab_size_of
from frspec.models.mtp import MtpHead
from frspec.vocab.token_map import TokenMap


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
) -> SpeculativeGenerator:
    """A generator for the usual methods: vanilla (no draft), draft model, or draft model + FR-Spec token map;
    or an EAGLE head (a loaded head, or a directory / hub id to load one from), + FR-Spec on the head with a map;
    an MTP head (models/mtp.py `load_mtp_head`) is given as `eagle` too and drafts through an MtpDrafter.

    `tree` drafts token trees (chain, static or dynamic, see TreeShape) instead of num_spec_tokens chains.
    `context_rows` > 0 makes the drafter's vocabulary context-aware (vocab/context_vocab.py): the map's rows plus
    up to that many rows for the request's prompt and accepted tokens, within the map's k rows
    (`context_budget="fixed"`) or added to them ("additive"); it needs a token map and a drafter built here.
    Every check (depth, vocabularies, map size) runs before the drafter's DraftVocab copies any LM-head rows. Models
    and heads are shared, never modified: several generators may draft with one draft model or EAGLE head.
    """
    check_num_spec_tokens(num_spec_tokens)
    context = dict(context_rows=context_rows, context_budget=context_budget)
    if context_rows:
        if draft is None and eagle is None:
            raise FrspecError("context rows extend a drafter's token map: give a draft model or an EAGLE head")
        if isinstance(draft, Drafter):
            raise FrspecError("give the context rows to the drafter itself, not to build_generator")
        if token_map is None:
            raise FrspecError("a context-aware draft vocabulary extends a token map: give one (--token-map)")
    drafter = None
    if eagle is not None:
        if draft is not None:
            raise FrspecError("give a draft model or an EAGLE head, not both")
        if token_map is not None:
            check_token_map(token_map, vocab_size_of(target), "the target model", tokenizer)
        head = eagle if isinstance(eagle, EagleHead) else load_eagle_head(eagle, target)
        # An MTP head (models/mtp.py) is drafted by the same loop; its own class names the method "mtp".
        drafter_cls = MtpDrafter if isinstance(head, MtpHead) else EagleDrafter
        num_layers = int(target.config.get_text_config(decoder=True).num_hidden_layers)
        drafter = drafter_cls(head, num_layers, token_map, **context)
    elif draft is None:
        if token_map is not None:
            raise FrspecError("a token map restricts a drafter's LM head: give a draft model too")
    elif isinstance(draft, Drafter):
        if token_map is not None:
            raise FrspecError("give the token map to the drafter itself, not to build_generator")
        drafter = draft
    else:
        vocab_size = check_same_vocab(target, draft)
        if token_map is not None:
            check_token_map(token_map, vocab_size, "the target model", tokenizer)
        drafter = DraftModelDrafter(draft, token_map, **context)
    return SpeculativeGenerator(target, drafter, tokenizer, num_spec_tokens, tree)
