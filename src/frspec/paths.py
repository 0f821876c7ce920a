"""Where frspec keeps what it prepares: one cache root for models, tokenizers, heads and token maps."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The frspec cache root: $FRSPEC_CACHE, or ~/.cache/frspec."""
    return Path(os.environ.get("FRSPEC_CACHE") or Path.home() / ".cache" / "frspec")
