"""The benchmark report: a terminal table, and the same results saved as JSON, CSV, Markdown and PNG plots.

Every file goes through `atomic_path`, so an interrupted run leaves the previous report (or nothing), never half
of one. The row dicts come from `frspec.bench.summary.summarize`.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any, Sequence

from frspec.bench.plots import plot_row_costs, plot_vs_map_size
from frspec.io import atomic_path

# (row key, column title) in table order: the FR-Spec PR's columns (with the drafted shape beside the method), then
# speedups, LM-head share and correctness.
COLUMNS = [
    ("label", "Method"),
    ("tree", "Tree"),
    ("num_spec_tokens", "Num Spec Tokens"),
    ("token_map_size", "Token Map Size"),
    ("acceptance_length", "Mean Acceptance Length"),
    ("decode_tokens_per_s", "Decoding Throughput (tokens/s)"),
    ("total_time_s", "Total Time (s)"),
    ("end_to_end_tokens_per_s", "End-to-End Throughput (tokens/s)"),
    ("forward_ratio", "Forward Ratio"),
    ("speedup_vs_vanilla", "Speedup vs Vanilla"),
    ("speedup_vs_drafter", "Speedup vs Same Drafter w/o FR-Spec"),
    ("speedup_vs_llamacpp", "Speedup vs llama.cpp"),
    ("lm_head_share", "Draft LM-Head Share"),
    ("greedy_identical", "Greedy Identical"),
    # Issue 14: context-aware rows against the same static map, and how long the inputs were.
    ("context", "Context Rows"),
    ("speedup_vs_static_map", "Speedup vs Same Map Static"),
    ("input_tokens", "Input Tokens"),
    # Issue 21: the auto rows (the per-request controller) against the best row a user could have picked.
    ("auto_vs_best_static", "Auto vs Best Static"),
    ("auto_vs_best_static_end_to_end", "Auto vs Best Static (end to end)"),
    ("chosen_map_sizes", "Auto: Steps per Map Size"),
    ("chosen_depth_histogram", "Auto: Steps per Draft Length 0/1/.."),
    ("drafter_prefills", "Auto: Drafter Prefills"),
]

LEFT_ALIGNED = ("label", "tree")  # words; numbers align right
# Shown only when some row has a value.
OPTIONAL = ("speedup_vs_llamacpp", "auto_vs_best_static", "auto_vs_best_static_end_to_end", "chosen_map_sizes",
            "chosen_depth_histogram", "drafter_prefills")

PLOTS = [
    ("decode_tokens_per_s", "Decoding throughput (tokens/s)", "throughput_vs_map_size.png"),
    ("acceptance_length", "Mean acceptance length", "acceptance_vs_map_size.png"),
]

ROW_COSTS_PLOT = "row_costs.png"

METHODOLOGY = """\
- All methods run in one process on the same prompts (chat template applied) with the same max new tokens;
  target, draft and EAGLE head are loaded once. Each method has one short unmeasured warm-up generation (on the
  last 256 tokens of the first prompt). Methods are interleaved per prompt and the starting method rotates from
  prompt to prompt (with `--repeats R`, from round to round too: R rounds of all methods on each prompt, and each
  method's run of median decode time kept). EAGLE rows run on the target
  the head was trained for; when that is not the main target they form their own table, run after the main one,
  with that target's own vanilla row as their reference.
- Tree: the drafted shape. chain-D: D tokens in a row; static-DxB: a static tree of depth D with B children per
  node; dynamic-DxKxN: an EAGLE-2 dynamic tree of depth D expanding the top-K nodes per level and keeping the N
  best. Num Spec Tokens is the drafted depth. The target verifies a whole tree in one forward.
- Mean Acceptance Length: tokens emitted per target decode forward (prefill excluded), from totals over all
  prompts. Vanilla is 1 by definition; a drafter drafting depth k can reach at most k + 1.
- Decoding Throughput: tokens emitted by decode steps / decode time (wall time minus the target's prefill), from
  totals over all prompts (`decode_tokens_per_s`); the target's prefill is the same work for every method, a
  draft model's prefill over the prompt is not: it is speculation's cost, so it counts in decode time
  (`draft_prefill_time_s` in the JSON; results whose JSON lacks it left it out). End-to-End Throughput: all
  tokens / wall time, prefill included (`end_to_end_tokens_per_s`). Total Time: wall time of all measured
  generations of the method, prefill included.
- Forward Ratio: mean measured time of one drafter step over mean time of one target decode forward (from the
  timed forwards themselves, not from parameter counts), so it falls when FR-Spec shrinks the draft LM head.
- Speedups: ratios of decoding throughputs measured side by side in the same run, against the vanilla row of
  the same target. "Same drafter w/o FR-Spec" is the same draft model or EAGLE head with the same shape over the
  full vocabulary. Per-prompt medians are in the JSON.
- Context Rows: "+ctx=N fixed" drafts with the map's rows of which up to N hold the request's own tokens (its
  prompt, then its accepted tokens), "+ctx=N additive" with the map's rows plus up to N such rows
  (frspec/vocab/context_vocab.py); "Speedup vs Same Map Static" compares it with the same map's static row.
- Input Tokens: mean prompt length in tokens (chat template included) of the prompts decoded.
- Auto rows ("fr-spec auto", Token Map Size = the ranking's size): one frequency-ranked copy of the drafter's head
  (frspec/vocab/ranked_vocab.py) serves every map size, and the per-request controller
  (frspec/decode/controller.py) chooses before every step the map size (4k..64k, the ranking's, or no map) and,
  for a draft model's chain, the draft length (0 = plain decoding) from this request's observed coverage and
  acceptance and this machine's measured step costs (measured once per machine, model pair and weight format,
  after 128/512/2048-token contexts and read at each step's context; cached). The static rows of the same
  drafter are served by the same ranked head at their size; a quantized auto row ("int4 fr-spec auto") runs the
  int4 target and draft body with its ranked head float. Auto vs Best Static: its decoding
  throughput over the fastest row's of vanilla and the same drafter's static rows (any map or none, any shape),
  which a user could only pick in hindsight; "(end to end)": the same with end-to-end throughputs, against the
  row fastest end to end. The controller weighs a draft model's prefill over the prompt (or a window of it), and
  where no prefill costs less than drafting saves it decodes plainly. Steps per map size / per draft length: what
  it chose.
- Draft LM-Head Share: time in the drafter's LM head (the draft model's, or the EAGLE head's) / total drafting
  time.
- Greedy Identical: whether each greedy output equals vanilla's token for token; otherwise the number of prompts
  that differ. Each difference is listed with the target's top-1/top-2 logit margin at the first differing
  position: bf16 forwards over 1 and k+1 rows round differently, so near-ties can flip; fp32/fp64 must match.
- Quantized rows ("int4 ...", "int8 ..."): the target and draft run on PyTorch's weight-only int4/int8 kernels
  (docs/quantization.md), in the same interleaved loop as the other rows. Each quantized speculative row's greedy
  identity and speedup are against that quantized target's own vanilla row ("int4 vanilla"), not the bf16 one: a
  quantized target is another function; the quantized vanilla row's speedup is against the bf16 vanilla row.
- llama.cpp vanilla: the same GGUF decoded greedily by llama.cpp (llama-cpp-python) on the same prompt token ids
  and token budget, timed the same way. Its greedy identity is n/a (other kernels); how many of its tokens agree
  with frspec int4 vanilla's is `reference_agreement` in the JSON. Speedup vs llama.cpp: ratio of decoding
  throughputs against this row.
"""


def format_value(key: str, value: Any) -> str:
    """How a row value is shown in the terminal and Markdown tables ("-" for not applicable)."""
    if value is None:
        return "-"
    if key == "chosen_map_sizes":
        return " ".join(f"{k}:{n}" for k, n in value.items()) or "-"
    if key == "chosen_depth_histogram":
        return "/".join(str(n) for n in value)
    if key == "drafter_prefills":
        return " ".join(f"{k}:{n}" for k, n in value.items() if n) or "-"
    if key in ("speedup_vs_vanilla", "speedup_vs_drafter", "speedup_vs_static_map", "speedup_vs_llamacpp",
               "auto_vs_best_static", "auto_vs_best_static_end_to_end", "full_row_vs_compact"):
        return f"{value:.2f}x"
    if key == "lm_head_share":
        return f"{100 * value:.1f}%"
    if key in ("acceptance_length", "forward_ratio"):
        return f"{value:.2f}"
    if key == "input_tokens":
        return f"{value:.0f}"
    if key in ("decode_tokens_per_s", "end_to_end_tokens_per_s", "total_time_s"):
        return f"{value:.2f}" if value < 100 else f"{value:.1f}"
    return str(value)


def columns_for(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """COLUMNS without the optional ones no row fills."""
    return [(k, n) for k, n in COLUMNS if k not in OPTIONAL or any(r.get(k) is not None for r in rows)]


def table_cells(row: dict[str, Any], columns: Sequence[tuple[str, str]] = COLUMNS) -> list[str]:
    """A row as table cells. The Method cell is the kind (vanilla/draft/fr-spec/eagle/eagle+fr-spec/mtp/mtp+fr-spec,
    prefixed by the quantization, "int4 fr-spec"; "llama.cpp vanilla"): shape, depth and map size have columns."""
    cells = [format_value(key, row.get(key)) for key, _ in columns]
    if row.get("method") == "llama.cpp":
        cells[0] = str(row.get("label", cells[0]))
    else:
        cells[0] = " ".join(x for x in (row.get("quant"), row.get("method", cells[0]),
                                        "auto" if row.get("auto") else None) if x)
    return cells


def render_table(rows: Sequence[dict[str, Any]], title: str | None = None, console: Any = None) -> None:
    """Print the results table to the terminal with rich.

    Titles break at spaces onto several lines and cells never wrap or shrink, so numbers stay whole; when the
    output is not a terminal (a log file, a pipe) the table gets the width it needs. The Method column shows the
    kind (see `table_cells`).
    """
    import textwrap

    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, header_style="bold")
    columns = columns_for(rows)
    body = [table_cells(row, columns) for row in rows]
    needed = 1
    for i, (key, name) in enumerate(columns):
        header = textwrap.wrap(name, width=12, break_on_hyphens=False)
        width = max([len(line) for line in header] + [len(cells[i]) for cells in body])
        needed += width + 3
        table.add_column("\n".join(header), justify="left" if key in LEFT_ALIGNED else "right", no_wrap=True,
                         min_width=width)
    for cells in body:
        table.add_row(*cells)
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=max(console.width, needed))
    console.print(table)


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    columns = columns_for(rows)
    lines = [
        "| " + " | ".join(name for _, name in columns) + " |",
        "|" + "|".join(":---" if key in LEFT_ALIGNED else "---:" for key, _ in columns) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(table_cells(row, columns)) + " |")
    return "\n".join(lines)


def rows_by_target(rows: Sequence[dict[str, Any]]) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """Rows grouped by their "target" (one group per benchmarked target, in order; None for rows without one)."""
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row.get("target"), []).append(row)
    return list(groups.items())


def controller_costs_line(costs: dict[str, Any]) -> str:
    """One line for an auto row's step costs (StepCosts.to_dict()): when they were measured, the target's forward
    over the row counts a chain's choice turns on, and how the engine rescaled them from its timed forwards; the
    whole table is in results.json."""
    provenance = costs.get("provenance") or {}
    target = costs.get("target_costs") or {}
    rows = ", ".join(f"{n} {'row' if n == '1' else 'rows'} {target[n] * 1000:.0f} ms"
                     for n in sorted(target, key=int) if int(n) <= 4)
    draft = (costs.get("draft_base_costs") or {}).get("1")
    when = provenance.get("measured_at")
    line = ("step costs " + (f"measured {when}" if when else "given (not measured here)")
            + f": the target's forward after {costs.get('context')} tokens {rows}"
            + (f"; the drafter's step {draft * 1000:.0f} ms" if draft is not None else ""))
    recalibrated = provenance.get("recalibrated")
    if recalibrated:  # the table at the run's end, rescaled from the forwards the engine timed (cost_calibration.py)
        scales = ", ".join(f"x{s:.2f} at {n} {'row' if n == '1' else 'rows'}"
                           for n, s in (recalibrated.get("target_scales") or {}).items())
        draft_scale = recalibrated.get("draft_scale")
        drafting = "not rescaled" if draft_scale is None else f"x{draft_scale:.2f}"
        line += (f", rescaled by the run's end from the engine's timed forwards: the target "
                 f"{scales or 'not (too few forwards of any row count)'} (the last "
                 f"{recalibrated.get('target_forwards')} forwards kept), drafting {drafting} (the last "
                 f"{recalibrated.get('draft_steps')} steps)")
    return line + " (all of them: `controller_costs` in results.json)"


def _half_kernels(kernels: dict[str, Any] | None) -> str:
    """The machine line's note of the kernels this process chose for half-precision calls (bench/environment.py)."""
    if not kernels:
        return ""
    wide = kernels.get("fp32_from_rows")
    through = f"from {wide} rows" if wide else "never"
    native = "yes" if kernels.get("one_row_native") else "no"
    return f"; {kernels['dtype']} calls through fp32: {through}, one-row calls on PyTorch's kernel: {native}"


def markdown_report(payload: dict[str, Any], plot_files: Sequence[str] = ()) -> str:
    """The whole report as Markdown: run metadata, one table per target, greedy differences, plots, methodology."""
    meta = payload["meta"]
    machine = meta.get("machine", {})
    lines = [
        "# frspec bench",
        "",
        f"- Commit: `{meta.get('commit', 'unknown')}`",
        f"- Target: `{meta.get('target')}`; draft: `{meta.get('draft')}`; dtype: {meta.get('dtype')}; "
        f"threads: {meta.get('threads')}",
    ]
    if meta.get("quant") or meta.get("draft_quant"):  # --quant: every main row runs on the quantized weights
        lines.append(f"- Weights: target {meta.get('quant') or meta.get('dtype')}, draft "
                     f"{meta.get('draft_quant') or meta.get('dtype')} (activations {meta.get('dtype')}); every row "
                     "of the main table runs on them")
    if meta.get("eagle_head") == "mtp":
        lines.append(f"- Drafter: the MTP layers of target `{meta.get('eagle_target')}`")
    elif meta.get("eagle_head"):
        lines.append(f"- EAGLE head: `{meta['eagle_head']}` on target `{meta.get('eagle_target')}`")
    lines += [
        f"- Machine: {machine.get('cpu', 'unknown')}, {machine.get('cores')} cores, {machine.get('platform')}"
        + (f"; kernels: {machine['kernel_isa']}" if machine.get("kernel_isa") else "")
        + _half_kernels(machine.get("half_kernels"))
        + (f", GPU {machine['gpu']}" if machine.get("gpu") else ""),
        f"- Prompts: {meta.get('num_prompts')} from {meta.get('dataset')}; max new tokens: "
        f"{meta.get('max_new_tokens')}"
        + (" (EOS ignored: every answer runs to it)" if meta.get("ignore_eos") else "")
        + f"; decoding: {meta.get('decoding')}",
    ]
    for section in meta.get("sections") or [meta]:
        where = f" (target `{section['target']}`)" if len(meta.get("sections") or ()) > 1 else ""
        lines.append(f"- Token maps{where}: {section.get('token_maps_source', '-')}")
    for section in meta.get("sections") or [meta]:
        for label, costs in (section.get("controller_costs") or {}).items():
            lines.append(f"- `{label}` chose by " + controller_costs_line(costs))
    lines.append(f"- Measured run time: {meta.get('run_time_s', 0):.1f} s (warm-up {meta.get('warmup_time_s', 0):.1f} s)")
    if (meta.get("repeats") or 1) > 1:
        lines.append(f"- Rounds: {meta['repeats']} of all methods on each prompt; each method's run of median decode "
                     "time on the prompt is kept (of an even count, the faster middle one)")
    for note in meta.get("notes") or ():
        lines.append(f"- Note: {note}")
    if meta.get("load_average"):
        lines.append("- Load average when the run ended (1/5/15 min): "
                     + " / ".join(f"{x:.2f}" for x in meta["load_average"]))
    lines.append("")
    groups = rows_by_target(payload["rows"])
    for target, rows in groups:
        if len(groups) > 1:
            lines += [f"### Target `{target}`", ""]
        lines += [markdown_table(rows), ""]
    by_dataset = payload.get("per_dataset") or []
    if by_dataset:
        lines += ["## Per dataset (mixed run)", "",
                  "Each dataset's prompts of the mixed run: tokens/s (decode, and end to end with the prefill) and "
                  "acceptance per row, what the auto rows chose there, and their ratio to the best row for that "
                  "dataset alone (picked in hindsight), in decode tokens/s and end to end.", "",
                  "| Target | Dataset | Method | Prompts | Tokens/s | End-to-End Tokens/s | Acceptance "
                  "| Auto: Steps per Map Size | Auto: Steps per Length 0/1/.. | Auto: Drafter Prefills "
                  "| Auto vs Best Static (best) | Auto vs Best Static, End to End (best) |",
                  "|:---|:---|:---|---:|---:|---:|---:|:---|:---|:---|:---|:---|"]
        for r in by_dataset:
            ratios = [f"{r[key]:.2f}x ({r[best]})" if r.get(key) is not None else "-"
                      for key, best in (("auto_vs_best_static", "best_static"),
                                        ("auto_vs_best_static_end_to_end", "best_static_end_to_end"))]
            lines.append(
                f"| {r.get('target', '-')} | {r['dataset']} | {r['label']} | {r['prompts']} | "
                f"{format_value('decode_tokens_per_s', r['decode_tokens_per_s'])} | "
                f"{format_value('end_to_end_tokens_per_s', r.get('end_to_end_tokens_per_s'))} | "
                f"{format_value('acceptance_length', r['acceptance_length'])} | "
                f"{format_value('chosen_map_sizes', r['chosen_map_sizes'])} | "
                f"{format_value('chosen_depth_histogram', r['chosen_depth_histogram'])} | "
                f"{format_value('drafter_prefills', r.get('drafter_prefills'))} | {' | '.join(ratios)} |")
        lines.append("")
    divergences = payload.get("divergences") or []
    if divergences:
        lines += ["## Greedy outputs that differ from vanilla", "",
                  "| Target | Method | Prompt | First Differing Position | Vanilla Token | Method Token "
                  "| Target Top-2 Margin |",
                  "|:---|:---|:---|---:|---:|---:|---:|"]
        for d in divergences:
            lines.append(
                f"| {d.get('target', '-')} | {d['method']} | {d['prompt_id']} | {d['position']} | "
                f"{d['vanilla_token']} | {d['method_token']} | {d['top2_margin']:.4f} |"
            )
        lines.append("")
    curves = payload.get("row_costs_s") or {}
    if curves:
        lines += ["## Target forward cost against rows", "",
                  "Median ms of one target forward over n new rows after a 128-token KV cache (5 timed after 2 "
                  "warm-up forwards; tune/cost_model.py). Verifying k drafts is one forward over k + 1 rows.", "",
                  "| Rows | " + " | ".join(curves) + " |", "|---:|" + "---:|" * len(curves)]
        for n in sorted({int(n) for c in curves.values() for n in c}):
            lines.append(f"| {n} | " + " | ".join(
                f"{c[str(n)] * 1e3:.1f}" if str(n) in c else "-" for c in curves.values()) + " |")
        lines.append("")
    for name in plot_files:
        lines += [f"![{name}]({name})", ""]
    lines += ["## Methodology", "", METHODOLOGY]
    return "\n".join(lines)


def write_json(path: str | os.PathLike, payload: dict[str, Any]) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    return Path(path)


def write_csv(path: str | os.PathLike, rows: Sequence[dict[str, Any]]) -> Path:
    """All row fields, table columns first, raw numbers (no formatting)."""
    keys = [key for key, _ in COLUMNS]
    for row in rows:
        keys += [k for k in row if k not in keys]
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            for row in rows:
                writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in keys})
    return Path(path)


def write_markdown(path: str | os.PathLike, payload: dict[str, Any], plot_files: Sequence[str] = ()) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(markdown_report(payload, plot_files), encoding="utf-8")
    return Path(path)


def write_report(out_dir: str | os.PathLike, payload: dict[str, Any]) -> list[Path]:
    """Write results.json, results.csv, results.md and the plots into out_dir; return the paths written.

    payload has "meta" (run description), "rows" (one per method) and optionally "divergences" and "generations".
    Plots are drawn only when there is at least one speculative row to put on them.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = payload["rows"]
    written = []
    plot_files = []
    if any(r["method"] != "vanilla" for r in rows):
        vocab_size = payload["meta"].get("vocab_size")
        for metric, ylabel, name in PLOTS:
            written.append(plot_vs_map_size(rows, metric, ylabel, out / name, vocab_size=vocab_size))
            plot_files.append(name)
    if payload.get("row_costs_s"):
        written.append(plot_row_costs(payload["row_costs_s"], out / ROW_COSTS_PLOT))
        plot_files.append(ROW_COSTS_PLOT)
    written.append(write_json(out / "results.json", payload))
    written.append(write_csv(out / "results.csv", rows))
    written.append(write_markdown(out / "results.md", payload, plot_files))
    return written
