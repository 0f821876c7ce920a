"""RankedVocab: one frequency-ranked LM head that serves every FR-Spec map size at once.

FR-Spec's maps are nested: the top 8k ids of a frequency ranking are a prefix of its top 16k, which are a prefix of
its top 32k. A head whose rows are stored in rank order therefore holds every map: its first k rows are the k-token
map, and the whole head (k = `full_size`) is the drafter's entire vocabulary, no map at all. So

    logits(hidden, k)   scores the first k rows: a view of the one rank-ordered matrix, nothing is copied
    set_size(k)         makes k the size `logits(hidden)`, `size`, `target_ids` and `rows` describe (the active map)
    to_target(idx)      draft index -> target id, the same for every k (row i is rank i whatever k is)
    to_full(probs)      a distribution over the first k rows (k = its last dimension) -> the target vocabulary

The head's rows are copied once, in rank order (the ranked ids first, then every other row the head can score, by
target id, so that k = full_size is the whole head); the source head is never modified. `rank_of[t]` is target id
t's row (full_size for ids the head cannot score, e.g. outside an EAGLE-3 head's d2t vocabulary): a verifier that
sees the target's token knows at once whether a map of any size held it.

Context-aware rows on top (additive, `extra_rows`): besides the first k rows, up to `extra_rows` rows for the
request's own tokens (`begin_request` takes the prompt's, `add_tokens` the accepted ones) that rank beyond the
smallest size the controller may choose (`set_context_floor`). They are rows of the same ranked matrix, copied
into a small matrix of their own; at a size k a request row whose token is already among the first k scores -inf
(probability 0, never drafted), so every (k, request rows) is still a valid proposal over distinct tokens.

The ranking is a frequency order: a TokenMap (its ids in order: any saved map of any size ranks its ids first),
TokenCounts (ids by descending count, `rank_by_count`), or a plain sequence of ids, most frequent first. Between a
proposal and its verification the size must not change; the engine sets it before proposing.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from frspec.errors import FrspecError
from frspec.vocab.counts import TokenCounts
from frspec.vocab.draft_vocab import DraftVocab
from frspec.vocab.token_map import TokenMap, position_of, rank_by_count

Ranking = TokenMap | TokenCounts | torch.Tensor | Sequence[int]


class RankedVocab(DraftVocab):
    """A DraftVocab over a rank-ordered copy of a whole LM head whose active size k can change at any step (see the
    module docstring). It is a DraftVocab in every respect the drafters use, always describing the first k rows."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, vocab_size: int, rows: torch.Tensor,
                 target_ids: torch.Tensor, ranked: int, token_map: TokenMap, coverage_prior: torch.Tensor | None,
                 extra_rows: int = 0):
        """Prefer `RankedVocab.build`. `rows`/`target_ids`: the source row and target id of each rank."""
        super().__init__(weight, vocab_size, rows=rows, target_ids=target_ids, bias=bias, token_map=token_map)
        n = int(target_ids.numel())
        self.full_size = n
        # How many leading rows the ranking itself ordered (the rest follow by id: only their union, k = full, means
        # anything).
        self.ranked_size = int(ranked)
        self.register_buffer("weight_all", self.head.weight.data, persistent=False)
        self.register_buffer("bias_all", None if bias is None else self.head.bias.data, persistent=False)
        self.register_buffer("target_ids_all", self.target_ids, persistent=False)
        self.register_buffer("rows_all", self.rows, persistent=False)
        self.rank_of = position_of(target_ids.cpu(), self.vocab_size, missing=n)  # CPU: read per step, few tokens
        # Share of the ranking corpus's tokens the first k rows cover, per k (None without counts): a prior for
        # what a map of each size will cover on a request.
        self.coverage_prior = coverage_prior
        # Context rows (module docstring): their weights, target ids and ranks; which target ids they hold.
        if isinstance(extra_rows, bool) or int(extra_rows) != extra_rows or int(extra_rows) < 0:
            raise FrspecError(f"context rows must be a non-negative integer, got {extra_rows}")
        self.extra_rows = int(extra_rows)
        self.packed_all = None  # the whole ranked head quantized once (quantize_head); None while float
        self._packed_rows: dict[int, nn.Module] = {}  # k -> packed_all.first_rows(k), made on first use
        self.register_buffer("ctx_weight", self.weight_all.new_zeros(self.extra_rows, self.weight_all.shape[1]),
                             persistent=False)
        self.register_buffer("ctx_bias", None if self.bias_all is None else self.bias_all.new_zeros(self.extra_rows),
                             persistent=False)
        self.register_buffer("ctx_ids", torch.full((self.extra_rows,), -1, dtype=torch.long,
                                                   device=self.weight_all.device), persistent=False)
        self.ctx_ranks = torch.full((self.extra_rows,), n, dtype=torch.long)
        self.n_ctx = 0
        self.dropped_tokens = 0
        self.context_floor = 0
        self._in_ctx = torch.zeros(self.vocab_size, dtype=torch.bool)
        self._k = n
        self._activate()

    @classmethod
    def build(
        cls,
        weight: torch.Tensor,
        ranking: Ranking,
        bias: torch.Tensor | None = None,
        head_to_target: torch.Tensor | None = None,
        vocab_size: int | None = None,
        size: int | None = None,
        extra_rows: int = 0,
    ) -> RankedVocab:
        """The ranked head of an LM head `weight` [rows, hidden] (+ `bias`), ordered by `ranking`, active size
        `size` (default: the whole head). `head_to_target` and `vocab_size` are as for `DraftVocab.build`;
        `extra_rows`: context-aware rows for the request's own tokens (module docstring)."""
        # The plain vocabulary (no copy) validates head_to_target and the sizes exactly as DraftVocab does.
        if vocab_size is None and isinstance(ranking, (TokenMap, TokenCounts)):
            vocab_size = ranking.vocab_size
        plain = DraftVocab.build(weight, bias, head_to_target=head_to_target, vocab_size=vocab_size)
        vocab_size = plain.vocab_size
        head_to_target = plain.target_ids
        order, counts, token_map = _order(ranking, vocab_size)
        row_of = torch.arange(vocab_size) if head_to_target is None else position_of(head_to_target.cpu(), vocab_size)
        ranked = order[row_of[order] >= 0]
        if ranked.numel() == 0:
            raise FrspecError("the ranking and the head's draft vocabulary have no token in common")
        seen = torch.zeros(vocab_size, dtype=torch.bool)
        seen[ranked] = True
        rest = torch.nonzero((row_of >= 0) & ~seen).flatten()  # every other scorable id, by id
        target_ids = torch.cat([ranked, rest])
        prior = None
        if counts is not None:
            covered = torch.cumsum(counts[target_ids].double(), 0)
            total = float(counts.sum())
            prior = (covered / total).float() if total > 0 else None
        if token_map is None:
            token_map = TokenMap(ranked, vocab_size, {"source": "ranking"})
        device = weight.device
        vocab = cls(weight, bias, vocab_size, row_of[target_ids].to(device), target_ids.to(device),
                    int(ranked.numel()), token_map, prior, extra_rows)
        if size is not None:
            vocab.set_size(size)
        return vocab

    # -- the active size -----------------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Rows scored per draft step: the first k, plus the request's context rows."""
        return self._k + self.n_ctx

    @property
    def map_size(self) -> int:
        """k: the active map size (the first k ranked rows)."""
        return self._k

    @property
    def is_restricted(self) -> bool:
        """True while a map restricts the head: k below the whole head."""
        return self._k < self.full_size

    def set_size(self, k: int) -> None:
        """Score the first k rows from now on (k = full_size: the whole head, no map)."""
        if isinstance(k, bool) or int(k) != k or not 1 <= int(k) <= self.full_size:
            raise FrspecError(f"a map size must be an integer in [1, {self.full_size}] for this head, got {k!r}")
        self._k = int(k)
        self._activate()

    def coverage(self, k: int) -> float | None:
        """The ranking corpus's share covered by the first k rows (None without counts)."""
        return None if self.coverage_prior is None else float(self.coverage_prior[int(k) - 1])

    def logits(self, hidden: torch.Tensor, k: int | None = None) -> torch.Tensor:
        """Scores over the first k rows (default: the active size) for hidden states [..., hidden], then over the
        request's context rows (those whose token is among the first k: -inf)."""
        if k is None:
            k, main = self._k, self.head(hidden)
        else:
            if isinstance(k, bool) or int(k) != k or not 1 <= int(k) <= self.full_size:
                raise FrspecError(f"a map size must be an integer in [1, {self.full_size}] for this head, got {k!r}")
            k = int(k)
            if self.packed_all is not None:
                main = self._first_rows(k)(hidden)
            else:
                main = F.linear(hidden, self.weight_all[:k], None if self.bias_all is None else self.bias_all[:k])
        if not self.n_ctx:
            return main
        n = self.n_ctx
        ctx = F.linear(hidden, self.ctx_weight[:n], None if self.ctx_bias is None else self.ctx_bias[:n])
        held = (self.ctx_ranks[:n] < k).to(ctx.device)
        if bool(held.any()):
            ctx = ctx.masked_fill(held, float("-inf"))
        return torch.cat([main, ctx], dim=-1)

    forward = logits

    def to_target(self, draft_idx: torch.Tensor) -> torch.Tensor:
        return (self.target_ids if self.n_ctx else self.target_ids_all)[draft_idx]

    def to_full(self, probs: torch.Tensor) -> torch.Tensor:
        width = int(probs.shape[-1])
        full = probs.new_zeros(*probs.shape[:-1], self.vocab_size)
        if self.n_ctx and width == self.size:
            # A context row whose token is also among the first k has probability 0: add, do not overwrite.
            return full.index_add_(-1, self.target_ids.to(probs.device), probs)
        full[..., self.target_ids_all[:width].to(probs.device)] = probs
        return full

    def ranks(self, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """The row (rank) of each target id; full_size for ids the head cannot score; 0 for the request's context
        rows (scored at every size)."""
        ids = torch.as_tensor(token_ids, dtype=torch.long).cpu()
        ranks = self.rank_of[ids]
        if self.n_ctx:
            ranks = torch.where(self._in_ctx[ids], torch.zeros_like(ranks), ranks)
        return ranks

    # -- context rows ----------------------------------------------------------------------------------------------

    @property
    def context_rows(self) -> int:
        """How many rows hold the request's own tokens now (as ContextVocab.context_rows)."""
        return self.n_ctx

    def set_context_floor(self, k: int) -> None:
        """Context rows only for tokens ranked at or beyond `k` (the smallest size ever chosen: ranks below it are
        always among the first k rows already)."""
        self.context_floor = max(int(k), 0)

    def begin_request(self, prompt_ids) -> None:
        """A request starts: its context rows are the prompt's tokens (the previous request's are dropped)."""
        if not self.extra_rows:
            return
        self._in_ctx[self.ctx_ids[: self.n_ctx].cpu()] = False
        self.n_ctx = 0
        self.dropped_tokens = 0
        self.add_tokens(prompt_ids)

    def add_tokens(self, ids) -> None:
        """Take the request's tokens (accepted since the last proposal) into free context rows: distinct, ranked
        at or beyond the floor, the head can score them, not there yet; the more frequent in `ids` first."""
        if not self.extra_rows:
            return
        ids = torch.as_tensor(ids, dtype=torch.long).flatten().cpu()
        if ids.numel() == 0:
            return
        uniq, counts = torch.unique(ids, return_counts=True)
        ranks = self.rank_of[uniq]
        new = (ranks >= self.context_floor) & (ranks < self.full_size) & ~self._in_ctx[uniq]
        uniq, counts, ranks = uniq[new], counts[new], ranks[new]
        order = rank_by_count(counts)
        free = self.extra_rows - self.n_ctx
        taken, ranks = uniq[order[:free]], ranks[order[:free]]
        self.dropped_tokens += int(uniq.numel() - taken.numel())
        m = int(taken.numel())
        if m == 0:
            return
        start = self.n_ctx
        with torch.no_grad():
            rows = ranks.to(self.weight_all.device)
            self.ctx_weight[start: start + m].copy_(self.weight_all.index_select(0, rows))
            if self.ctx_bias is not None:
                self.ctx_bias[start: start + m].copy_(self.bias_all.index_select(0, rows))
        self.ctx_ids[start: start + m] = taken.to(self.ctx_ids.device)
        self.ctx_ranks[start: start + m] = ranks
        self._in_ctx[taken] = True
        self.n_ctx += m
        self._activate()

    def quantize_head(self, quantize) -> bool:
        """Quantize the whole ranked matrix once (`quantize`: nn.Linear -> a weight-only int4/int8 layer,
        models/quant.py); every size k is then the packed layer's `first_rows(k)`, views of the one packed weight,
        and the float copy is dropped. True when it did. Refused with context rows (they copy float rows per
        request) and where the layout cannot be cut to its first rows (CUDA's int4)."""
        if self.packed_all is not None:
            return False
        if self.extra_rows:
            raise FrspecError("a quantized ranked head takes no context rows (they copy float rows per request)")
        linear = nn.Linear(self.weight_all.shape[1], self.full_size, bias=self.bias_all is not None,
                           device="meta")
        linear.weight = nn.Parameter(self.weight_all, requires_grad=False)
        if self.bias_all is not None:
            linear.bias = nn.Parameter(self.bias_all, requires_grad=False)
        packed = quantize(linear)
        if not hasattr(packed, "first_rows"):
            raise FrspecError(f"a ranked head cannot be served by a {type(packed).__name__}: it needs its first rows")
        packed.first_rows(self.full_size)  # a layout that cannot be cut refuses here, in one line
        self.packed_all = packed
        self.weight_all = None  # one copy of the head: the packed one
        self.bias_all = None
        self._activate()
        return True

    def _activate(self) -> None:
        """Point the head, target ids and rows at the first k rows (views: nothing is copied)."""
        k = self._k
        if self.packed_all is not None:
            self.head = self._first_rows(k)
        else:
            self.head.weight = nn.Parameter(self.weight_all[:k], requires_grad=False)
            if self.bias_all is not None:
                self.head.bias = nn.Parameter(self.bias_all[:k], requires_grad=False)
            self.head.out_features = k
        self.target_ids = self.target_ids_all[:k]
        self.rows = self.rows_all[:k]
        if self.n_ctx:
            n = self.n_ctx
            self.target_ids = torch.cat([self.target_ids, self.ctx_ids[:n]])
            self.rows = torch.cat([self.rows, self.rows_all[self.ctx_ranks[:n].to(self.rows_all.device)]])

    def _first_rows(self, k: int) -> nn.Module:
        """The packed head's first k rows, kept per k (a handful of sizes: each keeps only its small scale table)."""
        layer = self._packed_rows.get(k)
        if layer is None:
            layer = self._packed_rows[k] = self.packed_all.first_rows(k)
        return layer

    def _apply(self, fn, recurse=True):
        # `.to()`/`.half()` convert parameters and buffers one by one; the views must point into the new matrix.
        self._packed_rows.clear()
        super()._apply(fn, recurse)
        self._activate()
        return self

    def extra_repr(self) -> str:
        context = f", context rows {self.n_ctx} of {self.extra_rows}" if self.extra_rows else ""
        return (f"rows={self._k} of {self.full_size} (ranked {self.ranked_size}), vocab_size={self.vocab_size}"
                f"{context}")


def _order(ranking: Ranking, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor | None, TokenMap | None]:
    """(ids in rank order, counts over the vocabulary or None, the ranking as a TokenMap or None).

    The tokens every map must keep (special and chat-template tokens: a map's `kept_tokens`, counts'
    `keep_tokens`) rank first, so that every prefix of at least that many rows holds them, as every map
    `TokenMap.from_counts` selects does: the first k rows are then that k-map's ids."""
    if isinstance(ranking, TokenMap):
        ranking.check_vocab_size(vocab_size, "the draft head's target")
        counts = None
        if ranking.counts is not None:
            counts = torch.zeros(vocab_size, dtype=torch.long)
            counts[ranking.ids] = ranking.counts
        kept = ranking.metadata.get("kept_tokens") or {}
        return _kept_first(ranking.ids.cpu(), kept.values()), counts, ranking
    if isinstance(ranking, TokenCounts):
        if ranking.vocab_size != vocab_size:
            raise FrspecError(f"the counts cover {ranking.vocab_size} ids but the draft head's target has {vocab_size}")
        return _kept_first(rank_by_count(ranking.counts), ranking.keep_tokens.values()), ranking.counts, None
    ranking = torch.as_tensor(ranking)
    if ranking.dim() != 1 or ranking.dtype.is_floating_point or ranking.dtype == torch.bool:
        raise FrspecError("a ranking is a TokenMap, TokenCounts, or a 1-D list of token ids (most frequent first)")
    ids = ranking.to(torch.long)
    TokenMap(ids, vocab_size)  # one-line errors for out-of-range or repeated ids
    return ids, None, None


def _kept_first(order: torch.Tensor, kept) -> torch.Tensor:
    kept = torch.as_tensor(sorted({int(i) for i in kept}), dtype=torch.long)
    if kept.numel() == 0:
        return order
    is_kept = torch.isin(order, kept)
    return torch.cat([order[is_kept], order[~is_kept]])
