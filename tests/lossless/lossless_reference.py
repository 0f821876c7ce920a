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
