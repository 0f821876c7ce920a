"""The llama.cpp peer row: which GGUF it loads, and one-line errors when it cannot run."""

from __future__ import annotations

import pytest

from frspec.bench import llamacpp
from frspec.errors import FrspecError


def test_gguf_file_takes_a_gguf_path_and_refuses_anything_else(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    assert llamacpp.gguf_file(str(path)) == path
    with pytest.raises(FrspecError, match="needs a GGUF file"):
        llamacpp.gguf_file(str(tmp_path))


def test_missing_llama_cpp_python_is_a_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setattr(llamacpp, "available", lambda: False)
    with pytest.raises(FrspecError, match="pip install"):
        llamacpp.LlamaCppGreedy(tmp_path / "m.gguf", threads=1)
