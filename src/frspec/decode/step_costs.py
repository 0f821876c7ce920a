"""What one decode step costs on this machine: the cost model `frspec tune` predicts with and the per-request
controller (decode/controller.py) decides with, and the measurement of its target curve.

A speculative step of shape S at map size k costs

    target(1 + drafted nodes)                                   one target forward over the tree's rows
  + sum over the draft's forwards of width w: base(w) + head_k(w) + draft_forward_overhead
  + step_overhead                                               verification, cache surgery, bookkeeping

and a vanilla step target(1) + vanilla_overhead. Costs are measured at a few row counts, widths and map sizes and
interpolated in between (`interpolate`): a matmul over k rows costs about linearly in k.

The target's forward (and a draft model's) also depends on the context it attends over: at a long context each
forward reads a large KV cache once for all its rows, so a verified row costs relatively less than at a short one.
Costs measured at several context lengths (`target_by_context`, `draft_base_by_context`: context -> rows ->
seconds) are interpolated in the context too, linearly (attention's work grows linearly in it), and extrapolated
linearly beyond the longest measured context; `step_time_s(..., context=L)` reads them at L. Without them (a tune
config written before they existed) or with `context=None`, the flat tables stand for every context.

It lives in decode/ (not bench/) because the engine's controller reads it; bench/tune_predict.py builds its
predictions on the same `StepCosts.step_time_s`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import torch

from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError


def interpolate(costs: Mapping[int, float], n: int) -> float:
    """costs[n], or a linear interpolation between measured points; beyond the largest one a linear
    extrapolation from the two largest (never below the largest); below the smallest, the smallest's."""
    if n in costs:
        return costs[n]
    xs = sorted(costs)
    if n < xs[0]:
        return costs[xs[0]]
    lo = max(x for x in xs if x < n)
    hi = min((x for x in xs if x > n), default=None)
    if hi is None:
        if len(xs) < 2:
            return costs[lo]
        a, b = xs[-2], xs[-1]
        return max(costs[b], costs[b] + (costs[b] - costs[a]) / (b - a) * (n - b))
    return costs[lo] + (costs[hi] - costs[lo]) * (n - lo) / (hi - lo)


def draft_forward_widths(shape: TreeShape) -> list[int]:
    """Rows of each draft forward in one step: a chain's one row per draft; a tree's root forward (one row), then
    one forward per expanded level (a static tree's B^l nodes, a dynamic tree's `branching` best)."""
    if shape.kind == "chain":
        return [1] * shape.depth
    if shape.kind == "dynamic":
        return [1] + [shape.branching] * (shape.depth - 1)
    return [1] + [shape.branching ** level for level in range(1, shape.depth)]


@dataclass
class StepCosts:
    """Measured seconds (see the module docstring).

    target_costs[n]      one target forward over n rows
    draft_base_costs[w]  one draft forward without its LM head over w rows
    head_costs[k][w]     the draft LM head over its first k rows and picking its choices, for w hidden states;
                         key None is the drafter's whole vocabulary (`full_size` rows when known)
    target_by_context[L][n], draft_base_by_context[L][w]
                         the same at a context of L tokens (may be empty: the flat tables then hold at every
                         context); the flat tables are those at `context` tokens (None: unknown)
    """

    target_costs: dict[int, float]
    draft_base_costs: dict[int, float]
    head_costs: dict[int | None, dict[int, float]]
    step_overhead_s: float = 0.0
    draft_forward_overhead_s: float = 0.0
    vanilla_overhead_s: float = 0.0
    full_size: int | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    context: int | None = None
    target_by_context: dict[int, dict[int, float]] = field(default_factory=dict)
    draft_base_by_context: dict[int, dict[int, float]] = field(default_factory=dict)

    @property
    def contexts(self) -> list[int]:
        """The context lengths the costs were measured at (empty: the costs do not depend on the context)."""
        return sorted(set(self.target_by_context) | set(self.draft_base_by_context))

    def target(self, rows: int, context: int | None = None) -> float:
        """One target forward over `rows` rows, after `context` tokens (None: the flat table)."""
        return _at_context(self.target_costs, self.target_by_context, rows, context)

    def draft_base(self, width: int, context: int | None = None) -> float:
        """One draft forward without its head over `width` rows, after `context` tokens (None: the flat table)."""
        return _at_context(self.draft_base_costs, self.draft_base_by_context, width, context)

    def behind_s(self, behind: int, context: int | None = None) -> float:
        """What a drafter that plain steps left `behind` tokens behind pays before its next draft, beyond that
        draft's own cost: one forward over those tokens and the new one (`catch_up_s(1 + behind)`); 0 when it is
        not behind. The one rule for it: the controller weighs it (`rates`), counts it (`count_saving`), and the
        calibration predicts it (cost_calibration.StepTimings.add_draft)."""
        return self.catch_up_s(1 + behind, context) if behind > 0 else 0.0

    def drafter_prefill_s(self, tokens: int) -> float:
        """What a drafter's prefill over `tokens` prompt tokens costs: a one-row draft forward plus the extra rows,
        at the prompt's own context (what `controller.drafter_prefill_tokens` weighs a prompt or window by)."""
        return self.draft_base(1, tokens) + self.catch_up_s(tokens, tokens)

    def catch_up_s(self, rows: int, context: int | None = None) -> float:
        """Seconds a draft forward over `rows` rows costs beyond a one-row one: what a drafter pays before it drafts
        when plain steps left it `rows - 1` tokens behind (or, over a prompt, to prefill). The step model counts one
        row for a chain's first forward, so this is extra. From the drafter's own widths where more than one was
        measured (a draft model's forward over 64 rows, and over 31 and 32 where its wide calls go through fp32
        from 32 rows on: decode/cost_measure.py); else (EAGLE and MTP heads, cost
        records from before) its one-row cost scaled by the target's curve over rows: the same dtype and kernels,
        and over rows a forward costs what its matmuls' kernel makes it (nearly flat on a GPU, about linear in bf16
        on a CPU without bf16 instructions)."""
        if rows <= 1:
            return 0.0
        if len(self.draft_base_costs) >= 2:
            return max(self.draft_base(rows, context) - self.draft_base(1, context), 0.0)
        one = self.target(1, context)
        return self.draft_base(1, context) * max(self.target(rows, context) / one - 1.0, 0.0) if one > 0 else 0.0

    def head(self, k: int | None, width: int = 1) -> float:
        """The LM head over k rows (None: the whole vocabulary) for `width` hidden states, interpolated in k."""
        if k in self.head_costs:
            return interpolate(self.head_costs[k], width)
        by_size = {(self.full_size if key is None else key): per_width for key, per_width in self.head_costs.items()
                   if key is not None or self.full_size is not None}
        if not by_size:
            return interpolate(self.head_costs[None], width)
        k = self.full_size if k is None else k
        if k is None:
            k = max(by_size)
        return interpolate({size: interpolate(per_width, width) for size, per_width in by_size.items()}, k)

    def draft_time_s(self, shape: TreeShape, k: int | None, context: int | None = None) -> float:
        return sum(self.draft_base(w, context) + self.head(k, w) + self.draft_forward_overhead_s
                   for w in draft_forward_widths(shape))

    def step_time_s(self, shape: TreeShape | None, k: int | None = None, context: int | None = None) -> float:
        """Seconds of one decode step drafting `shape` (None: vanilla) over a k-row map (None: no map), after
        `context` tokens (None: the flat tables, whatever context they were measured at)."""
        if shape is None or shape.depth == 0:
            return self.target(1, context) + self.vanilla_overhead_s
        return (self.target(shape.max_drafts + 1, context) + self.draft_time_s(shape, k, context)
                + self.step_overhead_s)

    # -- files -----------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        def keyed(d: Mapping) -> dict[str, Any]:
            return {("full" if key is None else str(key)): value for key, value in d.items()}

        return {
            "target_costs": keyed(self.target_costs), "draft_base_costs": keyed(self.draft_base_costs),
            "head_costs": {("full" if k is None else str(k)): keyed(v) for k, v in self.head_costs.items()},
            "step_overhead_s": self.step_overhead_s, "draft_forward_overhead_s": self.draft_forward_overhead_s,
            "vanilla_overhead_s": self.vanilla_overhead_s, "full_size": self.full_size,
            "provenance": dict(self.provenance), "context": self.context,
            "target_costs_by_context": {str(c): keyed(v) for c, v in sorted(self.target_by_context.items())},
            "draft_base_costs_by_context": {str(c): keyed(v) for c, v in sorted(self.draft_base_by_context.items())},
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "step costs") -> StepCosts:
        try:
            def ints(d: Mapping) -> dict[int, float]:
                out = {int(key): float(value) for key, value in d.items()}
                if not out or any(n < 1 or v < 0 for n, v in out.items()):
                    raise ValueError("empty, or a row count < 1 or a negative time")
                return out

            def by_context(d: Mapping | None) -> dict[int, dict[int, float]]:
                out = {int(c): ints(v) for c, v in (d or {}).items()}
                if any(c < 1 for c in out):
                    raise ValueError("a context length < 1")
                return out

            heads = {(None if key == "full" else int(key)): ints(v) for key, v in data["head_costs"].items()}
            if not heads:
                raise ValueError("no head costs")
            # The per-context tables are optional: a tune config or cache written without them still loads, and
            # its flat tables then stand for every context.
            costs = cls(ints(data["target_costs"]), ints(data["draft_base_costs"]), heads,
                        float(data.get("step_overhead_s", 0.0)), float(data.get("draft_forward_overhead_s", 0.0)),
                        float(data.get("vanilla_overhead_s", 0.0)),
                        None if data.get("full_size") is None else int(data["full_size"]),
                        dict(data.get("provenance") or {}),
                        None if data.get("context") is None else int(data["context"]),
                        by_context(data.get("target_costs_by_context")),
                        by_context(data.get("draft_base_costs_by_context")))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise FrspecError(f"{where}: not a valid cost record ({e})") from None
        if 1 not in costs.target_costs or any(1 not in v for v in costs.target_by_context.values()):
            raise FrspecError(f"{where}: the target's cost for one row is missing")
        return costs


def _at_context(flat: Mapping[int, float], by_context: Mapping[int, Mapping[int, float]], n: int,
                context: int | None) -> float:
    """The cost of n rows from `flat`, or, with per-context tables and a context, interpolated (linearly, see the
    module docstring) between the tables of the measured contexts around it. A context's table lacking n between
    two row counts it has follows the fullest table's shape there (`interpolate_like`)."""
    if context is None or not by_context:
        return interpolate(flat, n)
    fullest = fullest_table(flat, by_context)
    return interpolate({c: interpolate_like(per_rows, n, fullest) for c, per_rows in by_context.items()}, context)


def fullest_table(flat: Mapping[int, float], by_context: Mapping[int, Mapping[int, float]]) -> Mapping[int, float]:
    """The table whose shape a row count missing from a context's table follows (`interpolate_like`): the
    per-context table that measures the most row counts (the shortest context's, decode/cost_measure.py), or `flat`
    without per-context tables."""
    return max(by_context.values(), key=len, default=flat)


def interpolate_like(costs: Mapping[int, float], n: int, shape: Mapping[int, float]) -> float:
    """costs[n]; where n lies between two measured points lo < n < hi that `shape` (a table measuring more points)
    also spans, the same share of the way from costs[lo] to costs[hi] as `shape` (interpolated) goes from lo to n
    on its way to hi; else `interpolate`.

    Why: the measurement times every row count at the shortest context and only a few at the longer ones
    (decode/cost_measure.py), and a forward's cost over rows is not a line where its kernels change with the row
    count. Measured with the int4 target on the AVX512 EPYC after 128 tokens: 62 / 69 / 82 / 94 / 174 / 180 ms for
    1/2/3/4/5/7 rows. A line from 4 to 7 rows put 5 rows at a longer context at 129 ms, and the engine then timed
    them at 1.55x that: long chains looked cheaper than they were."""
    if n in costs:
        return costs[n]
    below = [x for x in costs if x < n]
    above = [x for x in costs if x > n]
    if below and above and shape:
        lo, hi = max(below), min(above)
        if min(shape) <= lo and hi <= max(shape):
            base = interpolate(shape, lo)
            span = interpolate(shape, hi) - base
            if span > 0:
                share = min(max((interpolate(shape, n) - base) / span, 0.0), 1.0)
                return costs[lo] + (costs[hi] - costs[lo]) * share
    return interpolate(costs, n)


# Tokens of a timed context that are run through the model before the rest of its cache is filled with random keys
# and values (measure_row_costs_by_context): enough for every layer to hold its real shapes and dtypes.
REAL_PREFIX = 16


def _grow_cache(cache, length: int, gen: torch.Generator) -> bool:
    """Lengthen every layer of `cache` to `length` tokens with random keys and values of the layer's own shape and
    dtype, if every layer is a plain full-attention one holding fewer tokens; False (and the cache untouched) if
    not: a sliding-window or linear-attention layer keeps state that random values would not stand for."""
    from transformers.cache_utils import DynamicLayer

    layers = list(getattr(cache, "layers", []))
    if not layers or any(type(layer) is not DynamicLayer or not layer.is_initialized
                         or layer.get_seq_length() >= length for layer in layers):
        return False
    for layer in layers:
        extra = length - layer.get_seq_length()
        for name in ("keys", "values"):
            held = getattr(layer, name)
            more = torch.randn((*held.shape[:-2], extra, held.shape[-1]), generator=gen, dtype=torch.float32)
            setattr(layer, name, torch.cat([held, more.to(held.device, held.dtype)], dim=-2))
    return True


@torch.inference_mode()
def measure_row_costs(model: torch.nn.Module, rows: Iterable[int] = range(1, 17), context: int = 128,
                      repeats: int = 5, warmup: int = 2) -> dict[int, float]:
    """Median seconds of one forward of `model` over n new rows after a `context`-token KV cache, for each n.

    The cache is cut back to `context` after every forward, so each one sees the same state, as a decode step
    of the engine does.
    """
    return measure_row_costs_by_context(model, rows, (context,), repeats, warmup)[context]


@torch.inference_mode()
def measure_row_costs_by_context(model: torch.nn.Module, rows: Iterable[int], contexts: Iterable[int],
                                 repeats: int = 5, warmup: int = 2, later_rows: Iterable[int] | None = None
                                 ) -> dict[int, dict[int, float]]:
    """measure_row_costs at each context length: {context: {n: seconds}}. One random prefix (seeded) grows from
    the shortest context to the longest. Where every cache layer is plain full attention, only its first
    `REAL_PREFIX` tokens are run through the model and the rest of each layer's keys and values are random
    (`_grow_cache`): a forward's cost depends on the cache's shape, not its values, and a real prefill of 2048
    tokens takes minutes where bf16 has no fast kernel (7 tokens/s on an AVX2-only EPYC). Other caches (sliding
    window, linear attention) are prefilled for real, once in all. A hybrid target (linear-attention layers) is
    timed through the per-node forward the engine verifies with (decode/hybrid_target.py), not its chunked kernel.
    `later_rows`: the row counts timed at the contexts after the shortest (default `rows`; fewer keep the
    measurement short: the cost model interpolates in rows, decode/step_costs.py)."""
    from frspec.decode.hybrid_target import drop_hybrid_nodes, hybrid_target_forward, is_hybrid
    from frspec.decode.kv_cache import enable_rollback, new_cache, truncate_cache
    from frspec.decode.token_tree import TokenTree

    device = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    rows = list(rows)
    later_rows = rows if later_rows is None else list(later_rows)
    hybrid = is_hybrid(model)
    cache = new_cache(model)
    length, out = 0, {}

    def forward(ids: torch.Tensor, context: int):
        """The target's forward over `ids` after `context` cached tokens, as the engine runs a chain of that many
        rows (a hybrid target: per node, decode/hybrid_target.py); returns what cuts the cache back."""
        if hybrid:
            tree = TokenTree.chain(int(ids[0, 0]), ids[0, 1:].tolist())
            _, record = hybrid_target_forward(model, tree, cache, context, None)
            return lambda: drop_hybrid_nodes(cache, context, record)
        model(input_ids=ids, cache=cache, use_cache=True)
        return lambda: truncate_cache(cache, context)
    for context in sorted(set(int(c) for c in contexts)):
        if context < 1:
            raise FrspecError(f"a context length must be >= 1, got {context}")
        if length == 0:  # a real prefix first, so every layer holds its real shapes and dtypes
            length = min(context, REAL_PREFIX)
            model(input_ids=torch.randint(0, vocab, (1, length), generator=gen).to(device), cache=cache,
                  use_cache=True)
        if length < context and not _grow_cache(cache, context, gen):
            model(input_ids=torch.randint(0, vocab, (1, context - length), generator=gen).to(device), cache=cache,
                  use_cache=True)
        length = context
        if not out:
            enable_rollback(cache)  # after the first prefill, as the engine does (kv_cache.py)
            # With warm-ups, one untimed pass over every row count first: the first forwards after a prefill run
            # slow (kernel choice, allocations), and a one-row cost inflated by them would make plain decoding
            # look dear. (tune's rounds after its first call none: measure.py.)
            for n in (rows if warmup > 0 else ()):
                forward(torch.randint(0, vocab, (1, n), generator=gen).to(device), context)()
        # Interleaved rounds (every row count once per round, the lower median per row count): a slow spell of
        # another process slows one round of all row counts, not a few row counts' every repeat, so the curve's
        # shape, which the controller decides by, survives it.
        counts = later_rows if out else rows
        ids = {n: torch.randint(0, vocab, (1, n), generator=gen).to(device) for n in counts}
        times: dict[int, list[float]] = {n: [] for n in counts}
        for i in range(warmup + repeats):
            for n in counts:
                start = time.perf_counter()
                undo = forward(ids[n], context)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if i >= warmup:
                    times[n].append(time.perf_counter() - start)
                undo()
        # The lower median: of two repeats the faster, of one the one. A stall only adds time, and a draft model's
        # forwards over many rows are timed twice (decode/cost_measure.py): measured with the upper one, a
        # 25-second stall in a 256-row forward, right after another run's process exited, stood in a cached table as
        # the drafter's prefill and would have kept `auto` from drafting any long prompt.
        out[context] = {n: sorted(t)[(len(t) - 1) // 2] for n, t in times.items()}
    return out
