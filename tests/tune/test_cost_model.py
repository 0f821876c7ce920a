"""The draft length follows the cost curve: flat curves favour longer chains, a jump caps them."""

from __future__ import annotations

import pytest
import torch

from frspec.bench.plots import plot_row_costs
from frspec.tune.cost_model import best_chain_length, chain_throughputs, expected_tokens, measure_row_costs
from tests.decode.spec_tiny import tiny_lm


def test_expected_tokens():
    assert expected_tokens(0, 0.5) == 1.0
    assert expected_tokens(3, 0.5) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(3, 1.0) == 4.0


def test_a_cost_jump_after_four_rows_caps_the_chain_at_three():
    int4_like = {n: (11.0 if n <= 2 else 13.0 if n <= 4 else 37.0) for n in range(1, 17)}
    assert best_chain_length(int4_like, acceptance=0.8, draft_cost=1.0) == 3
    flat = {n: 10.0 for n in range(1, 17)}
    assert best_chain_length(flat, acceptance=0.8, draft_cost=0.1) == 8  # capped by max_k
    assert best_chain_length(flat, acceptance=0.8, draft_cost=0.1, max_k=15) > 8
    linear = {n: 10.0 * n for n in range(1, 17)}
    assert best_chain_length(linear, acceptance=0.8, draft_cost=1.0) == 0  # compute-bound: do not speculate
    rates = chain_throughputs(int4_like, 0.8, 1.0)
    assert rates[0] == pytest.approx(1 / 11.0) and max(rates, key=rates.get) == 3


def test_measure_and_plot_on_a_tiny_model(tmp_path):
    model = tiny_lm("qwen2", 64, dtype=torch.float32)
    costs = measure_row_costs(model, rows=[1, 2, 5], context=8, repeats=2, warmup=1)
    assert sorted(costs) == [1, 2, 5] and all(c > 0 for c in costs.values())
    plot_row_costs({"tiny fp32": costs}, tmp_path / "rows.png")
    assert (tmp_path / "rows.png").stat().st_size > 0


def test_auto_chain_length_picks_the_best_length_on_the_measured_curves(monkeypatch):
    # Fixed curves instead of timings, so the pick is known: the target's int4-like curve favours 3 drafts (as
    # above), a compute-bound one no speculation, which auto_chain_length raises to its minimum of one draft.
    from frspec.tune import cost_model

    target, draft = tiny_lm("qwen2", 64, dtype=torch.float32), tiny_lm("qwen2", 64, dtype=torch.float32, seed=1)
    measured = []
    curves = {id(target): {n: (11.0 if n <= 2 else 13.0 if n <= 4 else 37.0) for n in range(1, 17)},
              id(draft): {1: 1.0}}

    def fake_measure(model, rows, **_):
        measured.append((model, list(rows)))
        return {n: curves[id(model)][n] for n in rows}

    monkeypatch.setattr(cost_model, "measure_row_costs", fake_measure)
    assert cost_model.auto_chain_length(target, draft, acceptance=0.8, max_k=8, context=8) == 3
    assert measured == [(target, list(range(1, 10))), (draft, [1])]
    curves[id(target)] = {n: 10.0 * n for n in range(1, 17)}
    assert cost_model.auto_chain_length(target, draft, acceptance=0.8, max_k=8, context=8) == 1
