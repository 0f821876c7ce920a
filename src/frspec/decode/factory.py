"""build_generator: a SpeculativeGenerator for the usual methods, with every check before any weight is copied."""

from __future__ import annotations

import os

import torch

from frspec.decode.controller import ControllerSettings, default_map_sizes
from frspec.decode.carried_state import CarriedStore, carried_path, carried_tag
from frspec.decode.cost_measure import cached_step_costs
from frspec.decode.draft_model import DraftModelDrafter
from frspec.decode.drafter import Drafter, check_token_map
from frspec.decode.eagle_drafter import EagleDrafter
from frspec.decode.engine import SpeculativeGenerator
from frspec.decode.mtp_drafter import MtpDrafter
from frspec.decode.step_costs import StepCosts
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError
from frspec.models.eagle import EagleHead
from frspec.models.eagle_loading import load_eagle_head
from frspec.models.loading import vocab_size_of
from frspec.models.mtp import MtpHead
from frspec.vocab.ranked_vocab import RankedVocab
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
    token_map_size: int | str | None = None,
) -> Drafter | None:
    """The drafter for `target`: None (vanilla), a draft model's (restricted to `token_map` when given), or an EAGLE
    or MTP head's (a loaded head, or a directory / hub id to load one from; an MTP head, models/mtp.py
    `load_mtp_head`, drafts through an MtpDrafter). The map is checked here, once, against the target that verifies
    its ids and the tokenizer (the drafter's vocabulary then only asserts it fits its head), before any LM-head row
    is copied; whether the drafter's vocabulary is the target's is checked where they meet (SpeculativeGenerator).
    `head_quant` quantizes a draft model's drafter head (full or FR-Spec pruned) once its rows are selected; EAGLE
    heads stay float. `token_map_size`: "auto" ranks the head (one rank-ordered copy serving every size,
    vocab/ranked_vocab.py), an integer takes the map's first N ids (the head's whole size: no map). What
    build_generator, the bench and the tuner draft with."""
    auto_size = bool(_check_map_size(token_map_size, token_map, draft, eagle))
    context = dict(context_rows=context_rows, context_budget=context_budget)
    if context_rows:
        if draft is None and eagle is None:
            raise FrspecError("context rows extend a drafter's token map: give a draft model or an EAGLE head")
        if token_map is None:
            raise FrspecError("a context-aware draft vocabulary extends a token map: give one (--token-map)")
    if eagle is not None and draft is not None:
        raise FrspecError("give a draft model or an EAGLE head, not both")
    if token_map is not None:
        if draft is None and eagle is None:
            raise FrspecError("a token map restricts a drafter's LM head: give a draft model too")
        check_token_map(token_map, vocab_size_of(target), "the target model", tokenizer)
    if eagle is not None:
        head = eagle if isinstance(eagle, EagleHead) else load_eagle_head(eagle, target)
        token_map, ranked = _static_or_ranked(token_map, token_map_size, auto_size, head.draft_vocab_size,
                                              int(head.target_vocab_size))
        # An MTP head (models/mtp.py) is drafted by the same loop; its own class names the method "mtp".
        drafter_cls = MtpDrafter if isinstance(head, MtpHead) else EagleDrafter
        num_layers = int(target.config.get_text_config(decoder=True).num_hidden_layers)
        return drafter_cls(head, num_layers, token_map, **context, ranked=ranked)
    if draft is None:
        return None
    vocab_size = vocab_size_of(draft)
    token_map, ranked = _static_or_ranked(token_map, token_map_size, auto_size, vocab_size, vocab_size)
    return DraftModelDrafter(draft, token_map, **context, ranked=ranked, head_quant=head_quant)


def build_generator(
    target: torch.nn.Module,
    draft: torch.nn.Module | Drafter | None = None,
    token_map: TokenMap | None = None,
    num_spec_tokens: int | str | None = None,
    tokenizer=None,
    eagle: EagleHead | str | os.PathLike | None = None,
    tree: TreeShape | None = None,
    context_rows: int = 0,
    context_budget: str = "fixed",
    token_map_size: int | str | None = None,
    costs: StepCosts | None = None,
    draft_head_quant: str | None = None,
    recalibrate_costs: bool = True,
    carry_between_processes: bool = True,
) -> SpeculativeGenerator:
    """A generator for the usual methods: vanilla (no draft), draft model, or draft model + FR-Spec token map;
    or an EAGLE or MTP head (a loaded head, or a directory / hub id to load one from), + FR-Spec on the head with a
    map; or a drafter built already (`build_drafter`), shared by several generators.

    `tree` is the shape drafted (TreeShape: a chain, a static or a dynamic tree); `num_spec_tokens=k` is the
    Python API's short spelling of `tree=TreeShape.chain(k)`, converted here once (giving both is an error).
    `context_rows` > 0 makes the drafter's vocabulary context-aware (vocab/context_vocab.py): the map's rows plus
    up to that many rows for the request's prompt and accepted tokens, within the map's k rows
    (`context_budget="fixed"`) or added to them ("additive"); it needs a token map and a drafter built here.
    `draft_head_quant` quantizes a draft model's drafter head (build_drafter's head_quant).
    Each input is checked once, where it enters: the shape by TreeShape, the map by build_drafter (before any
    LM-head row is copied), the drafter against the target by SpeculativeGenerator. Models and heads are shared,
    never modified: several generators may draft with one draft model or EAGLE head.

    Automatic choice (decode/controller.py): with a drafter and no shape (neither `tree` nor `num_spec_tokens`, or
    `num_spec_tokens="auto"`), the draft length (0 = plain decoding) is chosen per step, and so is the map size
    unless `token_map_size` is given: the token map is then a frequency ranking and the drafter's head is ranked
    (vocab/ranked_vocab.py), serving every size from one copy. `token_map_size="auto"` chooses the size under an
    explicit shape too; an integer fixes it (the first N ids of the map; the head's full size: no map). The choice
    needs this machine's step costs: `costs` (e.g. from a `frspec tune` config), else they are measured once per
    machine and model pair and cached (decode/cost_measure.py). With `recalibrate_costs` (the default) the
    generator rescales them, after and within requests, from the forwards it times (decode/cost_calibration.py),
    and keeps those timings beside cached costs for the next process; False decides every request by `costs` as
    given (e.g. made-up costs in a test). With `carry_between_processes` (the default) what requests teach the
    controller (acceptance, worth, answer lengths per kind of request) is kept beside cached costs too, so one
    `frspec generate` call goes on from the last (decode/carried_state.py); the bench turns it off, so that a run
    does not start from what an earlier run learnt on the same prompts.
    """
    shape = _shape(num_spec_tokens, tree)
    # Vanilla with num_spec_tokens (its length checked by _shape): nothing drafts it, so one call site can serve
    # every method, as before; a tree given for vanilla is refused by SpeculativeGenerator.
    tree = None if tree is None and draft is None and eagle is None else shape
    auto_length = tree is None  # no shape asked for: the controller chooses the length (with a drafter)
    auto_size = _check_map_size(token_map_size, token_map, draft, eagle)
    if auto_size is None:
        auto_size = auto_length and token_map is not None and token_map_size is None and not context_rows
    fixed_size = None  # a size of a ranked drafter given by the caller, set at the start of every request
    if isinstance(draft, Drafter):
        if context_rows:
            raise FrspecError("give the context rows to the drafter itself, not to build_generator")
        if eagle is not None:
            raise FrspecError("give a draft model or an EAGLE head, not both")
        if token_map is not None:
            raise FrspecError("give the token map to the drafter itself, not to build_generator")
        drafter = draft
        if isinstance(token_map_size, int) and not isinstance(token_map_size, bool):
            if not isinstance(drafter.vocab, RankedVocab):
                raise FrspecError("a map size for a drafter built outside build_generator needs its head ranked")
            fixed_size = token_map_size  # set per request: generators sharing the drafter may use other sizes
    else:
        drafter = build_drafter(target, draft, token_map, tokenizer, eagle, context_rows, context_budget,
                                draft_head_quant, "auto" if auto_size else token_map_size)
    if drafter is None or not (auto_length or auto_size) or (fixed_size is not None and not auto_length):
        return SpeculativeGenerator(target, drafter, tokenizer, tree, map_size=fixed_size)
    vocab = drafter.vocab
    if auto_size and isinstance(vocab, RankedVocab):
        sizes = default_map_sizes(vocab.full_size, vocab.ranked_size)
    else:
        sizes = (vocab.size if fixed_size is None else fixed_size,)
    if auto_length:
        settings = ControllerSettings(sizes=sizes, recalibrate=recalibrate_costs)
    elif tree is not None and tree.kind != "chain":
        settings = ControllerSettings(sizes=sizes, shape=tree, allow_plain=False, recalibrate=recalibrate_costs)
    else:
        # A length the caller gave is drafted whole: only the map size is chosen.
        settings = ControllerSettings(sizes=sizes, depths=(tree.depth,), recalibrate=recalibrate_costs,
                                      stop_early=False)
    if isinstance(vocab, RankedVocab):
        vocab.set_context_floor(settings.sizes[0])  # context rows for tokens beyond the smallest map only
    timings = carried = None
    if costs is None:
        costs, timings = cached_step_costs(target, drafter, settings.sizes, _max_rows(settings), settings.shape)
        if carry_between_processes and timings is not None and timings.path is not None:
            # Kept beside the timings: what earlier processes' requests taught the controller (carried_state.py).
            carried = CarriedStore(carried_path(timings.path), carried_tag(settings, vocab))
    return SpeculativeGenerator(target, drafter, tokenizer, controller=settings, costs=costs, timings=timings,
                                carried=carried)


def _shape(num_spec_tokens: int | str | None, tree: TreeShape | None) -> TreeShape | None:
    """The one spelling of what to draft: `tree`, or `num_spec_tokens` as a chain; None (or "auto"): the
    controller chooses."""
    if num_spec_tokens is None or (isinstance(num_spec_tokens, str) and num_spec_tokens.strip().lower() == "auto"):
        if num_spec_tokens is not None and tree is not None:
            raise FrspecError("num_spec_tokens='auto' lets the controller choose the length: give it or a tree, "
                              "not both")
        return tree
    if isinstance(num_spec_tokens, str):
        raise FrspecError(f"num_spec_tokens must be an integer >= 1 or 'auto', got {num_spec_tokens!r}")
    chain = TreeShape.chain(num_spec_tokens)  # checks the length
    if tree is not None:
        raise FrspecError(f"give num_spec_tokens (a chain) or tree, not both (got {num_spec_tokens} and {tree})")
    return chain


def _max_rows(settings: ControllerSettings) -> int:
    """The most rows a step's target forward can have under `settings`."""
    if settings.shape is not None:
        return settings.shape.max_drafts + 1
    return settings.max_depth + 1


def _check_map_size(token_map_size, token_map: TokenMap | None, draft, eagle) -> bool | None:
    """True for "auto", False for an integer size, None when not given; refuses bad values."""
    if token_map_size is None:
        return None
    if isinstance(token_map_size, str):
        if token_map_size.strip().lower() != "auto":
            raise FrspecError(f"token_map_size must be an integer >= 1 or 'auto', got {token_map_size!r}")
        if draft is None and eagle is None:
            raise FrspecError("a map size restricts a drafter's LM head: give a draft model or an EAGLE head")
        return True
    if isinstance(token_map_size, bool) or not isinstance(token_map_size, int) or token_map_size < 1:
        raise FrspecError(f"token_map_size must be an integer >= 1 or 'auto', got {token_map_size!r}")
    if token_map is None and not isinstance(draft, Drafter):
        raise FrspecError("a map size takes the first N ids of a token map: give one (--token-map)")
    return False


def _static_or_ranked(token_map: TokenMap | None, token_map_size, auto_size: bool, head_rows: int,
                      vocab_size: int) -> tuple[TokenMap | None, bool]:
    """(the map the drafter gets, whether its head is ranked): a ranked head for automatic sizes; for a fixed size
    the map's first N ids (N = the head's whole vocabulary: no map); otherwise the map as given."""
    if token_map is None:
        return None, False
    if auto_size:
        return token_map, True
    if isinstance(token_map_size, int) and not isinstance(token_map_size, bool):
        if token_map_size >= head_rows and token_map_size >= min(vocab_size, head_rows):
            if token_map_size > head_rows:
                raise FrspecError(f"map size {token_map_size} exceeds the drafter's {head_rows}-row head")
            return None, False  # the whole head: no map
        if token_map_size > token_map.k:
            raise FrspecError(f"map size {token_map_size} exceeds the token map's {token_map.k} ids (the head's "
                              f"{head_rows} rows mean no map)")
        return TokenMap(token_map.ids[:token_map_size], token_map.vocab_size, dict(token_map.metadata),
                        None if token_map.counts is None else token_map.counts[:token_map_size]), False
    return token_map, False
