"""Corpus-writing helpers for the token-map tests."""

from __future__ import annotations

import json
from pathlib import Path


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def sharegpt(*turns: str) -> dict:
    """A ShareGPT record alternating human/gpt turns."""
    return {"id": "x", "conversations": [{"from": "human" if i % 2 == 0 else "gpt", "value": t} for i, t in enumerate(turns)]}
