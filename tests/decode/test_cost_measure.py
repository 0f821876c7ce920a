"""The controller's cost measurement (decode/cost_measure.py) on tiny models: per-context tables, the cache and
its key (the weight format of both models and of the drafter's own head), and `auto` on a quantized pair."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from frspec.decode import cost_measure, step_costs
from frspec.decode.cost_measure import (
    cached_step_costs, drafter_identity, measure_step_costs, model_identity, usable_contexts, weight_format,
)
from frspec.decode.draft_model import DraftModelDrafter
from frspec.decode.factory import build_generator
from frspec.decode.kv_cache import new_cache
from frspec.decode.sampling import SamplingParams
from frspec.decode.step_costs import StepCosts, measure_row_costs_by_context
from frspec.models.quant import quantize_linear, quantize_model
from frspec.vocab.token_map import TokenMap

from tests.decode.spec_tiny import tiny_lm

VOCAB = 256  # a multiple of the int4 packing's 16


def named(model, name):
    """A tiny model with a name, as a loaded one has (an unnamed one is never cached)."""
    model.config._name_or_path = name
    return model


@pytest.fixture
def pair():
    target = named(tiny_lm("qwen2", VOCAB, seed=0, dtype=torch.float32), "tiny-target")
    draft = named(tiny_lm("qwen2", VOCAB, hidden=32, seed=1, dtype=torch.float32), "tiny-draft")
    return target, draft


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FRSPEC_CACHE", str(tmp_path))
    return tmp_path / "step_costs"


def test_row_costs_are_measured_at_each_context_from_one_growing_prefix(pair):
    target, _ = pair
    calls = []
    forward = target.forward

    def counting(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[1])
        return forward(*args, **kwargs)

    target.forward = counting
    costs = measure_row_costs_by_context(target, [1, 3], [64, 16, 128], repeats=1, warmup=0)
    assert list(costs) == [16, 64, 128] and all(list(c) == [1, 3] for c in costs.values())
    assert all(v > 0 for c in costs.values() for v in c.values())
    # The prefix grows 16 -> 64 -> 128; only its first REAL_PREFIX (16) tokens go through the model, the rest of
    # the full-attention cache is random keys and values. Then one forward per row count.
    assert step_costs.REAL_PREFIX == 16 and calls == [16, 1, 3, 1, 3, 1, 3]
    calls.clear()
    # With warm-ups: an untimed pass over the row counts after the first prefill, then interleaved rounds (every
    # row count once per round: a slow spell hits one round of all of them); fewer row counts later.
    costs = measure_row_costs_by_context(target, [1, 3], [16, 64], repeats=2, warmup=1, later_rows=[1])
    assert calls == [16, 1, 3, 1, 3, 1, 3, 1, 3, 1, 1, 1] and list(costs[64]) == [1]
    calls.clear()
    measure_row_costs_by_context(target, [2], [100], repeats=1, warmup=0)
    assert calls == [16, 2]  # the first context too


def test_a_cache_that_random_values_cannot_stand_for_is_prefilled_for_real(pair, monkeypatch):
    # A sliding-window layer keeps only its window: its state is not "a longer cache", so the prefix is run.
    target, _ = pair
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=8,
                         max_window_layers=0)
    sliding = named(Qwen2ForCausalLM(config).eval(), "tiny-sliding")
    assert set(config.layer_types) == {"sliding_attention"}
    for model in (sliding, target):
        calls = []
        forward = model.forward
        model.forward = lambda *a, _f=forward, **k: calls.append(k["input_ids"].shape[1]) or _f(*a, **k)
        if model is target:  # the plain model with growth refused: the old, real prefill
            monkeypatch.setattr(step_costs, "_grow_cache", lambda *a: False)
        measure_row_costs_by_context(model, [1], [40, 64], repeats=1, warmup=0)
        assert calls == [16, 24, 1, 24, 1]
    cache = new_cache(sliding)
    sliding(input_ids=torch.arange(16)[None], cache=cache, use_cache=True)
    monkeypatch.undo()
    assert not step_costs._grow_cache(cache, 64, torch.Generator())


def test_a_grown_cache_has_each_layers_shape_and_dtype_and_the_next_forward_sees_it(pair):
    target, _ = pair
    target = target.to(torch.bfloat16)
    cache = new_cache(target)
    target(input_ids=torch.arange(16)[None], cache=cache, use_cache=True)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    assert step_costs._grow_cache(cache, 200, torch.Generator().manual_seed(0))
    assert cache.get_seq_length() == 200 and not step_costs._grow_cache(cache, 200, torch.Generator())
    for layer, (keys, values) in zip(cache.layers, before):
        assert layer.keys.shape == (*keys.shape[:-2], 200, keys.shape[-1]) and layer.keys.dtype == torch.bfloat16
        assert torch.equal(layer.keys[..., :16, :], keys) and torch.equal(layer.values[..., :16, :], values)
    out = target(input_ids=torch.tensor([[1, 2, 3]]), cache=cache, use_cache=True)
    assert out.logits.shape[1] == 3 and cache.get_seq_length() == 203  # positions 200..202, attending over 203


def test_the_measurement_has_per_context_tables_for_target_and_draft_model(pair):
    target, draft = pair
    drafter = DraftModelDrafter(draft, TokenMap(list(range(64)), VOCAB), ranked=True)
    costs = measure_step_costs(target, drafter, sizes=(16, 64), max_rows=4, contexts=(32, 128, 512))
    assert costs.contexts == [32, 128, 512] and costs.context == 32
    # Every row count at the shortest context, 1, 2, the middle and the most at the longer ones.
    assert [sorted(costs.target_by_context[c]) for c in (32, 128, 512)] == [[1, 2, 3, 4], [1, 2, 4], [1, 2, 4]]
    assert costs.target_costs == costs.target_by_context[32]  # the flat tables are the shortest context's
    assert set(costs.draft_base_by_context) == {32, 128, 512}
    assert costs.draft_base_by_context[32][1] == pytest.approx(costs.draft_base_costs[1])
    # The draft model's forward over 64 rows too (catching up after plain steps) and over 128, 256, 512 and 1024 (a
    # window, a long prompt's prefill), in every context's table, never cheaper for more rows.
    widths = [1, cost_measure.CATCH_UP_ROWS, *cost_measure.PREFILL_ROWS]
    assert sorted(costs.draft_base_costs) == widths
    assert all(sorted(t) == widths for t in costs.draft_base_by_context.values())
    assert costs.catch_up_s(cost_measure.CATCH_UP_ROWS, 32) == pytest.approx(
        costs.draft_base_costs[cost_measure.CATCH_UP_ROWS] - costs.draft_base_costs[1])
    assert [costs.draft_base_costs[n] for n in widths] == sorted(costs.draft_base_costs[n] for n in widths)
    # Beyond the longest width, a prefill goes on along the line through the two longest, not through 1 and 64.
    a, b = cost_measure.PREFILL_ROWS[-2:]
    per_row = (costs.draft_base_costs[b] - costs.draft_base_costs[a]) / (b - a)
    assert costs.catch_up_s(3 * b, 32) == pytest.approx(
        max(costs.draft_base_costs[b] + per_row * 2 * b, costs.draft_base_costs[b]) - costs.draft_base_costs[1])
    assert StepCosts.from_dict(json.loads(json.dumps(costs.to_dict()))).to_dict() == costs.to_dict()


def test_a_one_row_forward_read_dearer_than_two_rows_is_measured_again_and_the_faster_reading_kept(
        pair, monkeypatch, caplog):
    """Another process's stall made a bf16 table read 1 row at 1.70 s and 2 rows at 0.51 s (the AVX2 EPYC, under
    scripts/setup_vllm.sh), and `auto` drafted by it where every draft loses. Such a reading is measured again; a
    plausible one is not."""
    target, draft = pair
    readings = [{32: {1: 1.7, 2: 0.51, 3: 0.7}}, {32: {1: 0.2, 2: 0.6, 3: 0.65}}]
    target_calls = []

    def target_timed_as_above(model, rows, contexts, *args, **kwargs):
        if model is target:
            target_calls.append(rows)
            return readings[len(target_calls) - 1]
        return measure_row_costs_by_context(model, rows, contexts, *args, **kwargs)

    monkeypatch.setattr(cost_measure, "measure_row_costs_by_context", target_timed_as_above)
    with caplog.at_level("INFO", logger="frspec"):
        costs = measure_step_costs(target, DraftModelDrafter(draft), sizes=(VOCAB,), max_rows=3, contexts=(32,))
    assert len(target_calls) == 2 and any("measuring it again" in r.getMessage() for r in caplog.records)
    assert costs.target_costs == {1: 0.2, 2: 0.51, 3: 0.65}  # each entry the faster of the two readings
    # One row at less than ONE_ROW_STALL times two rows' stands as read.
    readings[0], target_calls[:] = {32: {1: 0.7, 2: 0.51, 3: 0.7}}, []
    costs = measure_step_costs(target, DraftModelDrafter(draft), sizes=(VOCAB,), max_rows=3, contexts=(32,))
    assert len(target_calls) == 1 and costs.target_costs == {1: 0.7, 2: 0.51, 3: 0.7}


def test_a_draft_model_whose_wide_calls_go_through_fp32_is_timed_on_both_sides_of_the_bend(monkeypatch):
    """bf16 on a machine where wide calls widen to fp32 (forced here): the catch-up curve bends at WIDE_ROWS, so
    the draft model is timed over WIDE_ROWS - 1 and WIDE_ROWS rows as well, and the models' identities say so."""
    from frspec.models import wide_linear

    monkeypatch.setenv(wide_linear.ENV, "1")
    wide_linear.fp32_is_faster.cache_clear()
    try:
        target = named(tiny_lm("qwen2", VOCAB, seed=0, dtype=torch.bfloat16), "tiny-target")
        draft = named(tiny_lm("qwen2", VOCAB, hidden=32, seed=1, dtype=torch.bfloat16), "tiny-draft")
        wide_linear.use_wide_linears(draft)
        costs = measure_step_costs(target, DraftModelDrafter(draft), sizes=(VOCAB,), max_rows=3, contexts=(32,))
        bend = wide_linear.WIDE_ROWS
        assert sorted(costs.draft_base_costs) == [1, bend - 1, bend, cost_measure.CATCH_UP_ROWS,
                                                  *cost_measure.PREFILL_ROWS]
        assert f"fp32 from {bend} rows" in model_identity(draft)
        monkeypatch.setenv(wide_linear.ENV, "0")
        wide_linear.fp32_is_faster.cache_clear()
        assert "fp32 from" not in model_identity(draft)
    finally:
        wide_linear.fp32_is_faster.cache_clear()


def test_only_the_prefill_widths_are_kept_from_bending_the_catch_up_curve_down(monkeypatch):
    """Across the fp32 bend more rows may cost less (32 rows through fp32 against 31 in bf16) and stay so; a prefill
    width timed below the widest short one, or below a shorter prefill width, is noise and is raised to it."""
    from frspec.models import wide_linear

    monkeypatch.setenv(wide_linear.ENV, "1")
    wide_linear.fp32_is_faster.cache_clear()
    bend = wide_linear.WIDE_ROWS
    timed = {1: 0.1, bend - 1: 3.0, bend: 1.0, cost_measure.CATCH_UP_ROWS: 2.0, 128: 2.5, 256: 1.2, 512: 1.5,
             1024: 6.0}
    real = cost_measure.measure_row_costs_by_context

    def draft_widths_timed_as_above(model, rows, contexts, *args, **kwargs):
        rows = list(rows)
        if model is draft.model and len(list(contexts)) == 1 and max(rows) >= bend - 1:
            return {c: {n: timed[n] for n in rows} for c in contexts}
        return real(model, rows, contexts, *args, **kwargs)

    monkeypatch.setattr(cost_measure, "measure_row_costs_by_context", draft_widths_timed_as_above)
    try:
        target = named(tiny_lm("qwen2", VOCAB, seed=0, dtype=torch.bfloat16), "tiny-target")
        draft = named(tiny_lm("qwen2", VOCAB, hidden=32, seed=1, dtype=torch.bfloat16), "tiny-draft")
        wide_linear.use_wide_linears(draft)
        costs = measure_step_costs(target, DraftModelDrafter(draft), sizes=(VOCAB,), max_rows=3, contexts=(32,))
    finally:
        wide_linear.fp32_is_faster.cache_clear()
    extra = {n: costs.draft_base_costs[n] - costs.draft_base_costs[1] for n in timed if n != 1}
    assert extra[bend - 1] == pytest.approx(2.9) and extra[bend] == pytest.approx(0.9)  # the bend, as timed
    assert extra[cost_measure.CATCH_UP_ROWS] == pytest.approx(1.9)
    assert extra[128] == pytest.approx(2.4)  # dearer than 64 rows: as timed
    assert extra[256] == pytest.approx(2.4) and extra[512] == pytest.approx(2.4)  # raised to 128's
    assert extra[1024] == pytest.approx(5.9)


def test_a_draft_model_is_timed_over_a_prefill_only_as_long_as_its_positions_allow(pair):
    target, draft = pair
    draft.config.max_position_embeddings = 600
    costs = measure_step_costs(target, DraftModelDrafter(draft), sizes=(VOCAB,), max_rows=3, contexts=(32,))
    assert sorted(costs.draft_base_costs) == [1, cost_measure.CATCH_UP_ROWS, 128, 256, 512]  # 1024 would not fit


def test_contexts_are_those_the_models_positions_allow(pair):
    target, draft = pair
    target.config.max_position_embeddings = 600
    assert usable_contexts((128, 512, 2048), [target, draft], 40) == [128, 512]
    target.config.max_position_embeddings = 100
    assert usable_contexts((128, 512, 2048), [target, draft], 40) == [25]  # a quarter of its positions


def test_the_cache_key_holds_both_models_weight_formats_and_the_drafter_head(pair, cache, monkeypatch):
    target, draft = pair
    measured = []

    def fake_measure(target, drafter, sizes, max_rows, shape=None, contexts=()):
        measured.append((model_identity(target), drafter_identity(drafter)))
        return StepCosts({1: 0.1}, {1: 0.01}, {None: {1: 0.001}})

    monkeypatch.setattr(cost_measure, "measure_step_costs", fake_measure)

    def costs(t, drafter):
        return cached_step_costs(t, drafter, (VOCAB,), 4)[0]

    float_drafter = DraftModelDrafter(draft)
    costs(target, float_drafter)
    costs(target, float_drafter)
    assert len(measured) == 1  # the second call read the cache
    int4_target = quantize_model(copy.deepcopy(target), "int4")
    int8_target = quantize_model(copy.deepcopy(target), "int8")
    int4_head = DraftModelDrafter(draft, head_quant="int4")  # the same draft model, its drafter head int4
    int4_draft = DraftModelDrafter(quantize_model(copy.deepcopy(draft), "int4", head=False))
    for t, d in ((int4_target, float_drafter), (int8_target, float_drafter), (target, int4_head),
                 (int4_target, int4_draft)):
        c = costs(t, d)
        assert c.provenance["target"] == model_identity(t) and c.provenance["drafter"] == drafter_identity(d)
    assert len(measured) == 5 and len(set(measured)) == 5  # never reused from the float pair's entry
    assert len(list(cache.glob("*.json"))) == 5
    assert "Int4Linear" in model_identity(int4_target) and "Int8Linear" in model_identity(int8_target)
    assert weight_format(target) == "float" and weight_format(int4_head.vocab.head).startswith("Int4Linear/")
    assert "head:DraftVocab/256/Int4Linear" in drafter_identity(int4_head)
    assert drafter_identity(float_drafter).endswith("head:DraftVocab/256/float")
    # Each again: all read from the cache.
    for t, d in ((target, float_drafter), (int4_target, float_drafter), (target, int4_head)):
        costs(t, d)
    assert len(measured) == 5


def test_one_cache_entry_serves_every_map_size_and_row_count_it_was_measured_for(pair, cache, monkeypatch, caplog):
    # The quick bench asks for maps up to 32k, a later `generate --draft` for every size: one entry serves both,
    # and a request beyond it measures its own sizes and rows with the entry's, so the entry only grows.
    target, draft = pair
    measured = []

    def fake_measure(target, drafter, sizes, max_rows, shape=None, contexts=()):
        measured.append((list(sizes), max_rows))
        return StepCosts({n: 0.1 * n for n in range(1, max_rows + 1)}, {1: 0.01}, {k: {1: 1e-5 * k} for k in sizes})

    monkeypatch.setattr(cost_measure, "measure_step_costs", fake_measure)
    drafter = DraftModelDrafter(draft, TokenMap(list(range(64)), VOCAB), ranked=True)
    cached_step_costs(target, drafter, (16, 32, 64), 4)
    costs, _ = cached_step_costs(target, drafter, (32, 16), 3)  # within what was measured: read
    assert measured == [([16, 32, 64], 4)] and costs.head(64, 1) == pytest.approx(64e-5)
    with caplog.at_level("INFO", logger="frspec"):
        cached_step_costs(target, drafter, (16, VOCAB), 4)  # a size it lacks
    assert measured[-1] == ([16, 32, 64, VOCAB], 4)
    assert any("measured for map sizes [16, 32, 64] and up to 4 rows" in r.getMessage() for r in caplog.records)
    cached_step_costs(target, drafter, (32,), 7)  # more rows
    assert measured[-1] == ([16, 32, 64, VOCAB], 7)
    costs, _ = cached_step_costs(target, drafter, (16, 32, 64, VOCAB), 7)
    assert len(measured) == 3 and costs.target(7) == pytest.approx(0.7)
    files = list(cache.glob("*.json"))
    assert len(files) == 1
    provenance = json.loads(files[0].read_text())["provenance"]
    assert provenance["sizes"] == [16, 32, 64, VOCAB] and provenance["max_rows"] == 7


def test_a_ranked_heads_identity_does_not_move_with_its_active_size(pair):
    _, draft = pair
    drafter = DraftModelDrafter(draft, TokenMap(list(range(64)), VOCAB), ranked=True)
    before = drafter_identity(drafter)
    drafter.vocab.set_size(16)
    assert drafter_identity(drafter) == before


def test_auto_on_an_int4_pair_measures_int4_costs_and_stays_lossless(pair, cache):
    """`auto` (length and map size per step) on an int4 target and int4 draft body: the costs are measured for
    those models (the cache entry names them) and the output is the int4 target's own greedy output."""
    target, draft = pair
    q_target = quantize_model(copy.deepcopy(target), "int4")
    q_draft = quantize_model(copy.deepcopy(draft), "int4", head=False)  # the ranked head stays float
    ranking = TokenMap(list(range(VOCAB - 1, -1, -1))[:128], VOCAB)
    prompt = list(range(3, 40))
    vanilla = build_generator(q_target).generate(input_ids=[prompt], max_new_tokens=24, eos_token_ids=[],
                                                 sampling=SamplingParams()).token_ids
    auto = build_generator(q_target, q_draft, ranking)  # no length, no size: both automatic
    assert auto.controller is not None and len(auto.controller.sizes) > 1
    assert "Int4Linear" in auto.costs.provenance["target"] and "Int4Linear" in auto.costs.provenance["drafter"]
    assert auto.costs.contexts == [128, 512, 2048]
    out = auto.generate(input_ids=[prompt], max_new_tokens=24, eos_token_ids=[], sampling=SamplingParams())
    assert out.token_ids == vanilla
    files = list(cache.glob("*.json"))
    assert len(files) == 1 and "Int4Linear" in json.loads(files[0].read_text())["provenance"]["target"]
    # The float pair gets its own measurement, not the int4 one.
    float_auto = build_generator(target, draft, ranking)
    assert "Int4Linear" not in float_auto.costs.provenance["target"]
    assert len(list(cache.glob("*.json"))) == 2
    # With the drafter head int4 too (--draft-quant int4): the ranked head is packed once, every size its first
    # rows; the costs are measured for that head (a third entry), and the output is still the int4 target's own.
    packed = build_generator(q_target, q_draft, ranking, draft_head_quant="int4")
    vocab = packed.drafter.vocab
    assert vocab.packed_all is not None and len(packed.controller.sizes) > 1
    assert "head:RankedVocab/256/Int4Linear" in packed.costs.provenance["drafter"]
    assert len(list(cache.glob("*.json"))) == 3
    out = packed.generate(input_ids=[prompt], max_new_tokens=24, eos_token_ids=[], sampling=SamplingParams())
    assert out.token_ids == vanilla and set(out.stats.chosen_map_sizes) <= set(packed.controller.sizes)


def test_the_machine_name_says_which_instruction_set_the_kernels_may_use(monkeypatch):
    # An AVX-512 machine restricted to AVX2 (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY) has another cost curve: its
    # costs must not be read from the unrestricted machine's cache entry, nor the other way round.
    cpu = torch.device("cpu")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    plain = cost_measure.machine_name(cpu)
    assert f"[{torch.backends.cpu.get_cpu_capability()}]" in plain
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert cost_measure.machine_name(cpu) != plain and "oneDNN <= AVX2" in cost_measure.machine_name(cpu)


def test_a_measurement_is_announced_and_a_cache_hit_is_silent(pair, cache, monkeypatch, caplog):
    # Minutes on a CPU for a real pair: a first `generate --draft` must say what it is doing (the `frspec` command
    # prints the logger's records on stderr, tests/test_cli.py).
    target, draft = pair
    monkeypatch.setattr(cost_measure, "measure_step_costs",
                        lambda *a, **k: StepCosts({1: 0.1}, {1: 0.01}, {None: {1: 0.001}}))
    drafter = DraftModelDrafter(draft)
    with caplog.at_level("INFO", logger="frspec"):
        cached_step_costs(target, drafter, (VOCAB,), 4)
    said = [r.getMessage() for r in caplog.records if r.name.startswith("frspec")]
    assert len(said) == 2 and "measuring this machine's step costs" in said[0] and str(cache) in said[0]
    assert said[1].startswith("step costs measured in ")
    caplog.clear()
    with caplog.at_level("INFO", logger="frspec"):
        cached_step_costs(target, drafter, (VOCAB,), 4)
    assert not [r for r in caplog.records if r.name.startswith("frspec")]
