"""What a tokenizer is, as a small dict: counts and token maps record it, so ones made with different tokenizers
are never mixed."""

from __future__ import annotations

import hashlib
from typing import Any


def tokenizer_identity(tok: PreTrainedTokenizerBase) -> dict[str, Any]:
    """What a tokenizer is, for refusing to mix counts or maps of different tokenizers.

    `vocab_size` counts every id including added and special tokens; `vocab_hash` is a short hash over all
    (id, token) pairs, so two tokenizers with the same hash encode identically-numbered vocabularies.
    """
    vocab = tok.get_vocab()
    size = max(len(tok), max(vocab.values()) + 1 if vocab else 0)
    digest = hashlib.sha256()
    for token, idx in sorted(vocab.items(), key=lambda kv: kv[1]):
        digest.update(f"{idx}\t{token}\n".encode("utf-8", "surrogatepass"))
    return {"name": str(tok.name_or_path), "vocab_size": int(size), "vocab_hash": digest.hexdigest()[:16]}


def same_tokenizer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two `tokenizer_identity` dicts describe the same vocabulary (names may differ)."""
    return a.get("vocab_hash") == b.get("vocab_hash") and int(a.get("vocab_size", -1)) == int(b.get("vocab_size", -2))
