"""Where the plugin's configuration comes from: environment variables, read in every vLLM process (workers inherit
the environment of the process that starts them)."""

from __future__ import annotations

import os

from frspec.vocab.token_map import TokenMap

TOKEN_MAP_ENV = "FRSPEC_TOKEN_MAP"
TOKEN_MAP_FORMAT_ENV = "FRSPEC_TOKEN_MAP_FORMAT"


def token_map_path() -> str | None:
    """The configured token map file, or None (FR-Spec off)."""
    return os.environ.get(TOKEN_MAP_ENV) or None


def load_configured_map(vocab_size: int) -> TokenMap:
    """The configured map, read for a vocabulary of `vocab_size` ids (formats that record a size must match it)."""
    path = token_map_path()
    assert path is not None, "load_configured_map needs FRSPEC_TOKEN_MAP"
    return TokenMap.load(path, format=os.environ.get(TOKEN_MAP_FORMAT_ENV) or None, vocab_size=vocab_size)
