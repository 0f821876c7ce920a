"""PNG plots of a benchmark: a metric against token-map size, one line per drafter and drafted shape."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from frspec.bench.methods import VANILLA, WITHOUT_MAP
from frspec.io import atomic_path


def _series_name(row: dict[str, Any], with_target: bool) -> str:
    """"draft chain-3", "eagle dyn d5 k4 n24": a drafter (with or without a map) and its shape."""
    drafter = WITHOUT_MAP.get(row["method"], row["method"])
    name = f"{drafter} {row.get('tree') or 'chain-' + str(row['num_spec_tokens'])}"
    if row.get("context"):  # context-aware rows are a line of their own beside the static maps'
        name += f" {row['context']}"
    return f"{row['target']}: {name}" if with_target else name


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
    so a line reads as "what shrinking the LM head does" to that drafter. Vanilla, if present, is a dashed level
    (one per target when the rows cover several).
    """
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; must be chosen before pyplot is imported
    import matplotlib.pyplot as plt

    sizes = sorted({r["token_map_size"] for r in rows if r.get("token_map_size") is not None})
    full_x = vocab_size or (2 * sizes[-1] if sizes else 1)
    with_target = len({r.get("target") for r in rows}) > 1
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["method"] != VANILLA and r.get(metric) is not None:
            x = r["token_map_size"] if r.get("token_map_size") is not None else full_x
            series.setdefault(_series_name(r, with_target), []).append((x, r[metric]))
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    try:
        for name, points in series.items():
            points.sort()
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name)
        vanilla = [r for r in rows if r["method"] == VANILLA and r.get(metric) is not None]
        for r, style in zip(vanilla, ["--", ":", "-."] * len(vanilla)):
            label = f"{r['target']}: vanilla" if with_target else "vanilla"
            ax.axhline(r[metric], color="gray", linestyle=style, label=label)
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
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)
    return Path(path)
