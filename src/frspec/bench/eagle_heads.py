"""Which EAGLE head `frspec bench --eagle` uses, and which target it runs on by default.

`--eagle default` is the head for Qwen2.5-Coder-0.5B-Instruct that `frspec models prepare --only eagle-head` trains
into the model cache, `$FRSPEC_CACHE/heads/qwen2.5-coder-0.5b-instruct-eagle/` (frspec.train.default_head); anything
else is a head
directory or hub id as for `frspec generate --eagle`. A head drafts for the target it was trained on, so the
EAGLE rows run on their own target (by default that 0.5B model), with that target's vanilla as their reference.
"""

from __future__ import annotations

import os
from pathlib import Path

from frspec.errors import FrspecError

from frspec.train.default_head import DEFAULT_EAGLE_TARGET, DEFAULT_HEAD_NAME, default_head_dir, is_head_ready

DEFAULT_HEAD = "default"
# `--eagle mtp`: the EAGLE rows draft with the EAGLE target's own MTP layers (models/mtp.py), read from its directory.
MTP_HEAD = "mtp"
__all__ = ["DEFAULT_HEAD", "MTP_HEAD", "DEFAULT_EAGLE_TARGET", "DEFAULT_HEAD_NAME", "default_head_dir", "resolve_eagle_head"]


def resolve_eagle_head(spec: str, cache_dir: str | os.PathLike | None = None) -> Path | None:
    """The head directory for `--eagle spec` ("default", a directory, or a hub id), checked before any model loads;
    None for "mtp" (the target's own directory holds its MTP layers)."""
    from frspec.models.eagle_loading import resolve_head_dir

    if spec == MTP_HEAD:
        return None

    if spec == DEFAULT_HEAD:
        directory = default_head_dir(cache_dir)
        if not is_head_ready(directory):
            raise FrspecError(
                f"no trained default EAGLE head in {directory}: train it with `frspec models prepare --only "
                "eagle-head` (about 1.5 hours on a 2-core CPU; docs/training.md), or pass --eagle HEAD_DIR"
            )
        return directory
    return resolve_head_dir(spec)
