"""Verification: given the target's view of the drafted positions, decide how many drafts survive and what comes next.

Pure functions: no caches, no models. Both return `(accepted, next_token)`: the first `accepted` draft tokens are
kept and `next_token` follows them (the target's correction at the first rejection, or its bonus token when every
draft was accepted). An empty draft (vanilla decoding) returns (0, the target's own choice).
"""

from __future__ import annotations

import torch

from frspec.spec.drafters import Draft
from frspec.spec.sampling import sample


def verify_greedy(target_logits: torch.Tensor, draft: Draft | None) -> tuple[int, int]:
    """Greedy verification: accept drafts while they equal the target's argmax.

    target_logits: [n + 1, V], row i scoring the token after draft position i (row 0 follows the last accepted
    token, row n is the bonus position). The result is token-for-token the target's own greedy continuation.
    """
    choices = target_logits.argmax(-1)
    if draft is None or len(draft) == 0:
        return 0, int(choices[0])
    n = len(draft)
    matches = (choices[:n] == draft.token_ids).to(torch.int32).cumprod(0)
    accepted = int(matches.sum())
    return accepted, int(choices[accepted])


def verify_sampling(
    target_probs: torch.Tensor, draft: Draft | None, generator: torch.Generator | None
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): the output follows target_probs exactly.

    target_probs: [n + 1, V] target distributions p (already temperature/top-k/top-p filtered). Draft token x_i,
    drawn from q_i, is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection the next
    token is drawn from the residual max(p_i - q_i, 0) normalised; if all are accepted, the bonus token is drawn
    from p_n. q may live on a subset of the vocabulary (an FR-Spec map): it is zero elsewhere, so the residual keeps
    all of p's mass outside the map and tokens the drafter cannot propose are still produced at their rate.
    """
    if draft is None or len(draft) == 0:
        return 0, int(sample(target_probs[0], generator))
    assert draft.probs is not None, "sampling verification needs the draft's distributions"
    n = len(draft)
    rows = torch.arange(n, device=target_probs.device)
    p_at = target_probs[rows, draft.token_ids]
    q_at = draft.probs[rows, draft.indices].to(target_probs.dtype)
    u = torch.rand(n, generator=generator, device=target_probs.device, dtype=target_probs.dtype)
    # u < p / q, written without the division; q_at > 0 because x_i was drawn from q_i.
    accepted = int((u * q_at < p_at).to(torch.int32).cumprod(0).sum())
    if accepted == n:
        return n, int(sample(target_probs[n], generator))
    p = target_probs[accepted]
    q = draft.probs[accepted].to(p.dtype)
    residual = p.clone()
    if draft.support is None:
        residual -= q
    else:
        residual.index_add_(0, draft.support, q, alpha=-1.0)
    residual.clamp_(min=0.0)
    # A rejection where p == q everywhere has probability zero but rounding can produce it; p is then the right law.
    residual = torch.where(residual.sum() > 0, residual, p)
    return accepted, int(sample(residual, generator))
