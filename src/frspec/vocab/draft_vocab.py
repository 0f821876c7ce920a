"""DraftVocab: FR-Spec in one object.

A drafter scores its next token with an LM head of `rows` rows. Without FR-Spec every row is scored and row i is
target id i (or, for an EAGLE-3 head with its own reduced vocabulary, target id `head_to_target[i]`). With a token
map only the rows whose target ids are in the map are scored, in map order: draft index j is target id
`target_ids[j]`. This object owns that choice and everything that follows from it:

    logits(hidden)   [..., k] scores over the kept rows (a [hidden x k] matmul instead of [hidden x V])
    to_target(idx)   draft indices -> target-vocabulary ids
    to_full(probs)   a draft distribution over the k rows -> the same distribution over the full target vocabulary
                     (zero outside the kept rows), as verification needs it

The kept rows are copied into a contiguous matrix of their own; the source head is never modified or viewed
(models with tied embeddings keep their embedding), so any number of drafters may share one model or EAGLE head,
each with its own DraftVocab. Without a restriction the source weight is used as it is, without a copy.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from frspec.errors import FrspecError
from frspec.vocab.token_map import TokenMap, position_of


class DraftVocab(nn.Module):
    """The target ids a drafter can propose and its LM head restricted to them (see the module docstring)."""

    def __init__(
        self,
        weight: torch.Tensor,
        vocab_size: int,
        rows: torch.Tensor | None = None,
        target_ids: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        token_map: TokenMap | None = None,
    ):
        """Prefer `DraftVocab.build`. `rows`: which rows of `weight` to keep (None: all, used without a copy);
        `target_ids`: the target id of each kept row (None: row index == target id)."""
        super().__init__()
        if weight.dim() != 2:
            raise FrspecError(f"LM head weight must be [rows, hidden], got shape {tuple(weight.shape)}")
        self.vocab_size = int(vocab_size)
        self.token_map = token_map
        with torch.no_grad():
            if rows is not None:
                weight = weight.detach().index_select(0, rows.to(weight.device)).contiguous()
                bias = None if bias is None else bias.detach().index_select(0, rows.to(bias.device)).contiguous()
            self.head = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None,
                                  device="meta", dtype=weight.dtype)
            self.head.weight = nn.Parameter(weight.detach(), requires_grad=False)
            if bias is not None:
                self.head.bias = nn.Parameter(bias.detach(), requires_grad=False)
        if target_ids is not None and target_ids.numel() != weight.shape[0]:
            raise FrspecError(f"{target_ids.numel()} target ids for an LM head of {weight.shape[0]} rows")
        if target_ids is None and weight.shape[0] != self.vocab_size:
            raise FrspecError(f"an LM head of {weight.shape[0]} rows without target ids needs {self.vocab_size} rows")
        self.register_buffer("rows", None if rows is None else rows.clone(), persistent=False)
        self.register_buffer(
            "target_ids", None if target_ids is None else target_ids.to(weight.device).clone(), persistent=False
        )

    @classmethod
    def build(
        cls,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        token_map: TokenMap | None = None,
        head_to_target: torch.Tensor | None = None,
        vocab_size: int | None = None,
    ) -> DraftVocab:
        """The draft vocabulary of an LM head `weight` [rows, hidden], restricted to `token_map` when given.

        `head_to_target` [rows] is the target id of each head row, for heads with their own vocabulary (EAGLE-3:
        i + d2t[i]); None means row i is target id i. `vocab_size` is the target vocabulary size (default: the
        map's, else the number of rows). With both a map and `head_to_target`, the kept rows are the head rows whose
        target ids are in the map, in map order (their intersection). An identity `head_to_target` is no map.
        """
        n_rows = int(weight.shape[0])
        if head_to_target is not None:
            head_to_target = torch.as_tensor(head_to_target, dtype=torch.long)
            if head_to_target.dim() != 1 or head_to_target.numel() != n_rows:
                raise FrspecError(f"head_to_target must list one target id per head row ({n_rows})")
        if vocab_size is None:
            vocab_size = token_map.vocab_size if token_map is not None else n_rows
        vocab_size = int(vocab_size)
        if head_to_target is not None:
            _check_ids(head_to_target, vocab_size, "the head's target ids")
            if n_rows == vocab_size and torch.equal(head_to_target, torch.arange(n_rows, device=head_to_target.device)):
                head_to_target = None  # row i is target id i: no map to apply (EAGLE-1/2 heads, full EAGLE-3 ones)
        elif n_rows != vocab_size:
            raise FrspecError(f"the LM head has {n_rows} rows but the target vocabulary has {vocab_size} ids")
        if token_map is None:
            return cls(weight, vocab_size, target_ids=head_to_target, bias=bias)
        rows, target_ids = kept_rows(token_map, n_rows, vocab_size, head_to_target, device=weight.device)
        return cls(weight, vocab_size, rows=rows, target_ids=target_ids, bias=bias, token_map=token_map)

    @property
    def size(self) -> int:
        """How many rows are scored per draft step (k). Read from the id mapping, not the head's weight: a quantized
        head (models/quant.py) keeps its weight packed."""
        return self.vocab_size if self.target_ids is None else int(self.target_ids.numel())

    @property
    def is_restricted(self) -> bool:
        """True when a token map restricts the head (FR-Spec is active)."""
        return self.token_map is not None

    def logits(self, hidden: torch.Tensor, k: int | None = None) -> torch.Tensor:
        """Scores [..., k] for hidden states [..., hidden]. `k` may only name this vocabulary's own size: a head
        that serves several sizes is a RankedVocab (vocab/ranked_vocab.py)."""
        if k is not None and int(k) != self.size:
            raise FrspecError(f"this draft vocabulary scores {self.size} rows, not {k}: rank the head to vary k")
        return self.head(hidden)

    forward = logits

    def to_target(self, draft_idx: torch.Tensor) -> torch.Tensor:
        """Draft indices (any shape) -> target-vocabulary ids."""
        return draft_idx if self.target_ids is None else self.target_ids[draft_idx]

    def to_full(self, probs: torch.Tensor) -> torch.Tensor:
        """A distribution [..., k] over the draft rows as one [..., V] over the target vocabulary (zero elsewhere)."""
        if self.target_ids is None:
            return probs
        full = probs.new_zeros(*probs.shape[:-1], self.vocab_size)
        full[..., self.target_ids.to(probs.device)] = probs
        return full

    # -- hooks a drafter calls; a static vocabulary has nothing to do (ContextVocab and RankedVocab override them) --

    def begin_request(self, prompt_ids) -> None:
        """A request starts with these prompt ids (a context-aware vocabulary takes them as rows)."""

    def add_tokens(self, ids) -> None:
        """Tokens the request accepted since (a context-aware vocabulary adds them as rows)."""

    def quantize_head(self, quantize: Callable[[nn.Linear], nn.Module]) -> bool:
        """Replace the kept rows' head by `quantize(head)` (a weight-only int4/int8 linear, models/quant.py), once
        the rows are selected; True when it did. The head is this vocabulary's own copy (or, unrestricted, a new
        module over the source weight), so the source head stays float."""
        if not isinstance(self.head, nn.Linear):
            return False  # already quantized
        self.head = quantize(self.head)
        return True

    def extra_repr(self) -> str:
        mapped = f", map k={self.token_map.k}" if self.token_map is not None else ""
        return f"rows={self.size}, vocab_size={self.vocab_size}{mapped}"


def kept_rows(
    token_map: TokenMap,
    n_rows: int,
    vocab_size: int,
    head_to_target: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which rows of an `n_rows`-row head a map keeps, and their target ids: (rows, target_ids), in map order.

    The selection behind `DraftVocab.build`, without a weight: an engine that holds only a slice of the head (a
    tensor-parallel rank holding a vocabulary shard) selects the global rows here and keeps those in its slice.
    """
    token_map.check_vocab_size(vocab_size, "the target")
    map_ids = token_map.ids.to(device)
    if head_to_target is None:
        if n_rows != vocab_size:
            raise FrspecError(f"the LM head has {n_rows} rows but the target vocabulary has {vocab_size} ids")
        return map_ids, map_ids
    head_to_target = head_to_target.to(device=device, dtype=torch.long)
    rows = position_of(head_to_target, vocab_size)[map_ids]
    rows = rows[rows >= 0]
    if rows.numel() == 0:
        raise FrspecError("the token map and the head's draft vocabulary have no token in common")
    return rows, head_to_target[rows]


def _check_ids(ids: torch.Tensor, vocab_size: int, what: str) -> None:
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise FrspecError(f"{what} must lie in [0, {vocab_size}), got [{int(ids.min())}, {int(ids.max())}]")
    if torch.unique(ids).numel() != ids.numel():
        raise FrspecError(f"{what} repeat an id: each target id may be scored by one row only")
