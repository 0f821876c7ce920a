"""A benchmark prompt, and picking a balanced subset of prompts. Every prompt source (bench/datasets.py,
bench/long_context.py, bench/code_prompts.py) builds these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from frspec.errors import FrspecError


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: a stable id (for reports), the user message, and its category if the source has one.

    `history` holds the earlier turns of a multi-turn conversation ({"role", "content"} messages before the user
    message `text`); `reference` is a reference reply where the source has one (a QA answer, the conversation's
    own next assistant turn). The prompt's input length is that of `encode_prompt(tokenizer, prompt)`.
    """

    id: str
    text: str
    category: str | None = None
    history: tuple[dict[str, str], ...] = ()
    reference: str | None = None

    def messages(self) -> list[dict[str, str]]:
        """The conversation up to and including this user message."""
        return [dict(m) for m in self.history] + [{"role": "user", "content": self.text}]


def even_spread(prompts: Sequence[Prompt], n: int | None) -> list[Prompt]:
    """Pick n prompts spread evenly over categories, deterministically.

    Each category gets n // C prompts (its first ones, in file order); the n % C leftover slots go to categories
    spaced evenly through the category list, so 3 of MT-Bench's 8 categories are e.g. writing, reasoning, coding
    rather than the first three. The result is ordered round-robin over categories. Prompts without a category
    form one group, so a plain file gives its first n prompts.
    """
    if n is None:
        return list(prompts)
    if n <= 0:
        raise FrspecError(f"--num-prompts must be positive, got {n}")
    if n > len(prompts):
        raise FrspecError(f"asked for {n} prompts but the dataset has only {len(prompts)}")
    groups: dict[str | None, list[Prompt]] = {}
    for p in prompts:
        groups.setdefault(p.category, []).append(p)
    names = list(groups)
    quota = {name: n // len(names) for name in names}
    extra = n % len(names)
    for i in range(extra):
        quota[names[i * len(names) // extra]] += 1
    # A category smaller than its quota passes its surplus on to the next categories that still have prompts.
    short = sum(max(0, quota[c] - len(groups[c])) for c in names)
    for c in names:
        quota[c] = min(quota[c], len(groups[c]))
    while short:
        for c in names:
            if short and quota[c] < len(groups[c]):
                quota[c] += 1
                short -= 1
    picked = []
    for rank in range(max(quota.values())):
        picked.extend(groups[c][rank] for c in names if rank < quota[c])
    return picked
