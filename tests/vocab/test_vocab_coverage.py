"""Coverage curves, held-out coverage, map coverage and the plot."""

from __future__ import annotations

import pytest
import torch

from frspec.errors import FrspecError
from frspec.vocab.coverage import coverage_curve, map_coverage, plot_coverage, table_sizes

RANK = torch.tensor([0, 40, 30, 20, 10])  # order: 1, 2, 3, 4, 0
HELD_OUT = torch.tensor([50, 10, 0, 20, 20])


def test_curve_on_the_ranking_counts():
    assert coverage_curve(RANK).tolist() == pytest.approx([0.4, 0.7, 0.9, 1.0, 1.0])


def test_curve_measured_on_held_out_counts_keeps_the_ranking():
    assert coverage_curve(RANK, HELD_OUT).tolist() == pytest.approx([0.1, 0.1, 0.3, 0.5, 1.0])


def test_map_coverage():
    assert map_coverage(torch.tensor([1, 3]), HELD_OUT) == pytest.approx(0.3)
    with pytest.raises(FrspecError, match="outside"):
        map_coverage(torch.tensor([7]), HELD_OUT)


def test_mismatched_or_empty_counts_are_errors():
    with pytest.raises(FrspecError, match="different vocabularies"):
        coverage_curve(RANK, torch.ones(3, dtype=torch.long))
    with pytest.raises(FrspecError, match="empty"):
        coverage_curve(torch.zeros(5, dtype=torch.long))


def test_table_sizes():
    assert table_sizes(1000, extra=[300, 5000]) == [256, 300, 512, 1000]
    assert table_sizes(151_936)[-3:] == [65536, 131072, 151_936]


def test_plot_writes_a_png(tmp_path):
    counts = torch.randint(0, 100, (70_000,))
    plot_coverage({"a": coverage_curve(counts), "b": coverage_curve(counts, counts.flip(0))}, tmp_path / "c.png",
                  maps={"map": 32768})
    data = (tmp_path / "c.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert [p.name for p in tmp_path.iterdir()] == ["c.png"]  # no temporary file left behind


def test_context_coverage_counts_prompt_tokens_at_equal_rows():
    from frspec.vocab.coverage import context_coverage
    from frspec.vocab.token_map import TokenMap

    tm = TokenMap([1, 2, 3, 4], vocab_size=20, metadata={"kept_tokens": {"<eos>": 4}})
    # Prompt 1 holds 9 and 8; its answer uses 1, 9, 9, 3 (3 is the map's least frequent displaceable id).
    examples = [([9, 9, 8], [1, 9, 9, 3]), ([5], [5, 6, 4])]
    fixed = context_coverage(examples, tm, extra_rows=2, budget="fixed")
    assert fixed["tokens"] == 7 and fixed["examples"] == 2 and fixed["rows"] == 4
    assert fixed["static"] == pytest.approx(3 / 7)  # 1, 3, 4
    # Example 1: rows {1, 4, 9, 8} -> 1, 9, 9 (3 displaced); example 2: rows {1, 4, 2, 5} -> 5, 4.
    assert fixed["context"] == pytest.approx(5 / 7)
    additive = context_coverage(examples, tm, extra_rows=2, budget="additive")
    assert additive["context"] == pytest.approx(6 / 7)  # nothing displaced; 6 never seen
    assert additive["rows"] == pytest.approx((4 * 6 + 3 * 5) / 7)
    # Following the generated tokens: 6 is added after its first (missed) occurrence.
    followed = context_coverage([([5], [6, 6, 6])], tm, extra_rows=2, budget="additive", follow=True)
    assert followed["context"] == pytest.approx(2 / 3) and followed["static"] == 0


def test_context_coverage_with_no_continuation_is_an_error():
    from frspec.vocab.coverage import context_coverage
    from frspec.vocab.token_map import TokenMap

    with pytest.raises(FrspecError, match="no continuation tokens"):
        context_coverage([([1], [])], TokenMap([1], vocab_size=5), extra_rows=0)
