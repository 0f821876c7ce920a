"""Turn a benchmark's generations into one table row per method: totals, speedups and greedy correctness.

Rates and ratios come from totals over all prompts (`GenerationStats.aggregate`), so a long answer weighs in by
its length; the per-prompt median speedups ride along for readers who prefer medians. Throughput is the stats
record's `decode_tokens_per_s` (decode-step tokens per second after the prefill, the table's tok/s column) and
speedups are ratios of it, measured side by side in the same process; `end_to_end_tokens_per_s` rides along.

Auto rows are compared with the best static row twice: in decode throughput, and end to end (prefill included).
The second is the one a user feels. A draft model prefills over the prompt too, so on long prompts every
speculative row can be faster in decode and slower end to end (docs/benchmarks.md, the Xeon's long-input QA), and
the controller's choice to decode plainly reads as a loss in decode tokens/s only.

`greedy_identity` and `speedups` define those columns for vLLM's rows too (bench/vllm_runner.py, per batch size).

Quantized rows: a speculative row's reference (greedy identity, speedup vs vanilla) is its own quantized target's
vanilla row; a quantized vanilla row and the llama.cpp row are compared with the unquantized vanilla row, and
every row with the llama.cpp row when there is one.
"""

from __future__ import annotations

import statistics
from typing import Any

from frspec.bench.methods import LLAMACPP, TARGET_ONLY, VANILLA, Method
from frspec.bench.divergence import Generation, reference_agreement
from frspec.bench.runner import BenchResult
from frspec.decode.stats import GenerationStats


def _aggregate(generations: list[Generation]) -> GenerationStats:
    return GenerationStats.aggregate(g.stats for g in generations)


def drafter_prefills(generations: list[Generation]) -> dict[str, int]:
    """An auto row's requests by what its drafter's prefill read: the whole prompt, a window of it (a long prompt's
    start and end, decode/draft_model.py), or nothing (the request decoded plainly:
    controller.drafter_prefill_tokens)."""
    counts = {"whole": 0, "window": 0, "none": 0}
    for g in generations:
        read = g.stats.draft_prompt_tokens
        counts["none" if read == 0 else "whole" if read >= g.stats.prompt_tokens else "window"] += 1
    return counts


def _median_prompt_speedup(result: BenchResult, method: Method, baseline: Method) -> float | None:
    """Median over prompts of (method decoding throughput / baseline decoding throughput) on that same prompt."""
    base = {g.prompt_id: g.stats.decode_tokens_per_s for g in result.generations_of(baseline)}
    ratios = []
    for g in result.generations_of(method):
        mine = g.stats.decode_tokens_per_s
        if mine and base.get(g.prompt_id):
            ratios.append(mine / base[g.prompt_id])
    return statistics.median(ratios) if ratios else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def greedy_identity(m: Method, methods, differing: dict[Method, set[str]], greedy: bool = True) -> str:
    """The Greedy Identical cell: "reference" for vanilla, "yes" or "N differ" (prompts whose output differs from
    the reference row's), or "n/a (...)" where there is nothing to check (llama.cpp, sampling, no vanilla row)."""
    if m.kind == VANILLA:
        return "reference"
    if m.kind == LLAMACPP:
        return "n/a (llama.cpp)"  # other kernels: its agreement with int4 vanilla is in the JSON
    if not greedy:
        return "n/a (sampling)"
    if m.reference not in methods:
        return "n/a (no vanilla)"
    n = len(differing.get(m, ()))
    return "yes" if n == 0 else f"{n} differ"


def speedups(m: Method, throughput: dict[Method, float]) -> tuple[float | None, float | None]:
    """(speedup vs vanilla, speedup vs the same drafter without FR-Spec) from rows measured side by side: a
    speculative row against its own (quantized) target's vanilla row, a quantized vanilla row against the
    unquantized one; FR-Spec against the same drafter and shape over the full vocabulary."""
    vanilla = Method(VANILLA)
    base = vanilla if m.kind in TARGET_ONLY else m.reference
    baseline = m.same_drafter_without_frspec  # eagle+fr-spec: the same head and shape without the map
    return (_ratio(throughput[m], throughput.get(base)) if m != vanilla else None,
            _ratio(throughput[m], throughput.get(baseline)) if baseline else None)


def summarize(result: BenchResult) -> list[dict[str, Any]]:
    """One dict per method, in the order run, with the report's columns plus raw totals.

    greedy_identical is "yes", "N differ" (prompts whose output differs from vanilla's), "reference" for vanilla,
    or "n/a (sampling)".
    """
    differing: dict[Method, set[str]] = {}
    for d in result.divergences:
        differing.setdefault(d.method, set()).add(d.prompt_id)

    rows: list[dict[str, Any]] = []
    throughput: dict[Method, float] = {}
    end_to_end: dict[Method, float] = {}
    for m in result.methods:
        gens = result.generations_of(m)
        agg = _aggregate(gens)
        throughput[m] = agg.decode_tokens_per_s
        end_to_end[m] = agg.end_to_end_tokens_per_s
        speculative = m.kind not in TARGET_ONLY
        agreement = reference_agreement(result.generations, m) if result.greedy and m.kind != VANILLA else None
        rows.append(
            {
                "label": m.label,
                "method": m.kind,
                "quant": m.quant,
                "reference": m.reference.label if m.kind != VANILLA else None,
                # Tokens before the first difference from the reference row (summed over prompts) / tokens.
                "reference_agreement": list(agreement) if agreement else None,
                "tree": m.tree_label,
                "num_spec_tokens": m.num_spec_tokens,
                "token_map_size": m.token_map_size,
                "context": m.context_label,
                "context_rows": m.context_rows,
                "context_budget": m.context_budget,
                # Mean prompt length (chat template included) of the prompts this row decoded.
                "input_tokens": statistics.fmean(g.prompt_tokens for g in gens) if gens else None,
                "acceptance_length": agg.acceptance_length,
                "decode_tokens_per_s": throughput[m],
                "total_time_s": agg.wall_time_s,
                "end_to_end_tokens_per_s": agg.end_to_end_tokens_per_s,
                "forward_ratio": agg.forward_ratio if speculative else None,
                "lm_head_share": agg.lm_head_share if speculative else None,
                "greedy_identical": greedy_identity(m, result.methods, differing, result.greedy),
                "prompts": len(gens),
                "tokens": agg.tokens,
                "decode_tokens": agg.decode_tokens,
                "target_forwards": agg.target_forwards,
                "draft_steps": agg.draft_steps,
                "prefill_time_s": agg.prefill_time_s,
                "draft_prefill_time_s": agg.draft_prefill_time_s,
                "draft_time_s": agg.draft_time_s,
                "draft_lm_head_time_s": agg.draft_lm_head_time_s,
                "target_time_s": agg.target_time_s,
                "accepted_per_position": list(agg.accepted_per_position) if speculative else None,
                # Tree size actually verified (a dynamic tree's budget, a static tree's nodes, a chain's length;
                # less near the token budget's end) and how deep the accepted paths went.
                "draft_tokens": agg.draft_tokens,
                "draft_tokens_per_step": _ratio(agg.draft_tokens, agg.target_forwards) if speculative else None,
                "accepted_depth_histogram": list(agg.accepted_depth_histogram) if speculative else None,
                # Auto rows: decode steps per chosen draft length ([0]: plain) and speculative steps per map size.
                "auto": m.auto,
                "chosen_depth_histogram": list(agg.chosen_depth_histogram) if m.auto else None,
                "chosen_map_sizes": ({str(k): n for k, n in sorted(agg.chosen_map_sizes.items())}
                                     if m.auto else None),
                "drafter_prefills": drafter_prefills(gens) if m.auto else None,
            }
        )
    vanilla = Method(VANILLA)
    peer = next((m for m in result.methods if m.kind == LLAMACPP), None)
    for m, row in zip(result.methods, rows):
        base = vanilla if m.kind in TARGET_ONLY else m.reference  # a quantized vanilla row: against bf16's
        row["speedup_vs_vanilla"], speedup_vs_drafter = speedups(m, throughput)
        row["speedup_vs_llamacpp"] = _ratio(throughput[m], throughput.get(peer)) if peer and m != peer else None
        row["speedup_vs_drafter"] = speedup_vs_drafter
        baseline = m.same_drafter_without_frspec
        static = m.same_map_static  # context-aware rows: the same map, static
        row["speedup_vs_static_map"] = _ratio(throughput[m], throughput.get(static)) if static else None
        row["median_prompt_speedup_vs_vanilla"] = (
            _median_prompt_speedup(result, m, base) if m != vanilla and base in throughput else None
        )
        row["median_prompt_speedup_vs_drafter"] = (
            _median_prompt_speedup(result, m, baseline) if baseline in throughput else None
        )
        row.update(auto_vs_best_static(result.methods, m, throughput, end_to_end))
    return rows


def auto_vs_best_static(methods, m: Method, throughput: dict[Method, float],
                        end_to_end: dict[Method, float]) -> dict[str, Any]:
    """An auto row's ratios to the best static row, in decode throughput and end to end (each with its own best
    row: the two can differ); None for other rows."""
    best = best_static(methods, m, throughput) if m.auto else None
    best_e2e = best_static(methods, m, end_to_end) if m.auto else None
    return {
        "best_static": best.label if best is not None else None,
        "auto_vs_best_static": _ratio(throughput[m], throughput.get(best)) if best is not None else None,
        "best_static_end_to_end": best_e2e.label if best_e2e is not None else None,
        "auto_vs_best_static_end_to_end": (_ratio(end_to_end[m], end_to_end.get(best_e2e))
                                           if best_e2e is not None else None),
    }


def best_static(methods, auto: Method, throughput: dict[Method, float]) -> Method | None:
    """The fastest row a user could have picked in hindsight instead of `auto`: vanilla (same quantization) or
    the same drafter (draft model, or EAGLE head) at any static map size or none, any shape, no context rows."""
    same = [m for m in methods if not m.auto and m.quant == auto.quant and m.context_rows is None
            and (m.kind == VANILLA or (m.kind not in TARGET_ONLY and m.uses_eagle == auto.uses_eagle))]
    rated = [m for m in same if throughput.get(m)]
    return max(rated, key=lambda m: throughput[m]) if rated else None


def per_dataset(result: BenchResult, dataset_of: dict[str, str]) -> list[dict[str, Any]]:
    """A mixed run (--mix) broken down by dataset: for each dataset and method, the decoding and end-to-end
    throughputs and acceptance over that dataset's prompts, what the auto rows chose there, and each auto row's
    ratios to the best row a user could have picked for that dataset alone (`auto_vs_best_static`).
    `dataset_of`: prompt id -> dataset."""
    out = []
    for name in dict.fromkeys(dataset_of[p] for p in result.prompt_ids):
        throughput, end_to_end, stats = {}, {}, {}
        for m in result.methods:
            gens = [g for g in result.generations_of(m) if dataset_of.get(g.prompt_id) == name]
            if gens:
                stats[m] = _aggregate(gens)
                throughput[m] = stats[m].decode_tokens_per_s
                end_to_end[m] = stats[m].end_to_end_tokens_per_s
        for m, agg in stats.items():
            out.append({
                "dataset": name, "label": m.label, "auto": m.auto, "prompts": agg.requests,
                "decode_tokens_per_s": throughput[m], "end_to_end_tokens_per_s": end_to_end[m],
                "acceptance_length": agg.acceptance_length,
                "chosen_map_sizes": ({str(k): n for k, n in sorted(agg.chosen_map_sizes.items())}
                                     if m.auto else None),
                "chosen_depth_histogram": list(agg.chosen_depth_histogram) if m.auto else None,
                "drafter_prefills": drafter_prefills(gens) if m.auto else None,
                **auto_vs_best_static(result.methods, m, throughput, end_to_end),
            })
    return out
