"""V1's compact path: on vLLM's V1 runner the proposer of a draft model, EAGLE-1/2 or EAGLE-3 drafter argmaxes and
samples over the K kept columns and maps the chosen index to its target id, instead of over the full-vocabulary
row of -inf that the drafter's logits now return (pruned_logits.py).

It is kept because it measured faster on the CPU build (docs/vllm.md, "compact path"): filling and scanning a
151,936-wide row per draft token costs 1-4% at K=32k batch 1 and up to ~40% at batch 16 on one core. It applies
only where the drafter's `compute_logits` is vLLM's LogitsProcessor on its LM head (EAGLE-3: then its d2t
scatter), so skipping `compute_logits` skips nothing; MTP drafters (whose `compute_logits` may normalise first)
and V2 speculators use the full row.
"""

from __future__ import annotations

from typing import Any

import torch

from frspec.vllm_plugin import internals
from frspec.vllm_plugin.drafter_head import DrafterHead

COMPACT_METHODS = ("draft_model", "eagle", "eagle3")


def use_compact_path(proposer: Any, head: DrafterHead) -> bool:
    """Route a V1 proposer's greedy and probabilistic drafting through `head`'s K columns; False when it does not
    apply (another proposer or method)."""
    proposer_cls = internals.get("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer")
    if not isinstance(proposer, proposer_cls) or proposer.method not in COMPACT_METHODS:
        return False

    def greedy_sample(hidden_states: torch.Tensor) -> torch.Tensor:
        return head.to_target(head.kept_logits(hidden_states).argmax(dim=-1))

    def sample_draft_tokens(hidden_states: torch.Tensor, sampling_metadata: Any):
        if not proposer._enable_probabilistic_draft_probs or sampling_metadata.all_greedy:
            return greedy_sample(hidden_states), None
        # vLLM's own draft sampling (temperature, Gumbel noise), over the kept columns only.
        idx, probs = proposer._sample_from_logits(head.kept_logits(hidden_states), sampling_metadata)
        return head.to_target(idx), None if probs is None else head.to_full(probs)

    proposer._greedy_sample = greedy_sample
    proposer._sample_draft_tokens = sample_draft_tokens
    return True
