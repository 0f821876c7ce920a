"""Fixtures for the model tests; the tiny models themselves are built in tiny_gguf_models.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import Qwen2ForCausalLM

from frspec.models import wide_linear

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


@pytest.fixture
def widen(monkeypatch):
    """Force the machine's answer to whether wide half-precision calls go through fp32 (models/wide_linear.py; the
    measurement is per process and cached)."""

    def set_to(on: bool) -> None:
        monkeypatch.setenv(wide_linear.ENV, "1" if on else "0")
        wide_linear.fp32_is_faster.cache_clear()

    yield set_to
    wide_linear.fp32_is_faster.cache_clear()
