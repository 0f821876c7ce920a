"""GenerationStats: derived values and aggregation."""

from __future__ import annotations

import json

import pytest

from frspec.decode.stats import GenerationStats


def _stats(**kw) -> GenerationStats:
    base = dict(
        prompt_tokens=10,
        tokens=9,
        decode_tokens=8,
        target_forwards=4,
        draft_steps=12,
        num_spec_tokens=3,
        accepted_per_position=[3, 2, 1],
        proposed_per_position=[4, 4, 4],
        prefill_time_s=0.5,
        target_time_s=2.0,
        draft_time_s=1.2,
        draft_lm_head_time_s=0.3,
        wall_time_s=4.0,
    )
    base.update(kw)
    return GenerationStats(**base)


def test_derived_values():
    s = _stats()
    assert s.acceptance_length == 2.0
    assert s.acceptance_rate_per_position == [0.75, 0.5, 0.25]
    assert s.end_to_end_tokens_per_s == 9 / 4.0 and s.decode_tokens_per_s == 8 / 3.5
    assert s.forward_ratio == pytest.approx((1.2 / 12) / (2.0 / 4))
    assert s.lm_head_share == pytest.approx(0.25)
    assert s.overhead_time_s == pytest.approx(0.3)
    d = json.loads(json.dumps(s.to_dict()))
    for key in ("tokens", "target_forwards", "acceptance_length", "decode_tokens_per_s", "end_to_end_tokens_per_s",
                "forward_ratio"):
        assert key in d
    assert "acceptance length 2.00" in s.summary()


def test_drafter_prefill_counts_as_decoding_time():
    """The target's prefill is left out of decoding time, the drafter's is not: it is speculation's cost."""
    s = _stats(draft_prefill_time_s=0.25)
    assert s.decode_tokens_per_s == 8 / 3.5 and s.end_to_end_tokens_per_s == 9 / 4.0
    assert s.overhead_time_s == pytest.approx(0.05)


def test_undefined_ratios_are_none():
    s = GenerationStats(tokens=1, wall_time_s=0.1)
    assert s.acceptance_length is None and s.forward_ratio is None and s.lm_head_share is None


def test_aggregate_sums_requests_and_positions():
    a = _stats()
    b = _stats(tokens=5, decode_tokens=4, target_forwards=4, num_spec_tokens=2, accepted_per_position=[1, 0],
               proposed_per_position=[4, 4], wall_time_s=1.0)
    total = GenerationStats.aggregate([a, b])
    assert total.requests == 2 and total.tokens == 14 and total.target_forwards == 8
    assert total.accepted_per_position == [4, 2, 1] and total.proposed_per_position == [8, 8, 4]
    assert total.acceptance_length == 12 / 8
    assert total.num_spec_tokens == 3 and total.wall_time_s == 5.0
    assert GenerationStats.aggregate([]).requests == 0
