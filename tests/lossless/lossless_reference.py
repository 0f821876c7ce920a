"""The reference distribution, computed independently of frspec: transformers' own logits processors.

Temperature, then top-k, then top-p, as transformers' `generate(do_sample=True)` applies them; then a float64
softmax. frspec's sampler (`logits_to_probs`) is never used for a reference.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


def reference_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """float64 probabilities [..., V] of sampling from `logits` [..., V] the way transformers does."""
    scores = logits.detach().to(torch.float64).reshape(-1, logits.shape[-1]).clone()
    dummy_ids = torch.zeros(scores.shape[0], 1, dtype=torch.long)
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(dummy_ids, scores)
    if top_k > 0:
        scores = TopKLogitsWarper(top_k)(dummy_ids, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(dummy_ids, scores)
    probs = torch.softmax(scores, dim=-1).numpy()
    return probs.reshape(*logits.shape)


def joint_two_tokens(first: np.ndarray, second_given_first: np.ndarray) -> np.ndarray:
    """P(x1, x2) = P(x1) P(x2 | x1) as a [V, V] table."""
    joint = first[:, None] * second_given_first
    return joint / joint.sum()


@torch.no_grad()
def target_joint_after_prompt(target, prompt: list[int], vocab: int, temperature: float, top_k: int,
                              top_p: float) -> np.ndarray:
    """P(x2, x3) [V, V] of the target sampling alone after `prompt`: sum over x1 of p(x1) p(x2|x1) p(x3|x1 x2), each
    from the target's own logits through transformers' processors (the end-to-end tests' reference)."""
    def probs(ids):
        return reference_probs(target(torch.tensor([ids])).logits[0, -1], temperature, top_k, top_p)

    joint = np.zeros((vocab, vocab))
    p1 = probs(prompt)
    for x1 in np.flatnonzero(p1):
        p2 = probs(prompt + [int(x1)])
        for x2 in np.flatnonzero(p2):
            joint[x2] += p1[x1] * p2[x2] * probs(prompt + [int(x1), int(x2)])
    return joint / joint.sum()
