"""MtpDrafter: drafting with the MTP layers a target checkpoint ships (DeepSeek-V3, GLM-4.5, Qwen3-Next/3.5, MiMo).

An MTP layer reads what an EAGLE-1/2 head reads (the next token and the target's final hidden state) and scores
with the target's own LM head, so it drafts with the EAGLE drafting loop (eagle_drafter.py): same alignment (the
head trails the target by one token, no extra target forward), chains and static/dynamic trees through
tree_growth.py, greedy and sampled children, and FR-Spec as the drafter's own DraftVocab, a pruned copy of the
target head's rows (the target's head is never touched). Below the root the layer runs on its own features, so a
draft may be deeper than the checkpoint's number of MTP layers (recursive MTP). Loading is models/mtp.py.
"""

from __future__ import annotations

import os

import torch

from frspec.decode.eagle_drafter import EagleDrafter
from frspec.models.mtp import MtpHead, load_mtp_head
from frspec.vocab.token_map import TokenMap


class MtpDrafter(EagleDrafter):
    """Drafts with an MTP head (models/mtp.py), optionally through an FR-Spec token map on the shared head."""

    kind = "mtp"

    def __init__(self, head: MtpHead, num_target_layers: int, token_map: TokenMap | None = None,
                 context_rows: int = 0, context_budget: str = "fixed", ranked: bool = False):
        super().__init__(head, num_target_layers, token_map, context_rows, context_budget, ranked)


def mtp_drafter_for(target: torch.nn.Module, source: str | os.PathLike | MtpHead, token_map: TokenMap | None = None,
                    context_rows: int = 0, context_budget: str = "fixed") -> MtpDrafter:
    """An MtpDrafter for `target` from its checkpoint directory `source` (or an MtpHead already loaded)."""
    head = source if isinstance(source, MtpHead) else load_mtp_head(target, source)
    num_layers = int(target.config.get_text_config(decoder=True).num_hidden_layers)
    return MtpDrafter(head, num_layers, token_map, context_rows, context_budget)
