"""Coverage: the share of a corpus's tokens that a frequency-ranked vocabulary of size k contains.

The FR-Spec drafter can only propose kept ids, so coverage on text like the target's output bounds how often a
draft token can be right at all. The curve ranks ids on one corpus (the build counts) and may measure them on
another (held-out counts), which is the honest number for a map used on unseen prompts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

import torch

from frspec.errors import FrspecError
from frspec.io import atomic_path
from frspec.vocab.token_map import TokenMap, rank_by_count

# The map sizes the FR-Spec paper and our benchmarks compare.
MARKED_SIZES = (8192, 16384, 32768, 65536)


def coverage_curve(rank_counts: torch.Tensor, eval_counts: torch.Tensor | None = None) -> torch.Tensor:
    """Coverage for every k = 1..V: entry k-1 is the share of `eval_counts` (default: `rank_counts` itself)
    covered by the k ids most frequent in `rank_counts`."""
    measured = rank_counts if eval_counts is None else eval_counts
    if measured.numel() != rank_counts.numel():
        raise FrspecError(
            f"counts cover different vocabularies ({rank_counts.numel()} and {measured.numel()} ids)"
        )
    total = int(measured.sum())
    if total <= 0:
        raise FrspecError("the counts are empty: no token was counted")
    return torch.cumsum(measured[rank_by_count(rank_counts)].to(torch.float64), 0) / total


def map_coverage(ids: torch.Tensor, counts: torch.Tensor) -> float:
    """The share of counted tokens whose id is in `ids`."""
    if int(ids.max()) >= counts.numel():
        raise FrspecError(f"token map ids reach {int(ids.max())}, outside the {counts.numel()}-id counts")
    total = int(counts.sum())
    if total <= 0:
        raise FrspecError("the counts are empty: no token was counted")
    return int(counts[ids].sum()) / total


def table_sizes(vocab_size: int, extra: Sequence[int] = ()) -> list[int]:
    """Powers of two from 256 up to the vocabulary, the vocabulary itself, and any `extra` sizes."""
    bad = [int(k) for k in extra if int(k) < 1]
    if bad:
        raise FrspecError(f"map sizes must be positive, got {bad[0]}")
    sizes = {1 << p for p in range(8, 40) if (1 << p) < vocab_size} | {vocab_size}
    sizes |= {int(k) for k in extra if int(k) <= vocab_size}
    return sorted(sizes)


def plot_coverage(
    curves: dict[str, torch.Tensor],
    path: str | Path,
    title: str = "Token coverage of frequency-ranked vocabularies",
    maps: dict[str, int] | None = None,
) -> None:
    """Save a PNG of coverage curves (label -> `coverage_curve` output) with k on a log axis, marking the usual
    map sizes (and `maps`: label -> k of specific maps)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=130)
    for label, curve in curves.items():
        ks = torch.arange(1, curve.numel() + 1)
        ax.plot(ks.numpy(), 100 * curve.numpy(), label=label, linewidth=1.6)
    vocab_size = max(c.numel() for c in curves.values())
    marked = [k for k in MARKED_SIZES if k < vocab_size]
    top = ax.get_xaxis_transform()  # x in data units, y in axes units: labels sit on the top edge
    for k in marked:
        ax.axvline(k, color="grey", linestyle=":", linewidth=0.9)
        ax.text(k, 1.01, f"{k // 1024}k", transform=top, ha="center", va="bottom", fontsize=8, color="dimgrey")
    for label, k in (maps or {}).items():
        if k not in marked:
            ax.axvline(k, color="black", linestyle="--", linewidth=0.9, label=label)
    if marked:
        # The numbers people look for, as a small table instead of crowded labels on the curves.
        names = list(curves)
        w = min(24, max(len(n) for n in names))
        rows = [f"{'k':>4} " + " ".join(f"{n[:w]:>{w}}" for n in names)]
        for k in marked:
            rows.append(f"{k // 1024:>3}k " + " ".join(f"{100 * float(curves[n][k - 1]):>{w - 1}.1f}%" for n in names))
        ax.text(0.99, 0.03, "\n".join(rows), transform=ax.transAxes, ha="right", va="bottom", family="monospace",
                fontsize=7, bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.9, "edgecolor": "lightgrey"})
    ax.set_xscale("log")
    ax.set_xlim(1, vocab_size)
    ax.set_ylim(0, 100)
    ax.set_xlabel("k (kept vocabulary, most frequent first)")
    ax.set_ylabel("tokens covered (%)")
    ax.set_title(title, fontsize=10, pad=16)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def context_coverage(
    examples: Iterable[tuple[Sequence[int], Sequence[int]]],
    token_map: TokenMap,
    extra_rows: int,
    budget: str = "fixed",
    keep: Iterable[int] | None = None,
    follow: bool = False,
) -> dict[str, float]:
    """Coverage of reference continuations by the static map and by the context-aware rows around it.

    `examples` are (prompt ids, continuation ids) pairs, e.g. a chat-formatted question and its reference answer.
    For each, the context-aware rows are the ones `ContextVocab` would hold for that prompt (the same selection,
    `ContextSlots`); with `follow`, each continuation token is also added after it is measured, as a drafter that
    adds the tokens generated so far would (teacher-forced on the reference). Under the fixed budget both count
    the map's k rows; under the additive one `rows` says how many the context-aware rows used on average, and a
    fair static comparison is a map of that size (`map_coverage` of a larger map).

    Returns token-weighted shares: `static`, `context`, and `examples`, `tokens`, `rows` (mean rows scored per
    continuation token), `context_rows` (of which hold request tokens), `dropped` (mean request tokens per
    example that found no row).
    """
    from frspec.vocab.context_vocab import ContextSlots

    if keep is None:
        keep = token_map.metadata.get("kept_tokens", {}).values()
    slots = ContextSlots(token_map.ids, token_map.vocab_size, extra_rows, budget, keep=keep)
    in_map = torch.zeros(token_map.vocab_size, dtype=torch.bool)
    in_map[token_map.ids] = True
    n_examples = tokens = static_hits = context_hits = rows = context_rows = dropped = 0
    for prompt, continuation in examples:
        cont = torch.as_tensor(continuation, dtype=torch.long).flatten()
        if cont.numel() == 0:
            continue
        if int(cont.min()) < 0 or int(cont.max()) >= token_map.vocab_size:
            raise FrspecError(f"continuation ids must lie in [0, {token_map.vocab_size})")
        slots.begin(prompt)
        n_examples += 1
        tokens += cont.numel()
        static_hits += int(in_map[cont].sum())
        if not follow:
            context_hits += int(slots.active[cont].sum())
            rows += slots.n_active * cont.numel()
            context_rows += slots.n_context * cont.numel()
        else:
            for t in cont.tolist():
                rows += slots.n_active
                context_rows += slots.n_context
                if slots.active[t]:
                    context_hits += 1
                else:
                    slots.add([t])
        dropped += slots.dropped
    if tokens == 0:
        raise FrspecError("no continuation tokens to measure coverage on")
    return {
        "examples": n_examples,
        "tokens": tokens,
        "static": static_hits / tokens,
        "context": context_hits / tokens,
        "rows": rows / tokens,
        "context_rows": context_rows / tokens,
        "dropped": dropped / n_examples,
    }
