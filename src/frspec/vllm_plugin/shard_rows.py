"""Tensor parallelism: vLLM splits an LM head by vocabulary, rank r holding global rows [start_r, end_r). Each rank
keeps the map's rows that lie in its own shard; after the ranks' pruned logits are all-gathered, one fixed index
puts the columns back in map order, so the gathered logits equal a single rank's pruned head exactly.

(SGLang's token map under TP indexed every rank's shard with the global ids, its issue 4328; here each rank only
ever indexes its own rows, by position inside its shard.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class ShardRows:
    """One rank's part of a pruned head.

    local_rows: the kept rows inside this rank's shard (0 = the shard's first row), in map order;
    target_ids: their target ids; width: columns every rank contributes to the all-gather (the largest rank's
    kept-row count, smaller ranks pad); gather_index [K]: for map position p, the column of the all-gathered
    [N, tp * width] logits that holds it.
    """

    local_rows: torch.Tensor
    target_ids: torch.Tensor
    width: int
    gather_index: torch.Tensor


def select_shard_rows(
    rows: torch.Tensor, target_ids: torch.Tensor, shard_ranges: Sequence[tuple[int, int]], rank: int
) -> ShardRows:
    """Split the kept global `rows` (map order) and their `target_ids` over the ranks' [start, end) row ranges."""
    positions = [torch.nonzero((rows >= lo) & (rows < hi)).flatten() for lo, hi in shard_ranges]
    if sum(p.numel() for p in positions) != rows.numel():
        raise ValueError("the shard ranges do not cover every kept row")
    width = max(p.numel() for p in positions)
    gather_index = torch.empty_like(rows)
    for r, pos in enumerate(positions):
        gather_index[pos] = r * width + torch.arange(pos.numel(), device=rows.device)
    mine = positions[rank]
    return ShardRows(rows[mine] - shard_ranges[rank][0], target_ids[mine], width, gather_index)
