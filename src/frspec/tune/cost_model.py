"""What one target forward costs against the number of rows it processes, and the draft length that curve favours.

Verifying k drafts is one target forward over k + 1 rows. On bandwidth-bound kernels that costs about one row's
forward for small k (the weights are read once either way), then jumps where the kernel becomes compute-bound:
PyTorch's int4/int8 CPU kernels stay flat up to 4 rows and double at 5. So the best draft length depends on the
measured curve, not on a constant:

    costs = measure_row_costs(target, rows=range(1, 17))        # {rows: seconds per forward}
    k = best_chain_length(costs, acceptance=0.7, draft_cost=0.1 * costs[1])

best_chain_length maximises expected tokens per second for a chain of k drafts, each accepted with probability
`acceptance` given the previous ones were (the usual i.i.d. model): a step yields (1 - a^(k+1)) / (1 - a) tokens
and costs target(k + 1) + k * draft_cost.
"""

from __future__ import annotations

from typing import Mapping

import torch

from frspec.decode.step_costs import measure_row_costs  # the engine's controller measures with it too

# Per-draft acceptance assumed when a chain length is chosen before anything is decoded: the committed bf16 quick
# bench accepted 2.82 tokens per step with 3 drafts of the 0.5B draft, (1 - a^4) / (1 - a) = 2.82 at a = 0.72.
ASSUMED_ACCEPTANCE = 0.72


def expected_tokens(k: int, acceptance: float) -> float:
    """Tokens one step emits on average with k drafts, each accepted with probability `acceptance` (i.i.d.)."""
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def chain_throughputs(costs: Mapping[int, float], acceptance: float, draft_cost: float) -> dict[int, float]:
    """Expected tokens per second for each chain length k the curve covers (k + 1 rows measured); k = 0 is
    vanilla decoding."""
    return {rows - 1: expected_tokens(rows - 1, acceptance) / (costs[rows] + (rows - 1) * draft_cost)
            for rows in sorted(costs)}


def best_chain_length(costs: Mapping[int, float], acceptance: float, draft_cost: float, max_k: int = 8) -> int:
    """The draft length k (0: do not speculate) with the highest expected throughput on this cost curve."""
    rates = {k: r for k, r in chain_throughputs(costs, acceptance, draft_cost).items() if k <= max_k}
    return max(rates, key=lambda k: (rates[k], -k))


def chain_length_from_curve(costs: Mapping[int, float], draft: torch.nn.Module,
                            acceptance: float = ASSUMED_ACCEPTANCE, max_k: int = 8, context: int = 128) -> int:
    """The draft length (at least 1) best on a measured target curve, given one measured draft forward."""
    draft_cost = measure_row_costs(draft, [1], context=context, repeats=3, warmup=1)[1]
    return max(best_chain_length(costs, acceptance, draft_cost, max_k), 1)


def auto_chain_length(target: torch.nn.Module, draft: torch.nn.Module, acceptance: float = ASSUMED_ACCEPTANCE,
                      max_k: int = 8, context: int = 128) -> int:
    """A default draft length from this machine's measured curve: the target's cost for 1..max_k+1 rows and one
    draft forward, then best_chain_length. Takes a few dozen forwards (seconds for a 1.5B int4 target on a CPU)."""
    costs = measure_row_costs(target, range(1, max_k + 2), context=context, repeats=3, warmup=1)
    return chain_length_from_curve(costs, draft, acceptance, max_k, context)
