"""Predict decoding throughput of each (token map, draft shape) from measured costs and acceptance, for `frspec tune`.

No i.i.d. acceptance model: acceptance comes from replaying decoding on the calibration set. For every position j
of the target's greedy output, `ranks[j]` is the rank of the target's token among the draft's choices there, given
the target's tokens before it (0 = the draft's top-1; OUTSIDE when it is not among the draft's top MAX_RANK over the
map's rows, e.g. outside the map). On the path the target accepts, the draft's inputs are exactly the target's
tokens, so a chain accepts the drafts at j, j+1, ... while their rank is 0, and a static tree of branching B while
their rank is below B. `replay` walks the output step by step as the engine would (a step emits the accepted drafts
and one target token) and counts decode tokens and steps: greedy decoding's acceptance on that output, exact up to
bf16 rounding.

A step's cost is the target's forward over 1 + (drafted nodes) rows, the draft's forwards (a chain of k: k
one-row forwards; a static tree DxB: the root forward, then one forward per level over its B^l nodes), each with the
LM head over the map's rows, and the engine's measured per-step overhead. Predicted throughput is decode tokens per
second: (tokens per step) / (step cost), the bench's decode_tokens_per_s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from frspec.decode.step_costs import StepCosts
from frspec.decode.tree_shape import TreeShape

# Ranks are recorded up to this (the widest static tree the tuner tries branches 3 ways); OUTSIDE = not in the top.
MAX_RANK = 4
OUTSIDE = MAX_RANK
# A row count is "cheap" while the target's forward over it costs at most this many one-row forwards; trees are only
# tried where their rows stay cheap (beyond it, the measured curve says a longer chain or no tree is better anyway).
CHEAP_FACTOR = 1.5
CHAIN_LENGTHS = (1, 2, 3, 4, 5)
TREE_SHAPES = (TreeShape.static(1, 2), TreeShape.static(1, 3), TreeShape.static(2, 2), TreeShape.static(3, 2),
               TreeShape.static(2, 3))


@dataclass(frozen=True)
class Candidate:
    """One configuration: a token map size (None: the draft's full vocabulary) and a drafted shape (None: vanilla,
    no draft at all)."""

    map_size: int | None
    shape: TreeShape | None

    @property
    def label(self) -> str:
        if self.shape is None:
            return "vanilla"
        return f"{self.shape} " + (f"map={self.map_size}" if self.map_size is not None else "no map")


@dataclass
class Measurements:
    """What `frspec tune` measured (seconds), keyed by row count and map size (None: the full vocabulary).

    target_costs[n]        one target forward over n rows after the calibration context
    draft_base_costs[n]    one draft forward without its LM head over n rows
    head_costs[m][n]       the draft's LM head (map m's rows) and choosing its top tokens, for n hidden states
    ranks[m]               per calibration prompt, the rank of each target output token (see the module docstring);
                           with ranks_by_depth, per prompt and draft depth (an MTP drafter: tune/mtp_measure.py)
    step_overhead_s        per speculative decode step: verification, cache surgery, bookkeeping (engine-measured)
    draft_forward_overhead_s  per draft forward beyond base + head (the drafter's own Python, engine-measured)
    vanilla_overhead_s     per vanilla decode step outside the target forward (engine-measured)
    """

    target_costs: dict[int, float]
    draft_base_costs: dict[int, float]
    head_costs: dict[int | None, dict[int, float]]
    ranks: dict[int | None, list[list[int]]]
    step_overhead_s: float
    draft_forward_overhead_s: float
    vanilla_overhead_s: float
    ranks_by_depth: bool = False


@dataclass(frozen=True)
class Prediction:
    candidate: Candidate
    tokens_per_step: float
    step_time_s: float
    target_time_s: float
    draft_time_s: float
    accepted_per_position: tuple[float, ...]  # P(position i accepted | step drafted it)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s


def replay(ranks: Sequence, depth: int, branching: int = 1, by_depth: bool = False
           ) -> tuple[int, int, list[int], list[int]]:
    """Greedy decoding of one output with a chain (branching 1) or static tree, replayed from its ranks.

    ranks[0] is the prefill's token, so decode steps start at 1. Returns (decode tokens, decode steps, steps that
    drafted position i, steps that accepted it). Near the end the drafted depth shrinks to the tokens left, as the
    engine's does. `by_depth`: ranks[d][j] is output j's rank when drafted at depth d + 1 (an MTP drafter, whose
    choice depends on the depth: tune/mtp_measure.py); otherwise ranks[j] serves every depth (a draft model).
    """
    if by_depth:
        n = len(ranks[0]) if ranks else 0

        def rank(a: int, j: int) -> int:
            return ranks[a][j] if a < len(ranks) else OUTSIDE
    else:
        n = len(ranks)

        def rank(a: int, j: int) -> int:
            return ranks[j]
    tokens = steps = 0
    proposed, accepted = [0] * depth, [0] * depth
    j = 1
    while j < n:
        drafted = min(depth, n - 1 - j)  # the step's own target token is the last one that fits
        a = 0
        while a < drafted and rank(a, j + a) < branching:
            a += 1
        for i in range(drafted):
            proposed[i] += 1
            accepted[i] += int(i < a)
        tokens += a + 1
        steps += 1
        j += a + 1
    return tokens, steps, proposed, accepted


def acceptance(ranks_per_prompt: Sequence[Sequence], shape: TreeShape, by_depth: bool = False
               ) -> tuple[float, tuple[float, ...]]:
    """(mean decode tokens per step, per-position acceptance) over the calibration outputs (`by_depth`: see
    `replay`)."""
    tokens = steps = 0
    proposed, accepted = [0] * shape.depth, [0] * shape.depth
    for ranks in ranks_per_prompt:
        t, s, p, a = replay(ranks, shape.depth, shape.branching, by_depth)
        tokens, steps = tokens + t, steps + s
        proposed = [x + y for x, y in zip(proposed, p)]
        accepted = [x + y for x, y in zip(accepted, a)]
    if steps == 0:
        return 1.0, tuple(0.0 for _ in proposed)
    return tokens / steps, tuple(a / p if p else 0.0 for a, p in zip(accepted, proposed))


def cheap_rows(target_costs: Mapping[int, float], factor: float = CHEAP_FACTOR) -> int:
    """The most rows (consecutively from 1) whose target forward stays within `factor` x one row's."""
    limit = factor * target_costs[1]
    n = 1
    while n + 1 in target_costs and target_costs[n + 1] <= limit:
        n += 1
    return n


def candidates(map_sizes: Sequence[int], target_costs: Mapping[int, float],
               chain_lengths: Sequence[int] = CHAIN_LENGTHS, trees: Sequence[TreeShape] = TREE_SHAPES
               ) -> list[Candidate]:
    """Vanilla, then for no map and each map: each chain length whose rows were measured, and each tree whose rows
    lie in the cheap region of the target's curve."""
    measured, cheap = max(target_costs), cheap_rows(target_costs)
    shapes = [TreeShape.chain(k) for k in chain_lengths if k + 1 <= measured]
    shapes += [t for t in trees if t.static_size() + 1 <= min(cheap, measured)]
    out = [Candidate(None, None)]
    for size in [None, *map_sizes]:
        out += [Candidate(size, s) for s in shapes]
    return out


def predict(candidate: Candidate, m: Measurements) -> Prediction:
    """Expected tokens per step and step cost of one configuration (see the module docstring)."""
    if candidate.shape is None:
        target = m.target_costs[1]
        return Prediction(candidate, 1.0, target + m.vanilla_overhead_s, target, 0.0, ())
    shape = candidate.shape
    if shape.kind == "dynamic":
        raise ValueError("dynamic trees keep nodes by off-path scores the replay does not record")
    per_step, per_position = acceptance(m.ranks[candidate.map_size], shape, m.ranks_by_depth)
    costs = step_costs(m)
    draft = costs.draft_time_s(shape, candidate.map_size)
    target = costs.target(shape.max_drafts + 1)
    return Prediction(candidate, per_step, costs.step_time_s(shape, candidate.map_size), target, draft, per_position)


def step_costs(m: Measurements) -> StepCosts:
    """The measured costs as the engine's cost model (decode/step_costs.py), which the controller decides with."""
    return StepCosts(m.target_costs, m.draft_base_costs, m.head_costs, m.step_overhead_s,
                     m.draft_forward_overhead_s, m.vanilla_overhead_s)


def rank_predictions(m: Measurements, cands: Sequence[Candidate]) -> list[Prediction]:
    """Every candidate's prediction, fastest first (ties: the smaller draft, then no map before a map)."""
    preds = [predict(c, m) for c in cands]
    return sorted(preds, key=lambda p: (-p.tokens_per_s,
                                        p.candidate.shape.max_drafts if p.candidate.shape else 0,
                                        p.candidate.map_size or 0))


def to_confirm(ranked: Sequence[Prediction], top: int) -> list[Candidate]:
    """The candidates the short bench confirms: the `top` fastest predicted, plus the fastest predicted without a
    map and vanilla (the reference every speedup and the greedy check need), without repeats."""
    chosen = [p.candidate for p in ranked if p.candidate.shape is not None][:top]
    no_map = next((p.candidate for p in ranked if p.candidate.shape is not None and p.candidate.map_size is None),
                  None)
    if no_map is not None and no_map not in chosen:
        chosen.append(no_map)
    return [Candidate(None, None), *chosen]
