"""The llama.cpp peer row: which GGUF it loads, and one-line errors when it cannot run."""

from __future__ import annotations

import pytest

from frspec.bench import llamacpp
from frspec.bench.quant_compare import render_markdown
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


def test_report_table_renders_missing_values_as_dashes():
    payload = {
        "meta": {"commit": "abc", "machine": {"cpu": "cpu"}, "threads": 2, "prompt_ids": ["p"], "max_new_tokens": 8,
                 "target": "t", "draft": "d", "token_map": {"size": 32768}, "load_average_after_run": [1.0, 2.0, 3.0]},
        "rows": [{"method": "frspec int4 vanilla", "tokens_per_s": 10.0, "vs_llamacpp": None, "vs_int4_vanilla": 1.0,
                  "vs_same_draft_without_map": None, "acceptance_length": None, "forward_ratio": None,
                  "lm_head_share": None, "greedy_identical_to_int4_vanilla": None,
                  "tokens_agreeing_with_int4_vanilla": 8, "tokens": 8}],
        "row_costs_s": {"int4 target": {"1": 0.01, "2": 0.012}},
        "divergences": [],
    }
    text = render_markdown(payload)
    assert "| frspec int4 vanilla | 10.00 | - | 1.00x | - |" in text and "| 2 | 12.0 |" in text
