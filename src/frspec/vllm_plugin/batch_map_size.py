"""The map size per batch step in vLLM (FRSPEC_TOKEN_MAP_SIZE=auto): the drafter's head is ranked (one copy of the
LM head in the map's frequency order, vocab/ranked_vocab.py), so its first k rows are the k-token map for every k,
and before each proposal the size is chosen by the engine's own controller (decode/controller.py) from what the
batch has shown and what this machine's steps cost.

vLLM drafts one chain of `num_speculative_tokens` for every running request with one head, so the choice is per
batch step, not per request: one ControllerState for the whole batch, with the draft length fixed (vLLM's) and
only the map size free. What it observes, from the tokens vLLM's input batch holds on the host when drafting starts
(no device synchronisation), for every request that was in the previous step too:

    the tokens it gained since then: the accepted drafts and the target's next token (so `gained - 1` drafts were
    accepted), whose ranks in the ranked head say which map sizes held them (coverage) and whether a rejected
    draft's rows held the target's token (agreement), exactly as the engine's verifier reports them.

What a step costs: the draft head over k rows for N requests, measured for every size at start-up (before serving,
`measure`); and the rest of a step (the target's forward, the drafter's body, sampling), measured live as the time
between two proposals of an unchanged batch minus the head's share, the median of the last `REST_SAMPLES`. Until
the first such measurement the head keeps the map's own size.

The size changes only between steps, before the drafter runs, so each proposal's drafted tokens and probabilities
come from one set of rows; the target verifies over its full vocabulary, so the output is unchanged for any
schedule of sizes.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, deque
from typing import Callable, Sequence

import numpy as np
import torch

from frspec.decode.controller import ControllerSettings, Plan, choose, default_map_sizes, new_request, observe
from frspec.decode.step_costs import StepCosts, interpolate
from frspec.vocab.ranked_vocab import RankedVocab

REST_SAMPLES = 16
# Batch sizes the head is timed at, at start-up (interpolated in between, extrapolated linearly beyond).
HEAD_WIDTHS = (1, 4, 16)


class BatchMapSize:
    """Chooses a ranked head's map size before each vLLM proposal (see the module docstring)."""

    def __init__(self, vocab: RankedVocab, depth: int, head_costs: dict[int, dict[int, float]],
                 clock: Callable[[], float] = time.perf_counter):
        """`head_costs[k][n]`: seconds of the head over its first k rows for n hidden states; its keys are the
        sizes chosen among (`sizes_for`)."""
        self.vocab = vocab
        self.depth = int(depth)
        self.head_costs = {int(k): dict(v) for k, v in head_costs.items()}
        self.settings = ControllerSettings(sizes=tuple(self.head_costs), depths=(self.depth,))
        prior = {k: vocab.coverage(k) for k in self.settings.sizes} if vocab.coverage_prior is not None else {}
        self.state = new_request(self.settings, prior)
        self.clock = clock
        self.seen: dict[str, int] = {}  # request id -> its tokens counted so far
        self.rest_s: deque[float] = deque(maxlen=REST_SAMPLES)  # a step's seconds beyond the draft head
        self.last: tuple[float, int, int] | None = None  # (time, size, requests) of the previous proposal
        self.chosen: Counter[int] = Counter()  # proposals per map size

    @staticmethod
    def sizes_for(vocab: RankedVocab) -> tuple[int, ...]:
        return default_map_sizes(vocab.full_size, vocab.ranked_size)

    @classmethod
    def measure(cls, vocab: RankedVocab, depth: int, like: torch.Tensor,
                widths: Sequence[int] = HEAD_WIDTHS) -> BatchMapSize:
        """Time the head at every size and width (before serving), then a chooser over those sizes."""
        from frspec.decode.cost_measure import head_costs

        before = vocab.map_size
        try:
            costs = {k: head_costs(vocab, k, widths, like) for k in cls.sizes_for(vocab)}
        finally:
            vocab.set_size(before)
        return cls(vocab, depth, costs)

    def head_s(self, k: int, requests: int) -> float:
        return interpolate(self.head_costs[k], max(int(requests), 1))

    def update(self, req_ids: Sequence[str], token_ids: np.ndarray, num_tokens: np.ndarray) -> int:
        """Observe the batch (`req_ids[i]`'s tokens are `token_ids[i, :num_tokens[i]]`), then set and return this
        step's map size."""
        now = self.clock()
        counts = {r: int(num_tokens[i]) for i, r in enumerate(req_ids)}
        drafted = self.vocab.map_size
        for i, (r, n) in enumerate(counts.items()):
            before = self.seen.get(r)
            if before is None or n <= before:
                continue  # new to the batch (its prompt is no evidence of acceptance), or nothing gained
            ranks = self.vocab.ranks(token_ids[i, before:n]).tolist()
            accepted = min(len(ranks) - 1, self.depth)
            observe(self.state, Plan(self.depth, drafted), accepted, ranks[:accepted + 1])
        if self.last is not None and set(counts) == set(self.seen):
            then, size, requests = self.last
            self.rest_s.append(max(now - then - self.depth * self.head_s(size, requests), 0.0))
        self.seen = counts
        if self.rest_s and counts:
            size = self._choose(len(counts))
            if size != self.vocab.map_size:
                self.vocab.set_size(size)
        self.chosen[self.vocab.map_size] += 1
        self.last = (self.clock(), self.vocab.map_size, len(counts))
        return self.vocab.map_size

    def _choose(self, requests: int) -> int:
        rest = statistics.median(self.rest_s)
        costs = StepCosts({self.depth + 1: rest}, {1: 0.0},
                          {k: {1: self.head_s(k, requests)} for k in self.settings.sizes},
                          full_size=self.vocab.full_size)
        self.state.step_times.clear()  # memoised per costs object: these costs are new every step
        return choose(self.state, costs).size
