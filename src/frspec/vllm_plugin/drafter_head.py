"""The drafter's FR-Spec head inside vLLM: a DraftVocab over the map's rows of this rank's LM-head shard, the
all-gather across tensor-parallel ranks, and the draft-index -> target-id mapping vLLM's sampling needs."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from frspec.errors import FrspecError
from frspec.vllm_plugin.settings import CONTEXT_ROWS_ENV, MAP_SIZE_ENV, ContextSetting
from frspec.vllm_plugin.shard_rows import select_shard_rows
from frspec.vocab.context_vocab import ContextVocab
from frspec.vocab.draft_vocab import DraftVocab, kept_rows
from frspec.vocab.ranked_vocab import RankedVocab
from frspec.vocab.token_map import TokenMap


class DrafterHead(nn.Module):
    """Logits over the K kept target ids, in map order, as one rank sees them after the all-gather.

    `vocab` scores this rank's kept rows; `all_gather` (None for one rank) concatenates every rank's [N, width]
    logits along the last dim and `gather_index` picks the K kept columns out of that in map order. `target_ids`
    [K] is the target id of each kept column (the same on every rank): with one rank, the vocabulary's own (a
    ContextVocab's change with the batch), else `gathered_target_ids`, every rank's kept ids in map order.
    """

    def __init__(self, vocab: DraftVocab, vocab_size: int, gathered_target_ids: torch.Tensor | None = None,
                 width: int | None = None, gather_index: torch.Tensor | None = None,
                 all_gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 gathered_rows: torch.Tensor | None = None, n_rows: int | None = None):
        super().__init__()
        self.vocab = vocab
        # The head's own row space (what vLLM's LogitsProcessor returns: EAGLE-3's draft vocabulary, else the target
        # vocabulary): `n_rows` wide, the kept columns at `rows`.
        self.n_rows = int(vocab_size if n_rows is None else n_rows)
        self.register_buffer("gathered_rows", None if gathered_rows is None else gathered_rows.clone(),
                             persistent=False)
        self._row_logits: dict[tuple, torch.Tensor] = {}  # one [N, n_rows] output per shape, allocated once
        # The engine's own GEMM for `vocab.head` (vLLM on CPU: a prepacked oneDNN kernel, as for the full head);
        # None: `vocab.logits`.
        self.matmul: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.vocab_size = int(vocab_size)
        self.width = width
        self.all_gather = all_gather
        self.register_buffer("gathered_target_ids", None if gathered_target_ids is None else gathered_target_ids.clone(),
                             persistent=False)
        self.register_buffer("gather_index", None if gather_index is None else gather_index.clone(), persistent=False)

    @property
    def target_ids(self) -> torch.Tensor:
        return self.vocab.target_ids if self.gathered_target_ids is None else self.gathered_target_ids

    @property
    def rows(self) -> torch.Tensor:
        """The kept rows of the head (global indices, map order; a ContextVocab's change with the batch)."""
        return self.vocab.rows if self.gathered_rows is None else self.gathered_rows

    @property
    def size(self) -> int:
        return int(self.target_ids.numel())

    def local_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """This rank's pruned logits, padded to the all-gather width ([N, k_rank] with one rank)."""
        hidden = hidden.to(self.vocab.head.weight.dtype)
        logits = self.vocab.logits(hidden) if self.matmul is None else self.matmul(hidden)
        if self.width is not None and logits.shape[-1] < self.width:
            logits = nn.functional.pad(logits, (0, self.width - logits.shape[-1]))  # never selected below
        return logits

    def select(self, gathered: torch.Tensor) -> torch.Tensor:
        """The K kept columns, in map order, of the ranks' all-gathered local logits."""
        return gathered if self.gather_index is None else gathered.index_select(-1, self.gather_index)

    def kept_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, K] logits over the kept target ids, in map order (the same on every rank)."""
        local = self.local_logits(hidden)
        return local if self.all_gather is None else self.select(self.all_gather(local))

    def to_target(self, idx: torch.Tensor) -> torch.Tensor:
        """Kept-column indices -> target ids."""
        return self.target_ids[idx]

    def to_full(self, probs: torch.Tensor) -> torch.Tensor:
        """[N, K] probabilities -> [N, V] over the target vocabulary, zero outside the map."""
        full = probs.new_zeros(*probs.shape[:-1], self.vocab_size)
        full[..., self.target_ids] = probs
        return full

    def full_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, V] logits as vLLM's compute_logits returns them: the kept ids' scores, -inf elsewhere (vLLM's own
        EAGLE-3 reduced vocabulary is scattered the same way)."""
        kept = self.kept_logits(hidden)
        full = kept.new_full((*kept.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.target_ids] = kept
        return full

    def row_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, n_rows] logits as vLLM's LogitsProcessor returns them for this head: the kept rows' scores, -inf
        elsewhere (in `row_dtype`: the same values, widened to fp32 on CPU). Graph-safe: no host sync, no
        data-dependent shape or branch; the output for each shape is allocated once (a captured graph replays into
        the same memory) and refilled with -inf on every call, as samplers may scale or overwrite it in place. A
        caller gets the same tensor back on the next call with the same shape (vLLM's drafters consume the logits
        of a step before the next one)."""
        kept = self.kept_logits(hidden)
        dtype = row_dtype(kept.dtype, kept.device)
        key = (tuple(kept.shape[:-1]), dtype, kept.device)
        out = self._row_logits.get(key)
        if out is None:
            out = self._row_logits[key] = kept.new_empty((*kept.shape[:-1], self.n_rows), dtype=dtype)
        out.fill_(float("-inf"))
        return out.index_copy_(out.dim() - 1, self.rows, kept.to(dtype))

    def extra_repr(self) -> str:
        return f"kept={self.size}, vocab_size={self.vocab_size}, rank_rows={self.vocab.size}"


def row_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype of the full row the drafter's samplers scan. On CPU a 16-bit float row is widened to fp32: PyTorch's
    CPU argmax over bf16 is not vectorised, and over 151,936 columns it cost ~2.5x the fp32 argmax (500 vs 200 us
    per row, one thread; docs/vllm.md, "where the full-row cost went"), while widening the K kept scores is exact
    and cheap. Elsewhere (GPU: fill and argmax are memory-bound) the row keeps the logits' own dtype. Decided by
    device and dtype only, never by values, so a captured graph sees one dtype."""
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return dtype


def build_drafter_head(
    weight: torch.Tensor,
    token_map: TokenMap,
    vocab_size: int,
    n_rows: int,
    shard_ranges: list[tuple[int, int]] | None = None,
    rank: int = 0,
    bias: torch.Tensor | None = None,
    head_to_target: torch.Tensor | None = None,
    all_gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    context: ContextSetting | None = None,
    ranked: bool = False,
) -> DrafterHead:
    """The head for one rank. `weight` [rows_of_shard, hidden] is the rank's shard (the whole head with one rank,
    padding rows included or not), `n_rows` the head's global row count, `head_to_target` [n_rows] the target id
    of each global row (EAGLE-3; None: row i is target id i). `shard_ranges`, with more than one rank: every
    rank's [start, end) global rows, and `all_gather` the tensor-parallel all-gather along the last dim.
    `context`: a context-aware head (a ContextVocab over the map; one rank only). `ranked`: the whole head in the
    map's order (a RankedVocab: the map ranks its ids first, the head's other rows follow), whose size the
    batch's chooser sets between steps (batch_map_size.py; one rank only)."""
    one_rank = shard_ranges is None or len(shard_ranges) == 1
    if ranked:
        if not one_rank or context is not None:
            raise FrspecError(f"a map size chosen per step ({MAP_SIZE_ENV}=auto) supports one rank and no context "
                              "rows")
        vocab = RankedVocab.build(weight[:n_rows], token_map, None if bias is None else bias[:n_rows],
                                  head_to_target, vocab_size)
        vocab.set_size(vocab.ranked_size)  # the map's own size until the chooser has measured a step
        return DrafterHead(vocab, vocab_size, n_rows=n_rows)
    if context is not None:
        if not one_rank:
            raise FrspecError(f"context-aware drafting ({CONTEXT_ROWS_ENV}) supports one rank, not tensor "
                              f"parallelism over {len(shard_ranges)} ranks")
        vocab = ContextVocab.build(weight[:n_rows], None if bias is None else bias[:n_rows], token_map,
                                   head_to_target, vocab_size, extra_rows=context.extra_rows, budget=context.budget)
        return DrafterHead(vocab, vocab_size, n_rows=n_rows)
    device = weight.device
    rows, target_ids = kept_rows(token_map, n_rows, vocab_size, head_to_target, device=device)
    if one_rank:
        vocab = DraftVocab(weight, vocab_size, rows=rows, target_ids=target_ids, bias=bias, token_map=token_map)
        return DrafterHead(vocab, vocab_size, n_rows=n_rows)
    part = select_shard_rows(rows, target_ids, shard_ranges, rank)
    vocab = DraftVocab(weight, vocab_size, rows=part.local_rows, target_ids=part.target_ids, bias=bias,
                       token_map=token_map)
    return DrafterHead(vocab, vocab_size, target_ids, part.width, part.gather_index, all_gather, gathered_rows=rows,
                       n_rows=n_rows)


def vllm_shard_ranges(lm_head: Any) -> list[tuple[int, int]]:
    """Every rank's [start, end) global rows of a vLLM VocabParallelEmbedding / ParallelLMHead (padding excluded)."""
    ranges = []
    for r in range(lm_head.tp_size):
        idx = lm_head._get_indices(lm_head.num_embeddings_padded, lm_head.org_vocab_size_padded,
                                   lm_head.num_embeddings, lm_head.org_vocab_size, r, lm_head.tp_size)
        ranges.append((idx.org_vocab_start_index, idx.org_vocab_end_index))
    return ranges
