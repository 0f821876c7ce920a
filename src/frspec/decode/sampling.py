"""The one sampler: how logits become the distribution a token is drawn from.

Target and drafter go through the same function, so the draft's q and the target's p in speculative sampling are
exactly the distributions each would sample from on its own. The order (temperature, then top-k, then top-p) is the
order of transformers' logits processors, so `generate(do_sample=True, ...)` is a valid reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from frspec.errors import FrspecError


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings. temperature == 0 means greedy; top_k == 0 and top_p == 1.0 disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise FrspecError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise FrspecError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise FrspecError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits [..., V] into float32 probabilities after temperature, top-k and top-p filtering.

    Filtered-out entries get probability exactly 0. For greedy params this returns the one-hot of the argmax, so
    callers can treat greedy as a degenerate distribution where convenient.
    """
    logits = logits.float()
    if params.is_greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float32)
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=False)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop the low tail whose total mass is <= 1 - top_p, always keeping the most likely token.
        remove_sorted = cum <= (1.0 - params.top_p)
        remove_sorted[..., -1] = False
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits.softmax(-1)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator for reproducible sampling; an unseeded one draws its seed from torch's global RNG."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,), device="cpu").item()))
    return gen


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one id per row of probs [..., V] (need not be normalised). Returns a LongTensor of shape probs.shape[:-1].

    By inversion: the first id whose cumulative probability exceeds a uniform draw times the row's total. That is
    the law torch.multinomial samples (an id with probability 0 is never drawn: its cumulative sum equals the one
    before it, which the search passes first), from one uniform per row; on the CPU, over a 152k vocabulary, it
    takes 0.17 ms where torch.multinomial took 3.2 ms (2-core AMD EPYC, AVX-512), a cost paid at every sampled
    token, drafted or emitted. The sums are float64 so rounding moves no id's probability by more than about 1e-16.
    """
    flat = probs.reshape(-1, probs.shape[-1])
    cdf = flat.cumsum(-1, dtype=torch.float64)
    total = cdf[:, -1:]
    if not bool((total > 0).all()) or not bool(torch.isfinite(total).all()):
        raise ValueError("sampling needs each row's probabilities to sum to a positive finite total")
    u = torch.rand(total.shape, generator=generator, dtype=torch.float64, device=flat.device) * total
    # u < 1 can still round up to the total; just below it the search stops at the last id with mass.
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    ids = torch.searchsorted(cdf, u, right=True).squeeze(-1)
    return ids.reshape(probs.shape[:-1])
