"""The decoding methods a benchmark compares: vanilla, a draft model, an EAGLE head, the target's own MTP layers,
each drafter with FR-Spec maps.

A drafter drafts a chain or a token tree, always given as its TreeShape (frspec.decode.tree_shape; a chain of k
tokens is `TreeShape.chain(k)`); only a draft model's auto row has none (the controller chooses the length per
step). A draft model's chain is labelled by k ("draft k=3", the rows the bench had before trees); its trees, and
every EAGLE shape including chains, by the shape's text (`str(shape)`). The engine drafts both through the same
step.

A method may run on a quantized copy of the target and draft (`quant` "int4"/"int8": "int4 vanilla",
"int4 fr-spec k=3 map=32768"); its greedy reference is that quantized target's own vanilla row, never the bf16
one. `llama.cpp vanilla` is the peer row: the same GGUF decoded by llama.cpp, compared on speed (its tokens are
a fidelity figure against frspec's int4 vanilla, not a correctness check: other kernels, other rounding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from frspec.decode.controller import AUTO_DEPTHS
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError

VANILLA = "vanilla"
DRAFT = "draft"
FRSPEC = "fr-spec"
EAGLE = "eagle"
EAGLE_FRSPEC = "eagle+fr-spec"
# The target checkpoint's own MTP layers (models/mtp.py): drafted like an EAGLE head, from the target's hidden states.
MTP = "mtp"
MTP_FRSPEC = "mtp+fr-spec"
LLAMACPP = "llama.cpp"
KINDS = (VANILLA, DRAFT, FRSPEC, EAGLE, EAGLE_FRSPEC, MTP, MTP_FRSPEC, LLAMACPP)
# Rows that decode with the target alone: reference levels, not drafters.
TARGET_ONLY = (VANILLA, LLAMACPP)
# The quantized target llama.cpp's row is compared with (a Q4_K_M GGUF is mostly int4 blocks).
LLAMACPP_REFERENCE_QUANT = "int4"
# Heads that draft from the target's hidden states (the bench's "EAGLE slot": one head per target).
EAGLE_KINDS = (EAGLE, EAGLE_FRSPEC, MTP, MTP_FRSPEC)
HEAD_KINDS = (EAGLE, MTP)
# The same drafter with a token map (FR-Spec) and over its full vocabulary.
WITH_MAP = {DRAFT: FRSPEC, EAGLE: EAGLE_FRSPEC, MTP: MTP_FRSPEC}
WITHOUT_MAP = {v: k for k, v in WITH_MAP.items()}


@dataclass(frozen=True)
class Method:
    """One row of the benchmark table.

    kind is "vanilla" (target only), "draft" (draft model over the full vocabulary), "fr-spec" (the same draft
    model with its LM head restricted to a token map of token_map_size ids), "eagle" (an EAGLE head) or
    "eagle+fr-spec" (the head with a token map), "mtp" / "mtp+fr-spec" (the target's own MTP layers, drafting as a
    head does). `tree` is the shape drafted (None only for a draft model's auto row: the controller chooses the
    chain's length), num_spec_tokens its depth (an auto row's: the longest it may draft). A map method with `context_rows` drafts context-aware
    (vocab/context_vocab.py): the map plus up to that many rows for the request's tokens, under `context_budget`
    ("fixed": within the map's rows; "additive": beside them).
    """

    kind: str
    num_spec_tokens: int | None = None
    token_map_size: int | None = None
    tree: TreeShape | None = None
    context_rows: int | None = None
    context_budget: str | None = None
    quant: str | None = None  # the target's and draft's quantization ("int4", "int8"); None: as loaded
    # The per-request controller (decode/controller.py) chooses the map size (from token_map_size's map as the
    # ranking: its smaller prefixes, itself, or no map) and, for a draft model's chain, the draft length too
    # (num_spec_tokens is then the longest it may draft, 0 = plain decoding included).
    auto: bool = False
    # vLLM V1 only: draft through the full-vocabulary -inf row that every V2 speculator sees, instead of V1's compact
    # path over the kept columns (FRSPEC_V1_COMPACT=0), to measure what the full row costs.
    vllm_full_row: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown method kind {self.kind!r}")
        if self.kind == LLAMACPP and self.quant is not None:
            raise ValueError("the llama.cpp row runs the GGUF's own quantization")
        if (self.kind in TARGET_ONLY) != (self.num_spec_tokens is None):
            raise ValueError("num_spec_tokens is set exactly for the speculative methods")
        if (self.kind in WITHOUT_MAP) != (self.token_map_size is not None):
            raise ValueError("token_map_size is set exactly for fr-spec methods")
        if self.kind in TARGET_ONLY and self.tree is not None:
            raise ValueError("vanilla drafts no tree")
        if self.kind not in TARGET_ONLY and self.tree is None and not (self.auto and self.kind == FRSPEC):
            raise ValueError("a speculative method drafts a shape: give it (TreeShape.chain(k) for a chain); only "
                             "a draft model's auto row leaves the length to the controller")
        if self.tree is not None and self.tree.depth != self.num_spec_tokens:
            raise ValueError("num_spec_tokens must be the tree's depth")
        if self.vllm_full_row and self.token_map_size is None:
            raise ValueError("the full-row path is a way to apply a token map")
        if (self.context_rows is None) != (self.context_budget is None):
            raise ValueError("context_rows and context_budget are set together")
        if self.context_rows is not None and self.kind not in WITHOUT_MAP:
            raise ValueError("context rows extend a token map: only fr-spec methods have them")
        if self.auto and (self.kind not in WITHOUT_MAP or self.context_rows is not None):
            raise ValueError("an auto row chooses among a static map's sizes: fr-spec methods without context rows")

    @classmethod
    def drafting(cls, kind: str, shape: TreeShape, token_map_size: int | None = None, quant: str | None = None
                 ) -> Method:
        """A speculative method drafting `shape`."""
        return cls(kind, shape.depth, token_map_size, shape, quant=quant)

    @property
    def tree_label(self) -> str | None:
        """The drafted shape as the Tree column shows it (its text: "chain-4", "static-3x2", "dynamic-5x4x24");
        None for vanilla, "auto" for a chain whose length the controller chooses."""
        if self.kind in TARGET_ONLY:
            return None
        return "auto" if self.tree is None else str(self.tree)

    @property
    def label(self) -> str:
        if self.kind == LLAMACPP:
            return f"{LLAMACPP} {VANILLA}"
        prefix = f"{self.quant} " if self.quant else ""
        if self.kind == VANILLA:
            return prefix + VANILLA
        if self.auto:
            shape = "auto" if self.tree is None else f"{self.tree_label} map=auto"
            return f"{prefix}{self.kind} {shape} (maps <= {self.token_map_size} or none)"
        chain = self.kind in (DRAFT, FRSPEC) and self.tree.kind == "chain"
        shape = f"k={self.num_spec_tokens}" if chain else self.tree_label
        return (f"{prefix}{self.kind} {shape}"
                + (f" map={self.token_map_size}" if self.token_map_size is not None else "")
                + (f" {self.context_label}" if self.context_rows is not None else "")
                + (" full-row" if self.vllm_full_row else ""))

    @property
    def context_label(self) -> str | None:
        """"+ctx=1024 fixed": the context-aware rows of a map method (None for a static map)."""
        return None if self.context_rows is None else f"+ctx={self.context_rows} {self.context_budget}"

    @property
    def uses_eagle(self) -> bool:
        return self.kind in EAGLE_KINDS

    @property
    def same_drafter_without_frspec(self) -> Method | None:
        """The method FR-Spec is judged against: the same drafter and shape over the full vocabulary."""
        if self.kind not in WITHOUT_MAP or self.auto:  # auto rows: against the best static row (summary.py)
            return None
        return Method(WITHOUT_MAP[self.kind], self.num_spec_tokens, None, self.tree, quant=self.quant)

    @property
    def reference(self) -> Method:
        """The vanilla row this method's greedy output is checked against: the same (quantized) target alone. For
        llama.cpp, frspec's int4 vanilla on the same weights (agreement there is fidelity, not correctness)."""
        if self.kind == LLAMACPP:
            return Method(VANILLA, quant=LLAMACPP_REFERENCE_QUANT)
        return Method(VANILLA, quant=self.quant)

    @property
    def same_map_static(self) -> Method | None:
        """The method context-aware drafting is judged against: the same drafter, shape and map, static rows."""
        if self.context_rows is None:
            return None
        return Method(self.kind, self.num_spec_tokens, self.token_map_size, self.tree, quant=self.quant)


def _check_sizes(values: Sequence[int], option: str) -> None:
    for v in values:
        if v < 1:
            raise FrspecError(f"{option} values must be >= 1, got {v}")
    if len(set(values)) != len(values):
        raise FrspecError(f"{option} has duplicates: {list(values)}")


def _with_maps(kind: str, shape: TreeShape, token_map_sizes: Sequence[int], quant: str | None = None
               ) -> list[Method]:
    """The drafter over its full vocabulary, then with each map (FR-Spec's speedup is measured against the first)."""
    return [Method.drafting(kind, shape, quant=quant)] + [Method.drafting(WITH_MAP[kind], shape, s, quant)
                                                          for s in token_map_sizes]


def plan_methods(
    num_spec_tokens: Sequence[int],
    token_map_sizes: Sequence[int],
    has_draft: bool = True,
    draft_tree_shapes: Sequence[TreeShape] = (),
    eagle_tree_shapes: Sequence[TreeShape] = (),
    eagle_token_map_sizes: Sequence[int] = (),
    quant: str | None = None,
    auto: bool = False,
    head_kind: str = EAGLE,
) -> list[Method]:
    """Vanilla first; then with a draft model, for each num-spec-tokens and then each draft tree shape, the plain
    drafter followed by each FR-Spec map size, then (with `auto` and maps) the `auto` row choosing length and map
    size per step; then for each EAGLE shape the head followed by each EAGLE map size and that shape's auto-size
    row. `head_kind` names the head of those rows: "eagle", or "mtp" for the target's own MTP layers. Auto rows rank
    by the largest map; a quantized (`quant`) auto row runs the quantized target and draft body with its ranked head
    packed like the static rows' heads, and the controller's costs are measured for those models and that head.

    The drafter without a map is always included, since FR-Spec's speedup is measured against it. A draft tree
    shape that is a chain already planned by num-spec-tokens is not repeated.
    """
    _check_sizes(num_spec_tokens, "--num-spec-tokens")
    _check_sizes(token_map_sizes, "--token-map-sizes")
    _check_sizes(eagle_token_map_sizes, "--eagle-token-map-sizes")
    if quant is not None and eagle_tree_shapes:
        raise ValueError("EAGLE rows run on the unquantized target")
    if head_kind not in HEAD_KINDS:
        raise ValueError(f"head_kind must be one of {', '.join(HEAD_KINDS)}, got {head_kind!r}")
    methods = [Method(VANILLA, quant=quant)]
    if has_draft:
        shapes = [TreeShape.chain(k) for k in num_spec_tokens] + list(draft_tree_shapes)
        for shape in shapes:
            methods.extend(m for m in _with_maps(DRAFT, shape, token_map_sizes, quant) if m not in methods)
        if auto and token_map_sizes:
            methods.append(Method(FRSPEC, max(AUTO_DEPTHS), max(token_map_sizes), quant=quant, auto=True))
    for shape in eagle_tree_shapes:
        methods.extend(m for m in _with_maps(head_kind, shape, eagle_token_map_sizes) if m not in methods)
        if auto and eagle_token_map_sizes:
            methods.append(Method(WITH_MAP[head_kind], shape.depth, max(eagle_token_map_sizes), shape, auto=True))
    return methods


def add_context_methods(methods: Sequence[Method], context_rows: Sequence[int],
                        budgets: Sequence[str] = ("fixed",)) -> list[Method]:
    """`methods` with, after each FR-Spec map method, the same map drafting context-aware at each row count and
    budget (each judged against the static map row just before it)."""
    from frspec.vocab.context_vocab import BUDGETS

    if not context_rows:
        return list(methods)
    _check_sizes(context_rows, "--context-rows")
    for budget in budgets:
        if budget not in BUDGETS:
            raise FrspecError(f"context budget must be one of {', '.join(BUDGETS)}, got {budget!r}")
    if not budgets or len(set(budgets)) != len(budgets):
        raise FrspecError(f"--context-budgets must name each budget once, got {list(budgets)}")
    out = []
    for m in methods:
        out.append(m)
        if m.kind in WITHOUT_MAP and m.context_rows is None and not m.auto:
            out += [Method(m.kind, m.num_spec_tokens, m.token_map_size, m.tree, n, b, quant=m.quant)
                    for n in context_rows for b in budgets]
    return out
