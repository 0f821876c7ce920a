"""PNG plots of a benchmark: a metric against token-map size, one line per drafter and drafted shape; the target's
forward cost against rows, one line per dtype."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from frspec.bench.methods import TARGET_ONLY, WITHOUT_MAP
from frspec.io import atomic_path


def _series_name(row: dict[str, Any], with_target: bool) -> str:
    """"draft chain-3", "int4 draft chain-2", "eagle dyn d5 k4 n24": a drafter (with or without a map), its
    quantization and its shape."""
    drafter = WITHOUT_MAP.get(row["method"], row["method"])
    name = f"{drafter} {row.get('tree') or 'chain-' + str(row['num_spec_tokens'])}"
    if row.get("context"):  # context-aware rows are a line of their own beside the static maps'
        name += f" {row['context']}"
    if row.get("quant"):
        name = f"{row['quant']} {name}"
    return f"{row['target']}: {name}" if with_target else name


def _level_name(row: dict[str, Any], with_target: bool) -> str:
    """"vanilla", "int4 vanilla", "llama.cpp vanilla": a target-only row drawn as a level."""
    name = row.get("label") or " ".join(x for x in (row.get("quant"), row["method"]) if x)
    return f"{row['target']}: {name}" if with_target else name


def _save(fig, path: str | os.PathLike) -> Path:
    """Write `fig` to `path` as a PNG atomically (never a half-written file)."""
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return Path(path)


def plot_vs_map_size(
    rows: Sequence[dict[str, Any]],
    metric: str,
    ylabel: str,
    path: str | os.PathLike,
    vocab_size: int | None = None,
    title: str | None = None,
) -> Path:
    """Plot rows[metric] against token-map size for each drafter and shape and write a PNG to `path` atomically.

    The drafter without a map sits at the right end of each line, at the full vocabulary size (labelled "full"),
    so a line reads as "what shrinking the LM head does" to that drafter. Vanilla rows (bf16, quantized) and the
    llama.cpp row, if present, are dashed levels (one per target when the rows cover several).
    """
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; must be chosen before pyplot is imported
    import matplotlib.pyplot as plt

    sizes = sorted({r["token_map_size"] for r in rows if r.get("token_map_size") is not None})
    full_x = vocab_size or (2 * sizes[-1] if sizes else 1)
    with_target = len({r.get("target") for r in rows}) > 1
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["method"] not in TARGET_ONLY and r.get(metric) is not None and not r.get("auto"):  # auto: no one size
            x = r["token_map_size"] if r.get("token_map_size") is not None else full_x
            series.setdefault(_series_name(r, with_target), []).append((x, r[metric]))
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    try:
        for name, points in series.items():
            points.sort()
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name)
        levels = [r for r in rows if r["method"] in TARGET_ONLY and r.get(metric) is not None]
        for r, style in zip(levels, ["--", ":", "-."] * len(levels)):
            ax.axhline(r[metric], color="gray", linestyle=style, label=_level_name(r, with_target))
        ticks = sizes + [full_x]
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t // 1024}k" if t % 1024 == 0 else str(t) for t in sizes] + ["full"])
        ax.minorticks_off()
        ax.set_xlabel("token-map size (draft LM-head rows)")
        ax.set_ylabel(ylabel)
        ax.set_title(title or f"{ylabel} vs token-map size")
        ax.grid(True, alpha=0.3)
        ax.legend(title="drafter and shape", fontsize="small")
        return _save(fig, path)
    finally:
        plt.close(fig)


def plot_row_costs(curves: Mapping[str, Mapping[int, float]], path: str | os.PathLike, title: str | None = None
                   ) -> Path:
    """The target's forward cost against rows (tune/cost_model.py), one line per variant ("bf16", "int4"), written
    to `path` atomically: where verifying k drafts (k + 1 rows) stops costing about one forward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    try:
        for label, costs in curves.items():
            xs = sorted(int(x) for x in costs)
            ys = [costs[x] if x in costs else costs[str(x)] for x in xs]
            ax.plot(xs, [y * 1e3 for y in ys], marker="o", label=label)
        ax.set_xlabel("rows per target forward (1 pending token + drafts)")
        ax.set_ylabel("ms per forward (median)")
        ax.set_ylim(bottom=0)
        ax.set_title(title or "Target forward cost vs rows")
        ax.grid(True, alpha=0.3)
        ax.legend(title="target weights")
        return _save(fig, path)
    finally:
        plt.close(fig)
