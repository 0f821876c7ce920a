"""Draw docs/tree_mask.png: a small draft tree and the attention mask the target uses to read it in one forward.

    python docs/tree_figure.py
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from frspec.io import atomic_path  # noqa: E402
from frspec.decode.token_tree import TokenTree  # noqa: E402

WORDS = ["The", "cat", "dog", "sat", "ran", "is", "on"]
PARENTS = [-1, 0, 0, 1, 1, 2, 3]
PAST = 3  # committed tokens already in the cache


def draw(path: Path) -> None:
    tree = TokenTree.from_parents(list(range(len(WORDS))), PARENTS)
    fig, (ax_tree, ax_mask) = plt.subplots(1, 2, figsize=(11, 4.6), gridspec_kw={"width_ratios": [1, 1.3]})

    # Tree: x by order within a depth, y by depth.
    rows: dict[int, list[int]] = {}
    for node, depth in enumerate(tree.depths):
        rows.setdefault(depth, []).append(node)
    pos = {n: (i - (len(ns) - 1) / 2, -d) for d, ns in rows.items() for i, n in enumerate(ns)}
    for node, parent in enumerate(tree.parents):
        if parent >= 0:
            (x0, y0), (x1, y1) = pos[parent], pos[node]
            ax_tree.plot([x0, x1], [y0, y1], color="0.5", zorder=1)
    for node, (x, y) in pos.items():
        color = "#f4c542" if node == 0 else "#8ecae6"
        ax_tree.scatter([x], [y], s=1500, color=color, edgecolor="k", zorder=2)
        ax_tree.text(x, y + 0.05, WORDS[node], ha="center", va="center", fontsize=10)
        ax_tree.text(x, y - 0.33, f"node {node}", ha="center", va="center", fontsize=7, color="0.3")
    for d in rows:
        ax_tree.text(-2.3, -d, f"depth {d}\npos p+{d}", ha="left", va="center", fontsize=8, color="0.3")
    ax_tree.set_xlim(-2.4, 1.6)
    ax_tree.set_ylim(-tree.max_depth - 0.6, 0.6)
    ax_tree.set_title("draft tree (root = last committed token)")
    ax_tree.axis("off")

    visible = (tree.attention_mask(PAST)[0, 0] == 0).float().numpy()
    ax_mask.imshow(visible, cmap="Blues", vmin=-0.3, vmax=1.2)
    labels_k = [f"ctx{i}" for i in range(PAST)] + [f"{n}:{w}" for n, w in enumerate(WORDS)]
    ax_mask.set_xticks(range(len(labels_k)), labels_k, rotation=60, fontsize=8)
    ax_mask.set_yticks(range(len(WORDS)), [f"{n}:{w}" for n, w in enumerate(WORDS)], fontsize=8)
    ax_mask.axvline(PAST - 0.5, color="k", lw=1)
    for q in range(visible.shape[0]):
        for k in range(visible.shape[1]):
            ax_mask.text(k, q, "0" if visible[q, k] else "-inf", ha="center", va="center", fontsize=6,
                         color="w" if visible[q, k] else "0.4")
    ax_mask.set_title("tree attention mask [1, 1, q, past + q]: query = row, key = column")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


if __name__ == "__main__":
    draw(Path(__file__).with_name("tree_mask.png"))
