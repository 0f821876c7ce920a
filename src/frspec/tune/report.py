"""`frspec tune`'s report: the tables it prints and writes (tune.md) and the JSON record of every measurement and
prediction (tune.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from frspec.bench.report import write_json
from frspec.io import atomic_path
from frspec.tune.predict import cheap_rows
from frspec.tune.search import TuneResult, comparison_rows, prediction_rows


def write_report(result: TuneResult, meta: dict, directory: Path) -> None:
    """tune.md and tune.json in `directory` (created if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_path(directory / "tune.md") as tmp:
        tmp.write_text(report_markdown(result, meta), encoding="utf-8")
    write_json(directory / "tune.json", {
        "meta": meta, "pick": result.pick.label, "comparison": comparison_rows(result),
        "predictions": prediction_rows(result), "measurements": measurements_dict(result), "notes": result.notes,
    })


def report_markdown(result: TuneResult, meta: dict) -> str:
    """tune.md: the run's provenance, then predicted against measured, the predictions and the measured costs."""
    lines = [
        f"# frspec tune: {meta['target']} / {meta['draft']}, {meta['dtype']}",
        "",
        f"- command: `{meta['command']}`",
        f"- commit {meta['commit']}, {meta['machine']['cpu']} ({meta['machine']['cores']} cores), "
        f"{meta['threads']} threads, load average before {meta['load_before']}, after {meta['load_after']}",
        f"- calibration: {meta['dataset']}, {meta['num_prompts']} prompts x {meta['max_new_tokens']} greedy tokens; "
        f"confirmed on the first {meta['confirm_prompts']} x {meta['confirm_tokens']} tokens, interleaved",
        f"- pick: **{result.pick.label}**; {meta['time_s']:.0f} s in all",
        "",
        "## Predicted against measured (the confirming bench)",
        "",
        comparison_markdown(result),
        "",
        "## Predictions (fastest first)",
        "",
        predictions_markdown(result),
        "",
        "## Measured costs",
        "",
        costs_markdown(result),
    ]
    if result.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result.notes]
    return "\n".join(lines) + "\n"


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def comparison_markdown(result: TuneResult) -> str:
    lines = ["| config | predicted rank | tokens/step pred. | tokens/step meas. | tok/s pred. | tok/s meas. | "
             "meas./pred. | vs vanilla |", "|---|---|---|---|---|---|---|---|"]
    for r in comparison_rows(result):
        name = f"**{r['config']}** (pick)" if r["picked"] else r["config"]
        lines.append(
            f"| {name} | {r['predicted_rank']} | {_fmt(r['predicted_tokens_per_step'], '.2f')} | "
            f"{_fmt(r['measured_tokens_per_step'], '.2f')} | {_fmt(r['predicted_tokens_per_s'], '.2f')} | "
            f"{_fmt(r['measured_tokens_per_s'], '.2f')} | {_fmt(r['measured_over_predicted'], '.2f')} | "
            f"{_fmt(r['measured_speedup_vs_vanilla'], '.2f')}x |")
    return "\n".join(lines)


def predictions_markdown(result: TuneResult, limit: int = 12) -> str:
    lines = ["| rank | config | tokens/step | acceptance per position | target ms | draft ms | step ms | tok/s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in prediction_rows(result, limit):
        acc = " ".join(f"{a:.2f}" for a in r["accepted_per_position"]) or "-"
        lines.append(f"| {r['rank']} | {r['config']} | {r['tokens_per_step']:.2f} | {acc} | {r['target_ms']:.1f} | "
                     f"{r['draft_ms']:.1f} | {r['step_ms']:.1f} | {r['predicted_tokens_per_s']:.2f} |")
    return "\n".join(lines)


def costs_markdown(result: TuneResult) -> str:
    m = result.measurements
    rows = ", ".join(f"{n}: {c * 1e3:.1f}" for n, c in sorted(m.target_costs.items()))
    base = ", ".join(f"{n}: {c * 1e3:.1f}" for n, c in sorted(m.draft_base_costs.items()))
    heads = "; ".join(f"{'full' if k is None else k}: {v[1] * 1e3:.2f}" for k, v in m.head_costs.items())
    drafter, head = ("MTP layer", "shared LM head") if m.ranks_by_depth else ("draft", "draft LM head")
    return "\n".join([
        f"- target ms per forward by rows ({result.context}-token context): {rows}; cheap rows (<= 1.5x one row): "
        f"1..{cheap_rows(m.target_costs)}",
        f"- {drafter} ms per forward without its LM head, by rows: {base}",
        f"- {head} ms for one row, by map size: {heads}",
        f"- overheads ms: per speculative step {m.step_overhead_s * 1e3:.1f}, per draft forward "
        f"{m.draft_forward_overhead_s * 1e3:.1f}, per vanilla step {m.vanilla_overhead_s * 1e3:.1f}",
    ])


def _key(size: int | None) -> str:
    return "full" if size is None else str(size)


def measurements_dict(result: TuneResult) -> dict[str, Any]:
    m = result.measurements
    return {
        "context_tokens": result.context,
        "target_costs_s": {str(n): c for n, c in sorted(m.target_costs.items())},
        "draft_base_costs_s": {str(n): c for n, c in sorted(m.draft_base_costs.items())},
        "head_costs_s": {_key(k): {str(n): c for n, c in v.items()} for k, v in m.head_costs.items()},
        "ranks": {_key(k): v for k, v in m.ranks.items()},
        "ranks_by_depth": m.ranks_by_depth,  # MTP: ranks[map][prompt][depth - 1][position]
        "step_overhead_s": m.step_overhead_s,
        "draft_forward_overhead_s": m.draft_forward_overhead_s,
        "vanilla_overhead_s": m.vanilla_overhead_s,
    }
