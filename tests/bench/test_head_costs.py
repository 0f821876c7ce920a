"""scripts/head_costs.py end to end on a tiny shape: every format (the int4 head both packed whole and in
row-sliced chunks), the table, and tune's chain model turned into a predicted speedup."""

from __future__ import annotations

import json
import sys

import torch

from scripts import head_costs  # the repository root is on the path (tests/ is a package); scripts/ a namespace


def test_head_costs_runs_and_predicts(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["head_costs.py", "--shapes", "tiny-mtp", "--rows", "1,4", "--repeats", "1",
                                      "--warmup", "0", "--threads", "1", "--out", str(tmp_path)])
    assert head_costs.main() == 0
    data = json.loads((tmp_path / "head_costs.json").read_text())
    seconds = data["seconds"]["tiny-mtp"]
    assert set(seconds) == {"bf16", "int8", "int4"}
    for m in seconds.values():
        assert set(m["head"]) == {"70000", "65536", "32768", "16384"}
        assert set(m["body"]) == {"1", "4"} and set(m["layer"]) == {"1", "2", "3", "4", "5"}
    preds = data["predictions"]["tiny-mtp"]["int4"]
    assert len(preds) == 4 * len(head_costs.ACCEPTANCE)
    assert all(1 <= p["k"] <= 4 and p["speedup"] > 0 for p in preds.values())
    table = (tmp_path / "head_costs.md").read_text()
    assert "| tiny-mtp | int4 | 4 |" in table and "| acceptance a | full head | 64k | 32k | 16k |" in table
    assert data["machine"]["cpu"] and "load_average_after" in data["machine"]


def test_chunked_int4_head_equals_the_head_packed_whole():
    """The CPU way of building heads too large to pack at once (16k-row chunks, then row slices) gives the same
    logits as packing each size whole (the CUDA way)."""
    shape = head_costs.Shape("t", 40_000, 64, None)
    whole = head_costs.build_heads(shape, "int4", [40_000, 16384], "cpu")
    chunked = head_costs.build_heads(shape, "int4", [40_000, 16384], "cpu", chunk_above=0)
    x = torch.randn(3, 64).bfloat16()
    for size in (40_000, 16384):
        torch.testing.assert_close(whole[size].module(x), chunked[size].module(x), rtol=0, atol=0)
