"""TokenMap: the frequency-ranked subset of a vocabulary that an FR-Spec drafter's LM head is restricted to,
and how to select one from token counts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import torch

from frspec.errors import FrspecError
from frspec.vocab import formats
from frspec.vocab.counts import TokenCounts


class TokenMap:
    """An ordered list of kept token ids over a vocabulary of `vocab_size` ids.

    Draft index i (the row of the pruned LM head) stands for target token id `ids[i]`. Ids are unique, in range,
    and conventionally in descending frequency order.

    `counts`, when known, holds the corpus count of each kept id (same order as `ids`); formats that store
    frequencies (vllm-scores) use it.
    """

    def __init__(
        self,
        ids: Sequence[int] | torch.Tensor,
        vocab_size: int,
        metadata: dict[str, Any] | None = None,
        counts: Sequence[int] | torch.Tensor | None = None,
    ):
        """Validate and store; any bad input is a one-line `FrspecError`."""
        ids_t = torch.as_tensor(ids)
        if ids_t.dim() != 1:
            raise FrspecError(f"token map ids must be a 1-D list, got shape {tuple(ids_t.shape)}")
        if ids_t.numel() == 0:
            raise FrspecError("token map is empty")
        if ids_t.dtype.is_floating_point or ids_t.dtype == torch.bool:
            raise FrspecError(f"token map ids must be integers, got {ids_t.dtype}")
        ids_t = ids_t.to(torch.long)
        vocab_size = int(vocab_size)
        if vocab_size <= 0:
            raise FrspecError(f"token map vocab_size must be positive, got {vocab_size}")
        if ids_t.numel() > vocab_size:
            raise FrspecError(f"token map has {ids_t.numel()} ids but the vocabulary has only {vocab_size}")
        lo, hi = int(ids_t.min()), int(ids_t.max())
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise FrspecError(f"token map id {bad} is out of range for a vocabulary of {vocab_size}")
        if torch.unique(ids_t).numel() != ids_t.numel():
            uniq, repeats = torch.unique(ids_t, return_counts=True)
            raise FrspecError(f"token map has duplicated id {int(uniq[repeats > 1][0])}")
        self.ids: torch.Tensor = ids_t.contiguous()
        self.vocab_size: int = vocab_size
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.counts: torch.Tensor | None = None
        if counts is not None:
            counts_t = torch.as_tensor(counts).to(torch.long)
            if counts_t.shape != self.ids.shape or bool((counts_t < 0).any()):
                raise FrspecError(f"token map counts must be {self.k} non-negative integers, one per kept id")
            self.counts = counts_t.contiguous()

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
            source = f" {self.metadata['path']}" if self.metadata.get("path") else ""
            raise FrspecError(
                f"token map{source} was built for a vocabulary of {self.vocab_size} ids but {what} has "
                f"{int(vocab_size)}"
            )

    def check_tokenizer(self, identity: Mapping[str, Any], vocab_size: int | None = None) -> None:
        """Refuse a map made for another tokenizer (`tokenizer_identity` dict), or for another model vocabulary.

        A map that records its tokenizer must match it by vocabulary hash. One that does not (thunlp, eagle3) must
        span exactly the tokenizer's ids, unless the model's `vocab_size` is given: then it must equal that, and
        the tokenizer must fit in it (a model's LM head may have more rows than its tokenizer has ids).
        """
        recorded = self.metadata.get("tokenizer")
        if recorded and recorded.get("vocab_hash") and recorded.get("vocab_hash") != identity.get("vocab_hash"):
            raise FrspecError(
                f"token map was built for tokenizer {recorded.get('name')!r} (vocab {recorded.get('vocab_hash')}), "
                f"not {identity.get('name')!r} (vocab {identity.get('vocab_hash')})"
            )
        if vocab_size is not None:
            self.check_vocab_size(vocab_size, "the model")
            if int(identity["vocab_size"]) > self.vocab_size:
                raise FrspecError(
                    f"token map covers {self.vocab_size} ids but tokenizer {identity.get('name')!r} has "
                    f"{identity['vocab_size']}"
                )
        elif not recorded and int(identity["vocab_size"]) != self.vocab_size:
            raise FrspecError(
                f"token map was built for a vocabulary of {self.vocab_size} ids but tokenizer {identity.get('name')!r} "
                f"has {identity['vocab_size']} (if the model's LM head is larger, give its size: --vocab-size)"
            )

    # -- files -------------------------------------------------------------------------------------------------

    @classmethod
    def load(
        cls, path: str | Path, format: str | None = None, vocab_size: int | None = None, threshold: float = 0.0
    ) -> "TokenMap":
        """Read a map in any supported format (detected from the content unless `format` is given).

        `vocab_size` is the model's vocabulary: formats that record one must match it, and it completes the thunlp
        format, which does not record it (without it, max id + 1 is assumed and `metadata["vocab_size_known"]` is
        False). `threshold` applies to vllm-scores files: ids scoring above it are kept.
        """
        parts = formats.read_token_map(path, format=format, vocab_size=vocab_size, threshold=threshold)
        try:
            token_map = cls(**parts)
        except FrspecError as e:  # name the file and the format it was read as
            raise FrspecError(f"{path} (read as a {parts['metadata']['format']} token map): {e}") from e
        if vocab_size is not None:
            token_map.check_vocab_size(vocab_size, "the model")
        return token_map

    def save(self, path: str | Path, format: str | None = None) -> str:
        """Write atomically; the format defaults from the extension (.pt/.pth -> thunlp, else frspec).
        Returns the format written."""
        return formats.write_token_map(self, path, format=format)

    # -- selection ---------------------------------------------------------------------------------------------

    @classmethod
    def from_counts(
        cls,
        counts: "TokenCounts | torch.Tensor",
        *,
        top_k: int | None = None,
        keep_fraction: float | None = None,
        coverage: float | None = None,
        keep: Mapping[str, int] | Iterable[int] | None = None,
    ) -> "TokenMap":
        """Select the most frequent ids: the top `top_k`, the top `keep_fraction` of the vocabulary, or the smallest
        k whose tokens cover at least `coverage` of the counted tokens (give exactly one).

        Always kept, and counted toward k: the counts' `keep_tokens` (EOS/EOT, special, added and chat-template
        tokens recorded when counting) and `keep` ({token: id} or ids). Ids come out by descending count, ties by
        id. The metadata records the selection, the coverage on these counts, and how many ids were forced in.
        """
        source = counts if isinstance(counts, TokenCounts) else TokenCounts(counts)
        named = dict(source.keep_tokens)
        if isinstance(keep, Mapping):
            named.update({str(t): int(i) for t, i in keep.items()})
            extra: list[int] = []
        else:
            extra = [int(i) for i in (keep or [])]
        forced = sorted(set(named.values()) | set(extra))
        ids, info = select_ids(
            source.counts, top_k=top_k, keep_fraction=keep_fraction, coverage=coverage, forced=forced
        )
        meta = source.metadata
        metadata = {
            "tokenizer": meta.get("tokenizer"),
            "selection": info["selection"],
            "coverage": info["coverage"],
            "counted_tokens": source.total,
            "forced": info["forced"],
            "forced_in": info["forced_in"],
            "kept_tokens": {t: i for t, i in sorted(named.items(), key=lambda kv: kv[1])},
            "source": {key: meta[key] for key in ("documents", "tokens", "inputs", "assistant_only", "field",
                                                  "records", "skip", "limit") if key in meta},
        }
        return cls(ids, source.vocab_size, metadata, counts=source.counts[ids])


def rank_by_count(counts: torch.Tensor) -> torch.Tensor:
    """All ids by descending count, ties by ascending id: the one frequency order used everywhere."""
    return torch.sort(counts, descending=True, stable=True).indices


def position_of(ids: torch.Tensor, size: int, missing: int = -1) -> torch.Tensor:
    """The inverse of a list of distinct ids: for every id below `size`, its index in `ids`, or `missing` where it
    is not there (on `ids`' device). An id's rank from `rank_by_count`'s order, a target id's row in a head."""
    out = torch.full((size,), missing, dtype=torch.long, device=ids.device)
    out[ids] = torch.arange(ids.numel(), device=ids.device)
    return out


def select_ids(
    counts: torch.Tensor,
    *,
    top_k: int | None = None,
    keep_fraction: float | None = None,
    coverage: float | None = None,
    forced: Sequence[int] = (),
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The selection behind `TokenMap.from_counts`, on a plain count tensor. Returns (ids, info)."""
    vocab_size = int(counts.numel())
    modes = {"top_k": top_k, "keep_fraction": keep_fraction, "coverage": coverage}
    given = {name: v for name, v in modes.items() if v is not None}
    if len(given) != 1:
        raise FrspecError("give exactly one of top_k (--top-k), keep_fraction (--keep-fraction), coverage (--coverage)")
    mode, value = next(iter(given.items()))
    total = int(counts.sum())
    if total <= 0:
        raise FrspecError("the counts are empty: no token was counted")
    forced_t = torch.as_tensor(sorted(set(int(i) for i in forced)), dtype=torch.long)
    if forced_t.numel() and (int(forced_t[0]) < 0 or int(forced_t[-1]) >= vocab_size):
        raise FrspecError(f"a token to keep is outside the {vocab_size}-id vocabulary of the counts")
    order = rank_by_count(counts)
    is_forced = torch.zeros(vocab_size, dtype=torch.bool)
    is_forced[forced_t] = True
    rest = order[~is_forced[order]]
    n_forced = int(forced_t.numel())

    if mode == "coverage":
        if not (isinstance(value, (int, float)) and 0.0 < float(value) <= 1.0):
            raise FrspecError(f"coverage must be in (0, 1], got {value}")
        target = min(total, math.ceil(float(value) * total - 1e-9 * total))
        base = int(counts[forced_t].sum())
        covered = base + torch.cumsum(counts[rest], 0)
        n_rest = 0 if base >= target else int(torch.searchsorted(covered, target)) + 1
        k = n_forced + n_rest
    else:
        if mode == "keep_fraction":
            if not (isinstance(value, (int, float)) and 0.0 < float(value) <= 1.0):
                raise FrspecError(f"keep fraction must be in (0, 1], got {value}")
            k = max(1, round(float(value) * vocab_size))
        else:
            if isinstance(value, bool) or int(value) != value:
                raise FrspecError(f"top-k must be an integer, got {value}")
            k = int(value)
            if k <= 0 or k > vocab_size:
                raise FrspecError(f"top-k must be between 1 and the vocabulary size {vocab_size}, got {k}")
        if k < n_forced:
            raise FrspecError(f"k={k} cannot hold the {n_forced} tokens that must always be kept (special tokens)")
        n_rest = k - n_forced

    chosen = torch.cat([forced_t, rest[:n_rest]])
    rank = position_of(order, vocab_size)
    ids = chosen[torch.argsort(rank[chosen])]
    info = {
        "selection": {"mode": mode, "value": value, "k": int(ids.numel())},
        "coverage": int(counts[ids].sum()) / total,
        "forced": n_forced,
        # Kept only because they are forced: by count alone they would not be in the top k.
        "forced_in": int((rank[forced_t] >= ids.numel()).sum()),
    }
    return ids, info
