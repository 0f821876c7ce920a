"""PNG plots of a benchmark: a metric against token-map size, one line per num-spec-tokens."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from frspec.bench.methods import DRAFT, FRSPEC, VANILLA
from frspec.io import atomic_path


def plot_vs_map_size(
    rows: Sequence[dict[str, Any]],
    metric: str,
    ylabel: str,
    path: str | os.PathLike,
    vocab_size: int | None = None,
    title: str | None = None,
) -> Path:
    """Plot rows[metric] against token-map size for each num-spec-tokens and write a PNG to `path` atomically.

    The plain draft model sits at the right end of each line, at the full vocabulary size (labelled "full"), so a
    line reads as "what shrinking the LM head does" to that drafter. Vanilla, if present, is a dashed level.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; must be chosen before pyplot is imported
    import matplotlib.pyplot as plt

    sizes = sorted({r["token_map_size"] for r in rows if r["method"] == FRSPEC})
    full_x = vocab_size or (2 * sizes[-1] if sizes else 1)
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    try:
        for k in sorted({r["num_spec_tokens"] for r in rows if r["method"] in (DRAFT, FRSPEC)}):
            points = [
                (r["token_map_size"] if r["method"] == FRSPEC else full_x, r[metric])
                for r in rows
                if r["num_spec_tokens"] == k and r["method"] in (DRAFT, FRSPEC) and r.get(metric) is not None
            ]
            points.sort()
            if points:
                ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=f"k={k}")
        for r in rows:
            if r["method"] == VANILLA and r.get(metric) is not None:
                ax.axhline(r[metric], color="gray", linestyle="--", label="vanilla")
        ticks = sizes + [full_x]
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t // 1024}k" if t % 1024 == 0 else str(t) for t in sizes] + ["full"])
        ax.minorticks_off()
        ax.set_xlabel("token-map size (draft LM-head rows)")
        ax.set_ylabel(ylabel)
        ax.set_title(title or f"{ylabel} vs token-map size")
        ax.grid(True, alpha=0.3)
        ax.legend(title="num spec tokens", fontsize="small")
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)
    return Path(path)
