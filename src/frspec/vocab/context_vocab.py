"""ContextVocab: an FR-Spec draft vocabulary that also holds the tokens of the current request.

A static token map cannot propose what is rare in its corpus but common in this request: identifiers in code,
names and numbers in a long document, the user's own language. A ContextVocab scores the map's rows plus rows for
the request's own tokens (its prompt, and the tokens generated so far), under one of two budgets:

    fixed     k rows in all, as the map alone: the request's tokens displace the map's least frequent ones (at most
              `extra_rows` of them; the map's always-kept special tokens are never displaced);
    additive  the map's k rows plus up to `extra_rows` rows for the request's tokens that the map lacks.

It is built once per model and reused by every request without copying the head: the row matrix is preallocated,
its static part (the map rows that stay) is copied once at build time, and each request writes only its own part,
at most `extra_rows` rows, with one index_select from the source head (`begin_request`, then `add_tokens` as
tokens are accepted). The active rows are always a prefix of the matrix, so the head the drafter multiplies is a
view, never a copy.

Lossless like any draft vocabulary: the target still verifies over its full vocabulary, and a sampling drafter's q
is its softmax over exactly the active rows (`to_full` puts zero everywhere else). Between `propose` and the
verification of that proposal the rows must not change; a drafter updates them at the start of its next proposal.

`ContextSlots` is the row bookkeeping without weights (which target id each row holds), shared by ContextVocab and
by the coverage measurement (vocab/coverage.py), so both select the same rows.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch import nn

from frspec.errors import FrspecError
from frspec.vocab.draft_vocab import DraftVocab
from frspec.vocab.ranked_vocab import RankedVocab
from frspec.vocab.token_map import TokenMap, position_of

BUDGETS = ("fixed", "additive")


class ContextSlots:
    """Which target id each row of a context-aware vocabulary holds (no weights).

    Rows [0, n_static) hold the static part, in map order, for every request. The `extra_rows` dynamic rows after
    them depend on the request. Fixed budget: they always hold something, so all k rows are active: the map's
    displaceable tail ("fillers", in map order) from the front and the request's tokens from the back, each new
    request token taking the slot of the least frequent filler left. Additive budget: they hold only the request's
    tokens, appended, and the active rows are the first n_static + (request tokens) rows.

    A request token is taken if no active row holds it and the head can score it (`scorable`); when more are new
    than there are free rows, those more frequent in the request come first (then the later ones). Tokens that do
    not fit are dropped and counted in `dropped`.
    """

    def __init__(
        self,
        map_ids: torch.Tensor,
        vocab_size: int,
        extra_rows: int,
        budget: str = "fixed",
        keep: Iterable[int] = (),
        scorable: torch.Tensor | None = None,
    ):
        if budget not in BUDGETS:
            raise FrspecError(f"context budget must be one of {', '.join(BUDGETS)}, got {budget!r}")
        if isinstance(extra_rows, bool) or int(extra_rows) != extra_rows or int(extra_rows) < 0:
            raise FrspecError(f"context rows must be a non-negative integer, got {extra_rows}")
        map_ids = torch.as_tensor(map_ids, dtype=torch.long).cpu()
        self.vocab_size = int(vocab_size)
        self.budget = budget
        self.extra_rows = int(extra_rows)
        if budget == "fixed":
            keep_mask = torch.zeros(self.vocab_size, dtype=torch.bool)
            keep_ids = torch.as_tensor(sorted({int(i) for i in keep}), dtype=torch.long)
            if keep_ids.numel():
                keep_mask[keep_ids[(keep_ids >= 0) & (keep_ids < self.vocab_size)]] = True
            displaceable = torch.nonzero(~keep_mask[map_ids]).flatten()
            if self.extra_rows > displaceable.numel():
                raise FrspecError(
                    f"a fixed budget of {map_ids.numel()} rows can give at most {displaceable.numel()} rows to the "
                    f"request's tokens (the rest are always-kept special tokens), not {self.extra_rows}"
                )
            tail = displaceable[displaceable.numel() - self.extra_rows:]
            is_tail = torch.zeros(map_ids.numel(), dtype=torch.bool)
            is_tail[tail] = True
            self.static_ids = map_ids[~is_tail]
            self.filler_ids = map_ids[is_tail]  # map order: the least frequent last
        else:
            self.static_ids = map_ids
            self.filler_ids = map_ids[:0]
        self.n_static = int(self.static_ids.numel())
        self.capacity = self.n_static + self.extra_rows
        self.scorable = (
            torch.ones(self.vocab_size, dtype=torch.bool) if scorable is None else scorable.to(torch.bool).cpu()
        )
        self.slot_ids = torch.full((self.capacity,), -1, dtype=torch.long)
        self.slot_ids[: self.n_static] = self.static_ids
        self.active = torch.zeros(self.vocab_size, dtype=torch.bool)  # target ids some active row holds
        self.active[self.static_ids] = True
        self.n_context = 0  # dynamic rows holding request tokens
        self.dropped = 0  # request tokens that found no free row
        self.begin(())

    @property
    def n_active(self) -> int:
        """How many rows are scored now: all k under a fixed budget, map + request rows under an additive one."""
        return self.capacity if self.budget == "fixed" else self.n_static + self.n_context

    @property
    def active_ids(self) -> torch.Tensor:
        """Target id of each active row, in row order."""
        return self.slot_ids[: self.n_active]

    def begin(self, prompt_ids: Sequence[int] | torch.Tensor) -> tuple[int, torch.Tensor]:
        """Start a request with the tokens of its prompt. Returns (first row, target ids) of the rows to write."""
        dynamic = self.slot_ids[self.n_static:]
        self.active[dynamic[dynamic >= 0]] = False
        self.slot_ids[self.n_static:] = -1
        self.n_context = 0
        self.dropped = 0
        chosen = self._new_ids(prompt_ids, self.extra_rows)
        if self.budget == "fixed":
            fillers = self.filler_ids[~torch.isin(self.filler_ids, chosen)][: self.extra_rows - chosen.numel()]
            written = torch.cat([fillers, chosen.flip(0)])
        else:
            written = chosen
        self.slot_ids[self.n_static: self.n_static + written.numel()] = written
        self.active[written] = True
        self.n_context = int(chosen.numel())
        return self.n_static, written

    def add(self, ids: Sequence[int] | torch.Tensor) -> tuple[int, torch.Tensor]:
        """Take more of the request's tokens (generated ones). Returns (first row, target ids) of the rows to write
        (possibly none)."""
        chosen = self._new_ids(ids, self.extra_rows - self.n_context)
        n = int(chosen.numel())
        if self.budget == "fixed":
            # The fillers occupy [n_static, capacity - n_context), the least frequent at the end: displace those.
            end = self.capacity - self.n_context
            start = end - n
            self.active[self.slot_ids[start:end]] = False
            written = chosen.flip(0)
        else:
            start = self.n_static + self.n_context
            written = chosen
        self.slot_ids[start: start + n] = written
        self.active[written] = True
        self.n_context += n
        return start, written

    def _new_ids(self, ids: Sequence[int] | torch.Tensor, limit: int) -> torch.Tensor:
        """The distinct ids of `ids` no active row holds and the head can score, most frequent in `ids` first
        (ties: the later occurrence first), at most `limit` of them."""
        ids = torch.as_tensor(ids, dtype=torch.long).flatten().cpu()
        if ids.numel() == 0:
            return ids
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise FrspecError(f"request token ids must lie in [0, {self.vocab_size}), got "
                              f"[{int(ids.min())}, {int(ids.max())}]")
        uniq, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
        last = torch.zeros(uniq.numel(), dtype=torch.long).scatter_reduce_(
            0, inverse, torch.arange(ids.numel()), reduce="amax")
        new = ~self.active[uniq] & self.scorable[uniq]
        uniq, counts, last = uniq[new], counts[new], last[new]
        order = torch.argsort(counts * (ids.numel() + 1) + last, descending=True, stable=True)
        taken = uniq[order[: max(0, limit)]]
        self.dropped += int(uniq.numel() - taken.numel())
        return taken


class ContextVocab(DraftVocab):
    """A DraftVocab whose rows are a token map plus the current request's tokens (see the module docstring).

    It is a DraftVocab in every respect the drafters use (`head`, `logits`, `to_target`, `to_full`, `size`,
    `target_ids`, `rows`), always describing the rows active now; `begin_request(prompt_ids)` starts a request and
    `add_tokens(ids)` adds tokens generated since. Before any request it is exactly the static map.
    """

    def __init__(
        self,
        source_weight: torch.Tensor,
        source_bias: torch.Tensor | None,
        vocab_size: int,
        token_map: TokenMap,
        row_of: torch.Tensor,
        slots: ContextSlots,
    ):
        """Prefer `ContextVocab.build`. `row_of[t]`: the source row that scores target id t (-1: none)."""
        capacity, hidden = slots.capacity, int(source_weight.shape[1])
        device = source_weight.device
        with torch.no_grad():
            weight = source_weight.detach().new_zeros(capacity, hidden)
            bias = None if source_bias is None else source_bias.detach().new_zeros(capacity)
        super().__init__(weight, vocab_size, rows=None, target_ids=torch.zeros(capacity, dtype=torch.long),
                         bias=bias, token_map=token_map)
        # The source head is read (per request, at most extra_rows rows), never copied whole or modified. It is
        # held as a plain attribute: not a parameter or buffer of this module, so `.to()` and state_dict skip it.
        self._source_weight = source_weight.detach()
        self._source_bias = None if source_bias is None else source_bias.detach()
        self.slots = slots
        # The whole preallocated matrix; `head.weight`, `target_ids` and `rows` are views of its active prefix.
        self.register_buffer("weight_all", self.head.weight.data, persistent=False)
        self.register_buffer("bias_all", None if bias is None else self.head.bias.data, persistent=False)
        self.register_buffer("target_ids_all", torch.full((capacity,), -1, dtype=torch.long, device=device),
                             persistent=False)
        self.register_buffer("rows_all", torch.full((capacity,), -1, dtype=torch.long, device=device),
                             persistent=False)
        self.register_buffer("row_of", row_of.to(device), persistent=False)
        # The static part is copied here, once; with it the fillers of the empty request the slots began with.
        self._write(0, slots.active_ids)
        self._activate()

    @classmethod
    def build(
        cls,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        token_map: TokenMap | None = None,
        head_to_target: torch.Tensor | None = None,
        vocab_size: int | None = None,
        *,
        extra_rows: int,
        budget: str = "fixed",
        keep: Iterable[int] | None = None,
    ) -> ContextVocab:
        """The context-aware vocabulary of an LM head `weight` [rows, hidden] around `token_map`.

        `weight`, `bias`, `head_to_target` and `vocab_size` are as for `DraftVocab.build`; with `head_to_target`
        (an EAGLE-3 head's own vocabulary) only tokens that head can score are taken. `extra_rows`: how many rows
        the request's tokens may have (displacing map rows under the `"fixed"` budget, added to them under
        `"additive"`). `keep`: map ids a fixed budget never displaces (default: the map's recorded always-kept
        tokens, `metadata["kept_tokens"]`).
        """
        if token_map is None:
            raise FrspecError("a context-aware draft vocabulary extends a token map: give one (--token-map)")
        vocab_size = int(token_map.vocab_size if vocab_size is None else vocab_size)
        token_map.check_vocab_size(vocab_size, "the target")
        # The plain vocabulary of the head (no copy: no map) validates `head_to_target` exactly as DraftVocab does.
        head_to_target = DraftVocab.build(weight, bias, head_to_target=head_to_target, vocab_size=vocab_size).target_ids
        row_of = torch.arange(vocab_size) if head_to_target is None else position_of(head_to_target.cpu(), vocab_size)
        map_ids = token_map.ids[row_of[token_map.ids] >= 0]
        if map_ids.numel() == 0:
            raise FrspecError("the token map and the head's draft vocabulary have no token in common")
        if keep is None:
            keep = token_map.metadata.get("kept_tokens", {}).values()
        slots = ContextSlots(map_ids, vocab_size, extra_rows, budget, keep=keep, scorable=row_of >= 0)
        return cls(weight, bias, vocab_size, token_map, row_of, slots)

    # -- per request ---------------------------------------------------------------------------------------------

    def begin_request(self, prompt_ids: Sequence[int] | torch.Tensor) -> None:
        """Make the request's rows those of `prompt_ids` (any shape); the previous request's are dropped."""
        self._write(*self.slots.begin(prompt_ids))
        self._activate()

    def add_tokens(self, ids: Sequence[int] | torch.Tensor) -> None:
        """Add tokens of the request seen since (generated, accepted) while rows are free; cheap when none is new."""
        start, written = self.slots.add(ids)
        if written.numel():
            self._write(start, written)
            self._activate()

    def quantize_head(self, quantize) -> bool:
        """Never: the active rows are rewritten per request from the float source head, so they stay float."""
        return False

    @property
    def context_rows(self) -> int:
        """How many active rows hold request tokens (rather than the map's)."""
        return self.slots.n_context

    @property
    def dropped_tokens(self) -> int:
        """Distinct request tokens that found no free row in this request."""
        return self.slots.dropped

    # -- internals -----------------------------------------------------------------------------------------------

    def _write(self, start: int, target_ids: torch.Tensor) -> None:
        n = int(target_ids.numel())
        if n == 0:
            return
        device = self.weight_all.device
        target_ids = target_ids.to(device)
        rows = self.row_of[target_ids]
        with torch.no_grad():
            # One index_select of n rows (n <= extra_rows per request, the static part once at build time).
            self.weight_all[start: start + n].copy_(self._source_weight.index_select(0, rows.to(self._source_weight.device)))
            if self.bias_all is not None:
                self.bias_all[start: start + n].copy_(self._source_bias.index_select(0, rows.to(self._source_bias.device)))
        self.target_ids_all[start: start + n] = target_ids
        self.rows_all[start: start + n] = rows

    def _activate(self) -> None:
        """Point the head, target ids and rows at the active prefix (views: nothing is copied)."""
        n = self.slots.n_active
        self.head.weight = nn.Parameter(self.weight_all[:n], requires_grad=False)
        if self.bias_all is not None:
            self.head.bias = nn.Parameter(self.bias_all[:n], requires_grad=False)
        self.head.out_features = n
        self.target_ids = self.target_ids_all[:n]
        self.rows = self.rows_all[:n]

    def _apply(self, fn, recurse=True):
        # `.to()`/`.half()` convert parameters and buffers one by one; the views must then point into the new
        # matrix again.
        super()._apply(fn, recurse)
        self._activate()
        return self

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, budget={self.slots.budget}, extra_rows={self.slots.extra_rows}, "
                f"context_rows={self.context_rows}")


def build_draft_vocab(
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    token_map: TokenMap | None = None,
    head_to_target: torch.Tensor | None = None,
    vocab_size: int | None = None,
    context_rows: int = 0,
    context_budget: str = "fixed",
    ranked: bool = False,
) -> DraftVocab:
    """A drafter's vocabulary: the static `DraftVocab` of `token_map` (or of the whole head), or with
    `context_rows` > 0 a `ContextVocab` giving that many rows to the request's tokens under `context_budget`, or
    with `ranked` a `RankedVocab` (vocab/ranked_vocab.py): the whole head in the map's rank order, whose size is
    chosen per step. The one place every drafter (draft model, EAGLE head) makes this choice."""
    if ranked:
        if token_map is None:
            raise FrspecError("a ranked head needs a frequency ranking: give a token map")
        if context_rows and context_budget != "additive":
            raise FrspecError("context rows on a ranked head (map size auto) come on top of its k rows: give "
                              "--context-budget additive (a fixed budget needs a fixed map size)")
        return RankedVocab.build(weight, token_map, bias, head_to_target, vocab_size, extra_rows=context_rows)
    if context_rows:
        return ContextVocab.build(weight, bias, token_map, head_to_target, vocab_size, extra_rows=context_rows,
                                  budget=context_budget)
    if context_budget not in BUDGETS:
        raise FrspecError(f"context budget must be one of {', '.join(BUDGETS)}, got {context_budget!r}")
    return DraftVocab.build(weight, bias, token_map, head_to_target, vocab_size)
