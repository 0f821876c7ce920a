"""What one decode step costs on this machine: the cost model `frspec tune` predicts with and the per-request
controller (decode/controller.py) decides with, and the measurement of its target curve.

A speculative step of shape S at map size k costs

    target(1 + drafted nodes)                                   one target forward over the tree's rows
  + sum over the draft's forwards of width w: base(w) + head_k(w) + draft_forward_overhead
  + step_overhead                                               verification, cache surgery, bookkeeping

and a vanilla step target(1) + vanilla_overhead. Costs are measured at a few row counts, widths and map sizes and
interpolated in between (`interpolate`): a matmul over k rows costs about linearly in k.

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
    """

    target_costs: dict[int, float]
    draft_base_costs: dict[int, float]
    head_costs: dict[int | None, dict[int, float]]
    step_overhead_s: float = 0.0
    draft_forward_overhead_s: float = 0.0
    vanilla_overhead_s: float = 0.0
    full_size: int | None = None
    provenance: dict[str, Any] = field(default_factory=dict)

    def target(self, rows: int) -> float:
        return interpolate(self.target_costs, rows)

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

    def draft_time_s(self, shape: TreeShape, k: int | None) -> float:
        return sum(interpolate(self.draft_base_costs, w) + self.head(k, w) + self.draft_forward_overhead_s
                   for w in draft_forward_widths(shape))

    def step_time_s(self, shape: TreeShape | None, k: int | None = None) -> float:
        """Seconds of one decode step drafting `shape` (None: vanilla) over a k-row map (None: no map)."""
        if shape is None or shape.depth == 0:
            return self.target(1) + self.vanilla_overhead_s
        return self.target(shape.max_drafts + 1) + self.draft_time_s(shape, k) + self.step_overhead_s

    # -- files -----------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        def keyed(d: Mapping) -> dict[str, Any]:
            return {("full" if key is None else str(key)): value for key, value in d.items()}

        return {
            "target_costs": keyed(self.target_costs), "draft_base_costs": keyed(self.draft_base_costs),
            "head_costs": {("full" if k is None else str(k)): keyed(v) for k, v in self.head_costs.items()},
            "step_overhead_s": self.step_overhead_s, "draft_forward_overhead_s": self.draft_forward_overhead_s,
            "vanilla_overhead_s": self.vanilla_overhead_s, "full_size": self.full_size,
            "provenance": dict(self.provenance),
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "step costs") -> StepCosts:
        try:
            def ints(d: Mapping) -> dict[int, float]:
                out = {int(key): float(value) for key, value in d.items()}
                if not out or any(n < 1 or v < 0 for n, v in out.items()):
                    raise ValueError("empty, or a row count < 1 or a negative time")
                return out

            heads = {(None if key == "full" else int(key)): ints(v) for key, v in data["head_costs"].items()}
            if not heads:
                raise ValueError("no head costs")
            costs = cls(ints(data["target_costs"]), ints(data["draft_base_costs"]), heads,
                        float(data.get("step_overhead_s", 0.0)), float(data.get("draft_forward_overhead_s", 0.0)),
                        float(data.get("vanilla_overhead_s", 0.0)),
                        None if data.get("full_size") is None else int(data["full_size"]),
                        dict(data.get("provenance") or {}))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise FrspecError(f"{where}: not a valid cost record ({e})") from None
        if 1 not in costs.target_costs:
            raise FrspecError(f"{where}: the target's cost for one row is missing")
        return costs


@torch.inference_mode()
def measure_row_costs(model: torch.nn.Module, rows: Iterable[int] = range(1, 17), context: int = 128,
                      repeats: int = 5, warmup: int = 2) -> dict[int, float]:
    """Median seconds of one forward of `model` over n new rows after a `context`-token KV cache, for each n.

    The cache is cut back to `context` after every forward, so each one sees the same state, as a decode step
    of the engine does.
    """
    from frspec.decode.kv_cache import enable_rollback, new_cache, truncate_cache

    device = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, context), generator=gen).to(device)
    cache = new_cache(model)
    model(input_ids=prefix, cache=cache, use_cache=True)
    enable_rollback(cache)
    costs = {}
    for n in rows:
        ids = torch.randint(0, vocab, (1, n), generator=gen).to(device)
        times = []
        for i in range(warmup + repeats):
            start = time.perf_counter()
            model(input_ids=ids, cache=cache, use_cache=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= warmup:
                times.append(time.perf_counter() - start)
            truncate_cache(cache, context)
        costs[n] = sorted(times)[len(times) // 2]
    return costs
