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
