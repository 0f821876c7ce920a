"""The FR-Spec LM head: the rows of a full LM head that a token map keeps, copied into one contiguous matrix.

A draft step then costs a [hidden x k] matmul instead of [hidden x V], and its logits are over draft indices
0..k-1; `to_target_ids` maps the chosen index back to the target vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn

from frspec.errors import FrspecError


class PrunedLMHead(nn.Module):
    """An LM head restricted to `ids`: draft index i scores target token `ids[i]`.

    The rows are copied, never viewed or modified in place, so a model whose embedding and head share one matrix
    (tied embeddings) keeps its embedding intact and the copy stays contiguous for a fast matmul.
    """

    def __init__(self, weight: torch.Tensor, ids: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        if weight.dim() != 2:
            raise FrspecError(f"LM head weight must be [vocab, hidden], got shape {tuple(weight.shape)}")
        ids = torch.as_tensor(ids, dtype=torch.long, device=weight.device)
        if ids.dim() != 1 or ids.numel() == 0:
            raise FrspecError(f"pruned head ids must be a non-empty 1-D list, got shape {tuple(ids.shape)}")
        vocab = weight.shape[0]
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            lo, hi = int(ids.min()), int(ids.max())
            raise FrspecError(f"pruned head ids must lie in [0, {vocab}), got range [{lo}, {hi}]")
        with torch.no_grad():
            self.register_buffer("weight", weight.detach().index_select(0, ids).contiguous())
            self.register_buffer("bias", None if bias is None else bias.detach().index_select(0, ids).contiguous())
        self.register_buffer("ids", ids.clone())

    @property
    def k(self) -> int:
        return int(self.ids.numel())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [..., k] for hidden states [..., hidden]."""
        return nn.functional.linear(hidden, self.weight, self.bias)

    def to_target_ids(self, draft_idx: torch.Tensor) -> torch.Tensor:
        """Map draft indices (any shape) to target-vocabulary ids."""
        return self.ids[draft_idx]

    def extra_repr(self) -> str:
        return f"k={self.k}, hidden={self.weight.shape[1]}, bias={self.bias is not None}"
