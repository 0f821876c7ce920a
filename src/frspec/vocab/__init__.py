"""Token maps for FR-Spec: count a corpus, select its frequent vocabulary, convert between engine formats, inspect
coverage. Names are imported lazily so that `import frspec.vocab` (and the CLI's help) does not load torch."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TokenMap": "frspec.vocab.token_map",
    "select_ids": "frspec.vocab.token_map",
    "rank_by_count": "frspec.vocab.token_map",
    "TokenCounts": "frspec.vocab.counts",
    "merge_counts": "frspec.vocab.counts",
    "count_tokens": "frspec.vocab.counting",
    "count_corpus": "frspec.vocab.counting",
    "Corpus": "frspec.vocab.corpus",
    "DraftVocab": "frspec.vocab.draft_vocab",
    "detect_format": "frspec.vocab.formats",
    "FORMATS": "frspec.vocab.formats",
    "coverage_curve": "frspec.vocab.coverage",
    "map_coverage": "frspec.vocab.coverage",
    "keep_token_ids": "frspec.vocab.special_tokens",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'frspec.vocab' has no attribute {name!r}")
