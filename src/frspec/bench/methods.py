"""The decoding methods a benchmark compares: vanilla, a draft model, and the same draft model with FR-Spec maps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from frspec.errors import FrspecError

VANILLA = "vanilla"
DRAFT = "draft"
FRSPEC = "fr-spec"


@dataclass(frozen=True)
class Method:
    """One row of the benchmark table.

    kind is "vanilla" (target only), "draft" (draft model over the full vocabulary) or "fr-spec" (the same draft
    model with its LM head restricted to a token map of token_map_size ids).
    """

    kind: str
    num_spec_tokens: int | None = None
    token_map_size: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in (VANILLA, DRAFT, FRSPEC):
            raise ValueError(f"unknown method kind {self.kind!r}")
        if (self.kind == VANILLA) != (self.num_spec_tokens is None):
            raise ValueError("num_spec_tokens is set exactly for the speculative methods")
        if (self.kind == FRSPEC) != (self.token_map_size is not None):
            raise ValueError("token_map_size is set exactly for fr-spec methods")

    @property
    def label(self) -> str:
        if self.kind == VANILLA:
            return VANILLA
        if self.kind == DRAFT:
            return f"draft k={self.num_spec_tokens}"
        return f"fr-spec k={self.num_spec_tokens} map={self.token_map_size}"

    @property
    def same_drafter_without_frspec(self) -> Method | None:
        """The method FR-Spec is judged against: the same draft model and depth over the full vocabulary."""
        if self.kind != FRSPEC:
            return None
        return Method(DRAFT, self.num_spec_tokens)


def plan_methods(num_spec_tokens: Sequence[int], token_map_sizes: Sequence[int], has_draft: bool = True) -> list[Method]:
    """Vanilla first, then for each num-spec-tokens the plain draft model followed by each FR-Spec map size.

    The plain draft method is always included for every depth, since FR-Spec's speedup is measured against it.
    """
    for k in num_spec_tokens:
        if k < 1:
            raise FrspecError(f"--num-spec-tokens values must be >= 1, got {k}")
    for size in token_map_sizes:
        if size < 1:
            raise FrspecError(f"--token-map-sizes values must be >= 1, got {size}")
    if len(set(num_spec_tokens)) != len(num_spec_tokens):
        raise FrspecError(f"--num-spec-tokens has duplicates: {list(num_spec_tokens)}")
    if len(set(token_map_sizes)) != len(token_map_sizes):
        raise FrspecError(f"--token-map-sizes has duplicates: {list(token_map_sizes)}")
    methods = [Method(VANILLA)]
    if not has_draft:
        return methods
    for k in num_spec_tokens:
        methods.append(Method(DRAFT, k))
        methods.extend(Method(FRSPEC, k, size) for size in token_map_sizes)
    return methods
