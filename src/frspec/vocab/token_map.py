"""TokenMap: the frequency-ranked subset of a vocabulary that an FR-Spec drafter's LM head is restricted to."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from frspec.errors import FrspecError


class TokenMap:
    """An ordered list of kept token ids over a vocabulary of `vocab_size` ids.

    Draft index i (the row of the pruned LM head) stands for target token id `ids[i]`. Ids are unique, in range,
    and conventionally in descending frequency order.
    """

    def __init__(self, ids: Sequence[int] | torch.Tensor, vocab_size: int, metadata: dict[str, Any] | None = None):
        ids_t = torch.as_tensor(ids)
        if ids_t.dim() != 1:
            raise FrspecError(f"token map ids must be a 1-D list, got shape {tuple(ids_t.shape)}")
        if ids_t.dtype.is_floating_point or ids_t.dtype == torch.bool:
            raise FrspecError(f"token map ids must be integers, got {ids_t.dtype}")
        ids_t = ids_t.to(torch.long)
        vocab_size = int(vocab_size)
        if vocab_size <= 0:
            raise FrspecError(f"token map vocab_size must be positive, got {vocab_size}")
        if ids_t.numel() == 0:
            raise FrspecError("token map is empty")
        if ids_t.numel() > vocab_size:
            raise FrspecError(f"token map has {ids_t.numel()} ids but the vocabulary has only {vocab_size}")
        lo, hi = int(ids_t.min()), int(ids_t.max())
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise FrspecError(f"token map id {bad} is out of range for a vocabulary of {vocab_size}")
        if torch.unique(ids_t).numel() != ids_t.numel():
            uniq, counts = torch.unique(ids_t, return_counts=True)
            raise FrspecError(f"token map has duplicated id {int(uniq[counts > 1][0])}")
        self.ids: torch.Tensor = ids_t.contiguous()
        self.vocab_size: int = vocab_size
        self.metadata: dict[str, Any] = dict(metadata or {})

    @property
    def k(self) -> int:
        return int(self.ids.numel())

    def __len__(self) -> int:
        return self.k

    def __repr__(self) -> str:
        return f"TokenMap(k={self.k}, vocab_size={self.vocab_size})"

    def check_vocab_size(self, vocab_size: int, what: str = "the model") -> None:
        """Refuse a map built for another vocabulary, with a message that names both sizes."""
        if int(vocab_size) != self.vocab_size:
            raise FrspecError(
                f"token map was built for a vocabulary of {self.vocab_size} ids but {what} has {int(vocab_size)}"
            )
