"""Draft-tree shapes on the bench command line and in its tables.

On the command line a shape is `chain-D` (D drafted tokens in a row), `static-DxB` (depth D, B children per
node) or `dynamic-DxKxN` (EAGLE-2: depth D, top-K expanded per level, the N best nodes kept), comma-separated:

    --tree-shapes chain-4,static-3x2,dynamic-5x4x24

In tables a shape reads "chain-4", "tree 3x2" or "dyn d5 k4 n24" (`tree_label`).
"""

from __future__ import annotations

import re
from typing import Sequence

from frspec.errors import FrspecError
from frspec.spec.tree import TreeShape

SYNTAX = "chain-D, static-DxB or dynamic-DxKxN (e.g. chain-4,static-3x2,dynamic-5x4x24)"
_PATTERNS = {
    "chain": re.compile(r"chain-(\d+)"),
    "static": re.compile(r"static-(\d+)x(\d+)"),
    "dynamic": re.compile(r"dynamic-(\d+)x(\d+)x(\d+)"),
}


def parse_tree_shape(spec: str, option: str = "--tree-shapes") -> TreeShape:
    """One shape from its command-line spelling; a FrspecError naming `option` for anything else."""
    text = spec.strip().lower()
    for kind, pattern in _PATTERNS.items():
        match = pattern.fullmatch(text)
        if match is None:
            continue
        numbers = [int(n) for n in match.groups()]
        try:
            return getattr(TreeShape, kind)(*numbers)
        except FrspecError as e:
            raise FrspecError(f"{option}: bad shape {spec!r}: {e}") from None
    raise FrspecError(f"{option}: bad shape {spec!r}; expected {SYNTAX}")


def parse_tree_shapes(text: str, option: str = "--tree-shapes") -> tuple[TreeShape, ...]:
    """Comma-separated shapes, in order; empty entries are refused, as are repeats."""
    specs = [s.strip() for s in text.split(",")]
    if not text.strip() or any(not s for s in specs):
        raise FrspecError(f"{option}: expected a comma-separated list of {SYNTAX}, got {text!r}")
    shapes = tuple(parse_tree_shape(s, option) for s in specs)
    if len(set(shapes)) != len(shapes):
        raise FrspecError(f"{option} has duplicates: {text!r}")
    return shapes


def shape_spec(shape: TreeShape) -> str:
    """The command-line spelling of `shape` (the inverse of `parse_tree_shape`)."""
    if shape.kind == "chain":
        return f"chain-{shape.depth}"
    if shape.kind == "static":
        return f"static-{shape.depth}x{shape.branching}"
    return f"dynamic-{shape.depth}x{shape.branching}x{shape.budget}"


def tree_label(shape: TreeShape) -> str:
    """How a shape reads in the table's Tree column and in method labels."""
    if shape.kind == "chain":
        return f"chain-{shape.depth}"
    if shape.kind == "static":
        return f"tree {shape.depth}x{shape.branching}"
    return f"dyn d{shape.depth} k{shape.branching} n{shape.budget}"


def shapes_text(shapes: Sequence[TreeShape]) -> str:
    return ",".join(shape_spec(s) for s in shapes)
