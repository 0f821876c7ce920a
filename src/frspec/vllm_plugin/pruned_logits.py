"""The FR-Spec logits of a drafter model: its LogitsProcessor modules are replaced by PrunedLogits, so whatever
calls the drafter's `compute_logits(hidden_states, *args, **kwargs)` (V1's proposers, V2's speculators, an MTP
model's per-step `spec_step_idx` and its own pre-head norm) gets the map rows' GEMM scattered into a row of -inf
over the head's vocabulary. Every runner's argmax, Gumbel sampling and probabilistic draft probabilities then see
exactly the pruned distribution.

Replacing the processor rather than `compute_logits` keeps each model's own code around the head (DeepSeek-style
MTP layers normalise before their shared head, EAGLE-3 maps its draft vocabulary to target ids after it) and finds
the head the model actually calls: the pruned rows are built, once per LM-head module, from the head the processor
is called with, which is the target's head when vLLM shares it (EAGLE-1/2, MTP). The pruned rows are a copy: the
LM head itself is never modified.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from frspec.errors import FrspecError
from frspec.vllm_plugin.drafter_head import DrafterHead


class PrunedLogits(nn.Module):
    """Stands in for one LogitsProcessor of a drafter model. `build(lm_head, processor)` makes the FR-Spec head for
    an LM-head module; heads are kept by module identity (a Python dict look-up, not a branch on tensor values)."""

    def __init__(self, processor: nn.Module, build: Callable[[nn.Module, nn.Module], DrafterHead]):
        super().__init__()
        self.processor = processor  # vLLM's own, kept for its attributes; never called
        self.build = build
        self.heads: dict[int, DrafterHead] = {}
        self.lm_heads: dict[int, nn.Module] = {}  # keeps the keyed modules alive, so their ids stay theirs
        self.calls = 0

    def head(self, lm_head: nn.Module) -> DrafterHead:
        key = id(lm_head)
        head = self.heads.get(key)
        if head is None:  # first call with this LM head: at start-up (the worker's check), before any graph capture
            head = self.heads[key] = self.build(lm_head, self.processor)
            self.lm_heads[key] = lm_head
        return head

    def forward(self, lm_head: nn.Module, hidden_states: torch.Tensor, embedding_bias: torch.Tensor | None = None,
                *args: Any, **kwargs: Any) -> torch.Tensor:
        if embedding_bias is not None:
            raise FrspecError("FR-Spec in vLLM does not support a drafter whose logits take an embedding bias")
        self.calls += 1
        return self.head(lm_head).row_logits(hidden_states)

    def extra_repr(self) -> str:
        return f"heads={len(self.heads)}"


def attach_pruned_logits(model: nn.Module, build: Callable[[nn.Module, nn.Module], DrafterHead]) -> int:
    """Replace every LogitsProcessor inside `model` by a PrunedLogits; returns how many (idempotent)."""
    from frspec.vllm_plugin import internals

    processor_cls = internals.get("vllm.model_executor.layers.logits_processor", "LogitsProcessor")
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, processor_cls) and not isinstance(child, PrunedLogits):
                setattr(parent, name, PrunedLogits(child, build))
                replaced += 1
            elif isinstance(child, PrunedLogits):
                replaced += 1
    model.frspec_pruned = True  # marks the drafter model: loaded through the hook
    return replaced


def pruned_logits_of(model: nn.Module) -> list[PrunedLogits]:
    return [m for m in model.modules() if isinstance(m, PrunedLogits)]
