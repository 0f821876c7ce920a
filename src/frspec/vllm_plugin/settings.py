"""Where the plugin's configuration comes from: environment variables, read in every vLLM process (workers inherit
the environment of the process that starts them)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from frspec.errors import FrspecError
from frspec.vocab.context_vocab import BUDGETS
from frspec.vocab.token_map import TokenMap

TOKEN_MAP_ENV = "FRSPEC_TOKEN_MAP"
TOKEN_MAP_FORMAT_ENV = "FRSPEC_TOKEN_MAP_FORMAT"
CONTEXT_ROWS_ENV = "FRSPEC_CONTEXT_ROWS"
CONTEXT_BUDGET_ENV = "FRSPEC_CONTEXT_BUDGET"


def token_map_path() -> str | None:
    """The configured token map file, or None (FR-Spec off)."""
    return os.environ.get(TOKEN_MAP_ENV) or None


def load_configured_map(vocab_size: int) -> TokenMap:
    """The configured map, read for a vocabulary of `vocab_size` ids (formats that record a size must match it)."""
    path = token_map_path()
    assert path is not None, "load_configured_map needs FRSPEC_TOKEN_MAP"
    return TokenMap.load(path, format=os.environ.get(TOKEN_MAP_FORMAT_ENV) or None, vocab_size=vocab_size)


@dataclass(frozen=True)
class ContextSetting:
    """Context-aware drafting: `extra_rows` rows for the running requests' own tokens under `budget` (see
    frspec.vocab.context_vocab)."""

    extra_rows: int
    budget: str


def context_setting() -> ContextSetting | None:
    """FRSPEC_CONTEXT_ROWS (rows for the requests' tokens; unset or 0: the static map) and FRSPEC_CONTEXT_BUDGET
    (fixed, the default: the rows displace the map's least frequent ones; additive: they come on top)."""
    text = (os.environ.get(CONTEXT_ROWS_ENV) or "").strip()
    budget = (os.environ.get(CONTEXT_BUDGET_ENV) or "fixed").strip()
    if budget not in BUDGETS:
        raise FrspecError(f"{CONTEXT_BUDGET_ENV} must be one of {', '.join(BUDGETS)}, got {budget!r}")
    if not text:
        return None
    try:
        rows = int(text)
    except ValueError:
        raise FrspecError(f"{CONTEXT_ROWS_ENV} must be a non-negative integer, got {text!r}") from None
    if rows < 0:
        raise FrspecError(f"{CONTEXT_ROWS_ENV} must be a non-negative integer, got {rows}")
    return ContextSetting(rows, budget) if rows else None
