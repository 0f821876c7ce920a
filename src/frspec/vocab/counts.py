"""TokenCounts: how often each id of a vocabulary occurred in a corpus, with where the counts came from.

Stored as safetensors: one int64 tensor `counts` over the full vocabulary, and the metadata as JSON under the
`frspec_counts` key. Counts from several shards of a corpus add up with `merge_counts`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from frspec.errors import FrspecError
from frspec.io import atomic_path
from frspec.vocab.tokenizer_identity import same_tokenizer

COUNTS_METADATA_KEY = "frspec_counts"
COUNTS_FORMAT_VERSION = 1


class TokenCounts:
    """An int64 count for every id of a vocabulary, plus metadata.

    Metadata keys written by `count_corpus`: `tokenizer` (see `tokenizer_identity`), `vocab_size`, `documents`,
    `tokens`, `inputs`, `assistant_only`, `add_special_tokens`, `keep_tokens` ({token: id} that every map built
    from these counts must keep: special, added and chat-template tokens), `seconds`.
    """

    def __init__(self, counts: torch.Tensor, metadata: dict[str, Any] | None = None):
        counts = torch.as_tensor(counts)
        if counts.dim() != 1 or counts.numel() == 0:
            raise FrspecError(f"token counts must be a non-empty 1-D tensor, got shape {tuple(counts.shape)}")
        if counts.dtype.is_floating_point or counts.dtype == torch.bool:
            raise FrspecError(f"token counts must be integers, got {counts.dtype}")
        counts = counts.to(torch.int64)
        if bool((counts < 0).any()):
            raise FrspecError("token counts must not be negative")
        self.counts: torch.Tensor = counts.contiguous()
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.metadata["vocab_size"] = self.vocab_size

    @property
    def vocab_size(self) -> int:
        return int(self.counts.numel())

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @property
    def distinct(self) -> int:
        return int((self.counts > 0).sum())

    @property
    def keep_tokens(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in self.metadata.get("keep_tokens", {}).items()}

    def __repr__(self) -> str:
        return f"TokenCounts(vocab_size={self.vocab_size}, tokens={self.total}, distinct={self.distinct})"

    def save(self, path: str | Path) -> None:
        """Write atomically as safetensors."""
        meta = {COUNTS_METADATA_KEY: json.dumps({"version": COUNTS_FORMAT_VERSION, **self.metadata})}
        with atomic_path(path) as tmp:
            save_file({"counts": self.counts}, str(tmp), metadata=meta)

    @classmethod
    def load(cls, path: str | Path) -> "TokenCounts":
        """Read a counts file written by `save`; anything else is a one-line `FrspecError`."""
        path = Path(path)
        if not path.is_file():
            raise FrspecError(f"counts file not found: {path}")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                if COUNTS_METADATA_KEY not in meta or "counts" not in f.keys():
                    raise FrspecError(f"{path} is not a token-counts file (make one with `frspec vocab count`)")
                counts = f.get_tensor("counts")
                metadata = json.loads(meta[COUNTS_METADATA_KEY])
        except FrspecError:
            raise
        except Exception as e:  # safetensors raises assorted errors on garbage; all mean "corrupt"
            raise FrspecError(f"cannot read counts file {path}: {_one_line(e)}") from e
        metadata.pop("version", None)
        return cls(counts, metadata)


def merge_counts(parts: list[TokenCounts]) -> TokenCounts:
    """Add counts of several runs (shards of one corpus). Counts of different tokenizers are refused."""
    if not parts:
        raise FrspecError("nothing to merge")
    first = parts[0]
    for i, other in enumerate(parts[1:], 2):
        if other.vocab_size != first.vocab_size:
            raise FrspecError(
                f"cannot merge counts over {first.vocab_size} ids with counts over {other.vocab_size} ids (input {i})"
            )
        a, b = first.metadata.get("tokenizer"), other.metadata.get("tokenizer")
        if a and b and not same_tokenizer(a, b):
            raise FrspecError(
                f"cannot merge counts of different tokenizers: {a.get('name')!r} ({a.get('vocab_hash')}) "
                f"and {b.get('name')!r} ({b.get('vocab_hash')}) (input {i})"
            )
    total = torch.stack([p.counts for p in parts]).sum(0)
    meta: dict[str, Any] = {k: v for k, v in first.metadata.items()}
    for key in ("documents", "tokens", "seconds", "skipped_bytes"):
        if all(key in p.metadata for p in parts):
            meta[key] = sum(p.metadata[key] for p in parts)
    meta["inputs"] = [x for p in parts for x in p.metadata.get("inputs", [])]
    keep: dict[str, int] = {}
    for p in parts:
        keep.update(p.keep_tokens)
    meta["keep_tokens"] = keep
    for flag in ("assistant_only", "add_special_tokens", "field"):
        values = {json.dumps(p.metadata.get(flag)) for p in parts}
        if len(values) > 1:
            meta[flag] = "mixed"
    meta["merged_from"] = len(parts)
    return TokenCounts(total, meta)


def mix_counts(parts: list[tuple[TokenCounts, float]], scale: int = 1 << 40) -> TokenCounts:
    """Counts of a mixture of corpora: each part normalized to its share of the tokens, weighted, then added
    (rounded to integers on a scale of `scale` tokens), so a small corpus weighs as much as its weight says, not
    as its size. Same vocabulary and tokenizer checks as `merge_counts`; the weights are recorded."""
    if not parts:
        raise FrspecError("nothing to mix")
    if any(w < 0 for _, w in parts) or sum(w for _, w in parts) <= 0:
        raise FrspecError("mixture weights must be non-negative and not all zero")
    merged = merge_counts([c for c, _ in parts])  # the checks, and the merged metadata
    total_weight = sum(w for _, w in parts)
    mixed = torch.zeros(merged.vocab_size, dtype=torch.float64)
    for counts, weight in parts:
        if counts.total <= 0:
            raise FrspecError("cannot mix empty counts")
        mixed += counts.counts.to(torch.float64) * (weight / total_weight / counts.total)
    meta = dict(merged.metadata)
    meta["mixture"] = [{"weight": w, "tokens": c.total, "source": c.metadata.get("source") or c.metadata.get("slice")}
                       for c, w in parts]
    meta.pop("merged_from", None)
    return TokenCounts(torch.round(mixed * scale).to(torch.int64), meta)


def _one_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
