"""How big a draft tree is, and its one text syntax.

    chain-D          D drafted tokens in a row (plain speculative decoding; a tree of width 1)
    static-DxB       depth D, B children per node (a full B-ary tree, B + B^2 + ... + B^D drafted nodes)
    dynamic-DxKxN    EAGLE-2: depth D, the top-K nodes expanded per level, the N best drafted nodes kept

`TreeShape.parse(text)` reads it and `str(shape)` writes it, everywhere: `frspec generate`, `frspec bench`
(`--tree-shapes chain-4,static-3x2,dynamic-5x4x24`), the stats record and the reports. The generate options
--num-spec-tokens / --tree-depth / --tree-branching / --tree-budget map onto the same shapes (`from_options`).
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass
from typing import Sequence

from frspec.errors import FrspecError

# A static tree larger than this is almost surely a typo (branching 8, depth 6 = 299592 nodes).
MAX_TREE_NODES = 4096

SYNTAX = "chain-D, static-DxB or dynamic-DxKxN (e.g. chain-4,static-3x2,dynamic-5x4x24)"
_PATTERNS = {
    "chain": re.compile(r"chain-(\d+)"),
    "static": re.compile(r"static-(\d+)x(\d+)"),
    "dynamic": re.compile(r"dynamic-(\d+)x(\d+)x(\d+)"),
}


def check_num_spec_tokens(num_spec_tokens: int) -> None:
    if isinstance(num_spec_tokens, bool) or not isinstance(num_spec_tokens, int) or num_spec_tokens < 1:
        raise FrspecError(f"num_spec_tokens must be an integer >= 1, got {num_spec_tokens!r}")


@dataclass(frozen=True)
class TreeShape:
    """How big a draft tree is. Build with `chain`, `static`, `dynamic` or `parse`.

    depth      the deepest drafted level (the number of drafted tokens on the longest path);
    branching  children per expanded node (static, chain = 1) or EAGLE-2's top-k (dynamic);
    budget     dynamic trees only: how many drafted nodes are kept in the end.
    """

    depth: int
    branching: int = 1
    budget: int | None = None

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise FrspecError(f"tree depth must be >= 1, got {self.depth}")
        if self.branching < 1:
            raise FrspecError(f"tree branching must be >= 1, got {self.branching}")
        if self.budget is not None and self.budget < 1:
            raise FrspecError(f"tree budget must be >= 1, got {self.budget}")
        if self.budget is None and self.static_size() > MAX_TREE_NODES:
            raise FrspecError(
                f"a static tree of depth {self.depth} and branching {self.branching} has {self.static_size()} "
                f"nodes (limit {MAX_TREE_NODES}); use a dynamic tree (--tree-budget) or a smaller tree"
            )

    @classmethod
    def chain(cls, num_spec_tokens: int) -> TreeShape:
        """A chain of num_spec_tokens drafted tokens: how every layer asks for one. Its length is checked here, the
        one place a chain is spelled (build_generator's num_spec_tokens and --num-spec-tokens end up here)."""
        if isinstance(num_spec_tokens, bool) or not isinstance(num_spec_tokens, numbers.Integral):
            raise FrspecError(f"num_spec_tokens must be an integer >= 1, got {num_spec_tokens!r}")
        if num_spec_tokens < 1:
            raise FrspecError(f"tree depth must be >= 1, got {num_spec_tokens} (num_spec_tokens: a chain's length)")
        return cls(depth=int(num_spec_tokens), branching=1)

    @classmethod
    def static(cls, depth: int, branching: int) -> TreeShape:
        return cls(depth=depth, branching=branching)

    @classmethod
    def dynamic(cls, depth: int, topk: int, budget: int) -> TreeShape:
        return cls(depth=depth, branching=topk, budget=budget)

    @classmethod
    def parse(cls, text: str, option: str = "tree shape") -> TreeShape:
        """A shape from its text (`chain-4`, `static-3x2`, `dynamic-5x4x24`); a FrspecError naming `option` else."""
        spelled = text.strip().lower()
        for kind, pattern in _PATTERNS.items():
            match = pattern.fullmatch(spelled)
            if match is None:
                continue
            try:
                return getattr(cls, kind)(*(int(n) for n in match.groups()))
            except FrspecError as e:
                raise FrspecError(f"{option}: bad shape {text!r}: {e}") from None
        raise FrspecError(f"{option}: bad shape {text!r}; expected {SYNTAX}")

    @classmethod
    def parse_list(cls, text: str, option: str = "--tree-shapes") -> tuple[TreeShape, ...]:
        """Comma-separated shapes, in order; empty entries are refused, as are repeats."""
        specs = [s.strip() for s in text.split(",")]
        if not text.strip() or any(not s for s in specs):
            raise FrspecError(f"{option}: expected a comma-separated list of {SYNTAX}, got {text!r}")
        shapes = tuple(cls.parse(s, option) for s in specs)
        if len(set(shapes)) != len(shapes):
            raise FrspecError(f"{option} has duplicates: {text!r}")
        return shapes

    @classmethod
    def from_options(
        cls, num_spec_tokens: int = 4, depth: int | None = None, branching: int | None = None,
        budget: int | None = None,
    ) -> TreeShape:
        """The shape for generate's --num-spec-tokens / --tree-depth / --tree-branching / --tree-budget.

        Without --tree-depth, a chain of num_spec_tokens; depth alone is a chain of that depth; with branching B a
        static tree; with a budget an EAGLE-2 dynamic tree, whose branching (top-k per level) must then be given.
        """
        check_num_spec_tokens(num_spec_tokens)
        if depth is None:
            if branching is not None or budget is not None:
                raise FrspecError("--tree-branching and --tree-budget shape a tree: give --tree-depth too")
            return cls.chain(num_spec_tokens)
        if budget is not None:
            if branching is None:
                raise FrspecError("a dynamic tree (--tree-budget) needs --tree-branching, the top-k expanded per level")
            return cls.dynamic(depth, branching, budget)
        return cls.static(depth, 1 if branching is None else branching)

    @property
    def kind(self) -> str:
        if self.budget is not None:
            return "dynamic"
        return "chain" if self.branching == 1 else "static"

    def static_size(self) -> int:
        """Drafted nodes of the full tree (ignoring the budget)."""
        return sum(self.branching**d for d in range(1, self.depth + 1))

    @property
    def max_drafts(self) -> int:
        """An upper bound on drafted nodes per step, for sizing buffers and reporting."""
        return self.static_size() if self.budget is None else self.budget

    def with_depth(self, depth: int) -> TreeShape:
        """The same shape at most `depth` deep (near the end of the token budget)."""
        return self if depth >= self.depth else TreeShape(depth, self.branching, self.budget)

    def __str__(self) -> str:
        """The shape's text, which `TreeShape.parse` reads back: chain-4, static-3x2, dynamic-5x4x24."""
        if self.kind == "chain":
            return f"chain-{self.depth}"
        if self.kind == "static":
            return f"static-{self.depth}x{self.branching}"
        return f"dynamic-{self.depth}x{self.branching}x{self.budget}"


def shapes_text(shapes: Sequence[TreeShape]) -> str:
    return ",".join(str(s) for s in shapes)
