"""The drafter interface: what proposes tokens for the target to verify.

A drafter sees the accepted context and proposes a token tree (a chain is a tree of width 1); the engine verifies
it and then tells the drafter how much of the context survived (`rollback`). The drafter never decides acceptance
and never sees the target's logits. Life cycle per request: reset -> prefill -> (propose -> rollback)*.

Each drafter owns its DraftVocab (frspec/vocab/draft_vocab.py): the target ids it can propose and its LM head
restricted to them (FR-Spec). Nothing a drafter does modifies the model or head it drafts with, so generators may
share one. Drafters that read the target's hidden states (EAGLE, eagle_drafter.py) name them in
`target_hidden_layers` and receive them through `observe_target`.
"""

from __future__ import annotations

import torch

from frspec.decode.sampling import SamplingParams
from frspec.decode.timing import now
from frspec.decode.token_tree import TokenTree
from frspec.decode.tree_growth import KeepDrafting
from frspec.decode.tree_shape import TreeShape
from frspec.models import one_row_linear
from frspec.vocab.tokenizer_identity import tokenizer_identity
from frspec.vocab.draft_vocab import DraftVocab
from frspec.vocab.token_map import TokenMap


class Drafter:
    """The interface between the engine and anything that drafts.

    `propose(context, shape, ...)` gets the full accepted sequence [1, length] (prompt and generated tokens, ending
    with the token the target has not processed yet, the tree's root); a drafter feeds itself whatever suffix its
    own cache lacks. Subclasses keep the counters up to date: `time_s` (time spent in `propose`), `lm_head_time_s`
    (the vocabulary-sized part of it) and `steps` (drafter forwards in `propose`).
    """

    vocab: DraftVocab  # what it can propose: its (possibly FR-Spec restricted) LM head and draft index -> target id
    # Indices into the target's `hidden_states` output that the drafter reads (None: it reads none). The engine
    # then asks the target for them in every forward and hands them over through `observe_target`.
    target_hidden_layers: list[int] | None = None
    device: torch.device  # where proposals are computed; must be the target's device
    # Windows of a long prompt `prefill` can read instead of all of it, longest first (a draft model's own cache:
    # draft_model.py); none for drafters that read the target's states at every position (EAGLE, MTP).
    prompt_windows: tuple[int, ...] = ()
    # Whether `prefill` may run after plain steps, over the prompt and the tokens they emitted (a draft model reads
    # tokens only); EAGLE and MTP heads read the target's states at the prompt's positions, handed over only in the
    # target's prefill.
    late_prefill: bool = False
    # Prompt tokens this request's prefill left out of the drafter's own context (a window): its forwards run that
    # many positions short of the target's.
    skipped: int = 0

    def __init__(self) -> None:
        self.time_s = 0.0
        self.lm_head_time_s = 0.0
        self.steps = 0

    @property
    def vocab_size(self) -> int:
        """The target vocabulary the proposed ids belong to; must equal the target's."""
        return self.vocab.vocab_size

    @property
    def token_map(self) -> TokenMap | None:
        """The FR-Spec map restricting this drafter's LM head (None: its full vocabulary)."""
        return self.vocab.token_map

    @property
    def kind(self) -> str:
        """What drafts: "draft" (an independent draft model), "eagle" (an EAGLE head on the target's states) or
        "mtp" (the target checkpoint's MTP layers)."""
        raise NotImplementedError

    @property
    def weights(self) -> torch.nn.Module:
        """The module whose weights draft (the draft model, or the EAGLE/MTP head): what a cost cache is keyed on."""
        raise NotImplementedError

    def check_request_lengths(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Refuse a request longer than this drafter's own model can position (before anything is allocated); a
        drafter without positions of its own has nothing to check."""

    def check_shape(self, shape: TreeShape) -> None:
        """Refuse a shape this drafter cannot draft (before any work), e.g. a tree for a model without tree masks."""

    def reset(self) -> None:
        """Forget any previous request: empty caches, zero counters."""
        self.time_s = 0.0
        self.lm_head_time_s = 0.0
        self.steps = 0

    def prefill(self, context: torch.Tensor, window: int | None = None) -> None:
        """Process the prompt [1, L] before the first proposal (timed by the engine as prefill, not drafting); with
        `window` (one of `prompt_windows`, plus any tokens plain steps emitted before a `late_prefill`), only that
        many of its tokens."""
        raise NotImplementedError

    def propose(
        self, context: torch.Tensor, shape: TreeShape, sampling: SamplingParams, generator: torch.Generator | None,
        keep_drafting: KeepDrafting | None = None,
    ) -> TokenTree:
        """Propose a token tree of `shape` whose root is the pending token context[0, -1] (see token_tree.py). A
        chain asks `keep_drafting` after each token whether to draft another (tree_growth.KeepDrafting), so it may
        be shorter than `shape.depth`."""
        raise NotImplementedError

    def observe_target(self, hidden_states, rows: torch.Tensor | None = None) -> None:
        """Receive the target's hidden states (its `hidden_states` output) at `rows` of its last forward (default
        all), for the positions that follow those already observed. Only called if `target_hidden_layers` is set."""

    def rollback(self, length: int) -> None:
        """Keep only state for the first `length` tokens of the context (the rest was rejected or is new)."""
        raise NotImplementedError

    def _begin_request(self, prompt: torch.Tensor) -> None:
        """A context-aware vocabulary (vocab/context_vocab.py) takes the prompt's tokens as this request's rows;
        a static one has nothing to do. Drafters call it at the start of `prefill`."""
        self.vocab.begin_request(prompt)

    def _add_request_tokens(self, ids: torch.Tensor) -> None:
        """A context-aware vocabulary also takes the tokens accepted since the last proposal (and the root).
        Drafters call it at the start of `propose`, never between a proposal and its verification, so the rows a
        proposal's q was computed over are the rows it is verified against."""
        self.vocab.add_tokens(ids)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The draft LM head over this drafter's vocabulary (`_head_logits`), timed as LM-head time, on the kernel
        its rows are faster on (a one-row call without oneDNN where that is faster: models/one_row_linear.py)."""
        start = now(self.device)
        with one_row_linear.kernel_for(hidden):
            logits = self._head_logits(hidden)
        self.lm_head_time_s += now(self.device) - start
        return logits

    def _head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """What `_logits` times: the vocabulary's head over `hidden` (drafters add their own steps around it)."""
        return self.vocab.logits(hidden)


def check_token_map(token_map: TokenMap, vocab_size: int, what: str, tokenizer=None) -> None:
    """Refuse a map built for another vocabulary: its size must be the model's (LM-head rows) and, given the
    tokenizer, the map must have been made with it (`TokenMap.check_tokenizer`)."""
    token_map.check_vocab_size(vocab_size, what)
    if tokenizer is not None:
        token_map.check_tokenizer(tokenizer_identity(tokenizer), vocab_size)
