"""`frspec tune` end to end: measure on calibration prompts, predict every configuration, confirm the best few with
a short interleaved bench, and pick the measured best.

    result = tune(target, draft, tokenizer, calibration, confirmation, token_maps, TuneSettings(...), say)
    result = tune(target, None, tokenizer, ..., mtp=load_mtp_head(target, target_dir))   # its own MTP layers
    result.pick                      # the Candidate the bench measured fastest
    comparison_rows(result)          # predicted against measured, one row per confirmed configuration

Measuring is tune/measure.py (tune/mtp_measure.py for MTP layers), predicting tune/predict.py, the confirming
bench bench/runner.py; the tables and the JSON record are tune/report.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from frspec.bench.methods import DRAFT, FRSPEC, MTP, MTP_FRSPEC, VANILLA, Method
from frspec.bench.runner import BenchResult, run_benchmark
from frspec.tune.measure import (
    calibration_context, draft_base_costs, draft_ranks, draft_vocabs, engine_spec_run, head_costs,
    interleaved_row_costs, overheads, reference_outputs,
)
from frspec.tune.mtp_measure import mtp_base_costs, mtp_ranks, mtp_vocabs
from frspec.tune.predict import (
    CHAIN_LENGTHS, TREE_SHAPES, Candidate, Measurements, Prediction, candidates, rank_predictions, to_confirm,
)
from frspec.decode.stats import GenerationStats
from frspec.decode.tree_shape import TreeShape
from frspec.vocab.token_map import TokenMap


# The chain the engine-overhead run drafts (its target forwards are over OVERHEAD_CHAIN + 1 rows).
OVERHEAD_CHAIN = 3


@dataclass(frozen=True)
class TuneSettings:
    max_new_tokens: int = 48  # per calibration prompt
    confirm_tokens: int = 48  # per prompt of the confirming bench
    top: int = 3  # predicted-best configurations the bench confirms (plus the best without a map, and vanilla)
    max_rows: int = 16  # the target's cost is measured for 1..max_rows rows
    overhead_tokens: int = 32  # the engine run that measures per-step overheads
    warmup_tokens: int = 8


def method_of(candidate: Candidate, mtp: bool = False) -> Method:
    """The bench method that runs a candidate (drafted by a draft model, or with `mtp` by the target's MTP layers)."""
    if candidate.shape is None:
        return Method(VANILLA)
    if mtp:
        return Method.drafting(MTP if candidate.map_size is None else MTP_FRSPEC, candidate.shape, candidate.map_size)
    kind = DRAFT if candidate.map_size is None else FRSPEC
    return Method.drafting(kind, candidate.shape, candidate.map_size)


@dataclass
class TuneResult:
    measurements: Measurements
    context: int
    ranked: list[Prediction]
    confirmed: list[Candidate]
    bench: BenchResult
    measured: dict[Candidate, GenerationStats]
    pick: Candidate
    notes: list[str] = field(default_factory=list)

    def prediction(self, candidate: Candidate) -> Prediction:
        return next(p for p in self.ranked if p.candidate == candidate)

    def measured_tokens_per_s(self, candidate: Candidate) -> float | None:
        return self.measured[candidate].decode_tokens_per_s


def _measure_target(target, tokenizer, calibration: Sequence[Sequence[int]], settings: TuneSettings,
                    say: Callable[[str], None]):
    """What every drafter's measurements share: the target's greedy outputs (and vanilla's stats), the calibration
    context, and the target's forward cost per row count there."""
    say(f"greedy reference outputs of the target on {len(calibration)} prompts x {settings.max_new_tokens} tokens")
    outputs, vanilla = reference_outputs(target, tokenizer, calibration, settings.max_new_tokens,
                                         settings.warmup_tokens)
    context = calibration_context(calibration, settings.max_new_tokens)
    say(f"target forward cost for 1..{settings.max_rows} rows at a {context}-token context")
    target_costs = interleaved_row_costs(target, range(1, settings.max_rows + 1), context, rounds=3)
    return outputs, vanilla, context, target_costs


def _drafter_widths() -> list[int]:
    """The row counts a drafter step takes: 1 (chains) and each static tree level's width."""
    return sorted({1} | {t.branching ** level for t in TREE_SHAPES for level in range(1, t.depth)})


def _engine_overheads(target, draft, head, tokenizer, calibration: Sequence[Sequence[int]], settings: TuneSettings,
                      vanilla, target_costs, base, heads) -> dict[str, float]:
    """The engine's overheads beyond the measured forwards, from one short chain run of the draft model or of
    `head` (an MtpHead)."""
    spec = engine_spec_run(target, draft, tokenizer, calibration[0], TreeShape.chain(OVERHEAD_CHAIN),
                           settings.overhead_tokens, eagle=head)
    return overheads(spec, vanilla, target_costs, OVERHEAD_CHAIN + 1, base[1], heads[None][1])


def measure(target, draft, tokenizer, calibration: Sequence[Sequence[int]], token_maps: dict[int, TokenMap],
            settings: TuneSettings, say: Callable[[str], None], mtp=None) -> tuple[Measurements, int]:
    """Everything the predictions need, measured on the calibration prompts (token ids, chat-formatted); with `mtp`
    (an MtpHead) for the target's own MTP layers instead of the draft model."""
    if mtp is not None:
        return measure_mtp(target, mtp, tokenizer, calibration, token_maps, settings, say)
    outputs, vanilla, context, target_costs = _measure_target(target, tokenizer, calibration, settings, say)
    say(f"draft ranks of the target's tokens, full vocabulary and maps {', '.join(map(str, sorted(token_maps)))}")
    vocabs = draft_vocabs(draft, token_maps)
    ranks = draft_ranks(draft, vocabs, list(zip(calibration, outputs)))
    widths = _drafter_widths()
    say(f"draft forward and LM-head costs for {widths} rows")
    base = draft_base_costs(draft, widths, context)
    heads = head_costs(vocabs, widths)
    say("engine overheads from one short speculative run")
    over = _engine_overheads(target, draft, None, tokenizer, calibration, settings, vanilla, target_costs, base, heads)
    del vocabs  # the pruned heads' copies; the bench builds its own drafters
    return Measurements(target_costs, base, heads, ranks, **over), context


def measure_mtp(target, head, tokenizer, calibration: Sequence[Sequence[int]], token_maps: dict[int, TokenMap],
                settings: TuneSettings, say: Callable[[str], None]) -> tuple[Measurements, int]:
    """`measure` for the target's own MTP layers (`head`, an MtpHead): ranks per draft depth, the MTP layer's
    forward cost, the shared head's cost per map, and the engine's overheads from a short MTP run."""
    outputs, vanilla, context, target_costs = _measure_target(target, tokenizer, calibration, settings, say)
    depth = max(max(CHAIN_LENGTHS), max(t.depth for t in TREE_SHAPES))
    say(f"MTP ranks of the target's tokens at draft depths 1..{depth}, full vocabulary and maps "
        f"{', '.join(map(str, sorted(token_maps)))}")
    vocabs = mtp_vocabs(head, token_maps)
    ranks = mtp_ranks(target, head, vocabs, list(zip(calibration, outputs)), depth)
    widths = _drafter_widths()
    say(f"MTP layer forward and shared LM-head costs for {widths} rows")
    base = mtp_base_costs(head, widths, context)
    heads = head_costs(vocabs, widths)
    say("engine overheads from one short MTP run")
    over = _engine_overheads(target, None, head, tokenizer, calibration, settings, vanilla, target_costs, base, heads)
    del vocabs
    return Measurements(target_costs, base, heads, ranks, **over, ranks_by_depth=True), context


def tune(target, draft, tokenizer, calibration: Sequence[Sequence[int]],
         confirmation: Sequence[tuple[str, list[int]]], token_maps: dict[int, TokenMap], settings: TuneSettings,
         say: Callable[[str], None] = lambda m: None, progress: bool = True, mtp=None) -> TuneResult:
    """Measure, predict, confirm and pick (see the module docstring). `confirmation` are (id, token ids) pairs.
    With `mtp` (an MtpHead loaded for `target`; `draft` None) the drafter tuned is the target's own MTP layers."""
    m, context = measure(target, draft, tokenizer, calibration, token_maps, settings, say, mtp=mtp)
    ranked = rank_predictions(m, candidates(sorted(token_maps), m.target_costs))
    confirmed = to_confirm(ranked, settings.top)
    is_mtp = mtp is not None
    methods = [method_of(c, is_mtp) for c in confirmed]
    say(f"confirming {', '.join(c.label for c in confirmed[1:])} against vanilla: {len(confirmation)} prompts x "
        f"{settings.confirm_tokens} tokens, interleaved")
    bench = run_benchmark(target, draft, tokenizer, confirmation, methods, token_maps, settings.confirm_tokens,
                          warmup_tokens=settings.warmup_tokens, progress=progress, eagle=mtp)
    measured = {c: GenerationStats.aggregate(g.stats for g in bench.generations_of(method_of(c, is_mtp)))
                for c in confirmed}
    pick = pick_fastest(confirmed, measured)
    result = TuneResult(m, context, ranked, confirmed, bench, measured, pick)
    if ranked[0].candidate != pick:
        result.notes.append(f"the predicted best ({ranked[0].candidate.label}) measured slower than {pick.label}")
    for d in bench.divergences:
        result.notes.append(f"{d.method.label} differs from vanilla on {d.prompt_id} at token {d.position} "
                            f"(target top-2 logit margin {d.top2_margin:.4f})")
    return result


def pick_fastest(confirmed: Sequence[Candidate], measured: dict[Candidate, GenerationStats]) -> Candidate:
    """The configuration the confirming bench measured fastest (vanilla included: it wins when nothing pays)."""
    return max(confirmed, key=lambda c: measured[c].decode_tokens_per_s or 0.0)


def comparison_rows(result: TuneResult) -> list[dict[str, Any]]:
    """Predicted against measured throughput for each confirmed configuration, in predicted order."""
    order = {p.candidate: i + 1 for i, p in enumerate(result.ranked)}
    vanilla = result.measured_tokens_per_s(Candidate(None, None))
    rows = []
    for c in sorted(result.confirmed, key=order.get):
        p, stats = result.prediction(c), result.measured[c]
        tps = stats.decode_tokens_per_s
        rows.append({
            "config": c.label,
            "map_size": c.map_size,
            "tree": None if c.shape is None else str(c.shape),
            "predicted_rank": order[c],
            "predicted_tokens_per_step": p.tokens_per_step,
            "measured_tokens_per_step": stats.acceptance_length,
            "predicted_tokens_per_s": p.tokens_per_s,
            "measured_tokens_per_s": tps,
            "measured_over_predicted": tps / p.tokens_per_s if tps else None,
            "measured_speedup_vs_vanilla": tps / vanilla if tps and vanilla else None,
            "picked": c == result.pick,
        })
    return rows


def prediction_rows(result: TuneResult, limit: int | None = None) -> list[dict[str, Any]]:
    """Every predicted configuration (fastest first): acceptance per position and the step's cost split."""
    rows = []
    for i, p in enumerate(result.ranked[:limit]):
        rows.append({
            "rank": i + 1,
            "config": p.candidate.label,
            "tokens_per_step": p.tokens_per_step,
            "accepted_per_position": list(p.accepted_per_position),
            "target_ms": p.target_time_s * 1e3,
            "draft_ms": p.draft_time_s * 1e3,
            "step_ms": p.step_time_s * 1e3,
            "predicted_tokens_per_s": p.tokens_per_s,
        })
    return rows
