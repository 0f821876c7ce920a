"""Which EAGLE head `frspec bench --eagle` uses, and which target it runs on by default.

`--eagle default` is the head trained for Qwen2.5-Coder-0.5B-Instruct with `frspec train eagle` (docs/training.md)
into the model cache, `$FRSPEC_CACHE/heads/qwen2.5-coder-0.5b-instruct-eagle/`; anything else is a head
directory or hub id as for `frspec generate --eagle`. A head drafts for the target it was trained on, so the
EAGLE rows run on their own target (by default that 0.5B model), with that target's vanilla as their reference.
"""

from __future__ import annotations

import os
from pathlib import Path

from frspec.errors import FrspecError

DEFAULT_HEAD = "default"
# The target the default head was trained for: also the default --eagle-target.
DEFAULT_EAGLE_TARGET = "qwen2.5-coder-0.5b-instruct"
DEFAULT_HEAD_NAME = f"{DEFAULT_EAGLE_TARGET}-eagle"


def default_head_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where `frspec train eagle` is expected to have written the default head."""
    from frspec.models.cache import cache_root

    return cache_root(cache_dir) / "heads" / DEFAULT_HEAD_NAME


def resolve_eagle_head(spec: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The head directory for `--eagle spec` ("default", a directory, or a hub id), checked before any model loads."""
    from frspec.models.eagle_loading import resolve_head_dir

    if spec == DEFAULT_HEAD:
        directory = default_head_dir(cache_dir)
        # Training writes config.json after the weights, so its presence marks a finished head.
        if not (directory / "config.json").is_file():
            raise FrspecError(
                f"no trained default EAGLE head in {directory}: train it with `frspec train eagle --target "
                f"{DEFAULT_EAGLE_TARGET} --out {directory} ...` (docs/training.md), or pass --eagle HEAD_DIR"
            )
        return directory
    return resolve_head_dir(spec)
