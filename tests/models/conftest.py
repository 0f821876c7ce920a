"""Fixtures for the model tests; the tiny models themselves are built in tiny_gguf_models.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import Qwen2ForCausalLM

from tests.models.tiny_gguf_models import write_tiny_gguf


@pytest.fixture
def cache_root(tmp_path, monkeypatch) -> Path:
    """An empty frspec cache, also set as $FRSPEC_CACHE so nothing reaches the user's real cache."""
    root = tmp_path / "frspec-cache"
    monkeypatch.setenv("FRSPEC_CACHE", str(root))
    return root


@pytest.fixture
def tiny_gguf(tmp_path) -> tuple[Path, Qwen2ForCausalLM]:
    path = tmp_path / "gguf" / "tiny-qwen2.gguf"
    path.parent.mkdir()
    return path, write_tiny_gguf(path)
