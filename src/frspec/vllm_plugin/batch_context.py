"""Context-aware drafting in vLLM: the drafter head's rows are the token map plus the tokens of the requests
running in the batch (their prompts and the tokens generated so far), within the budget of a ContextVocab.

vLLM drafts for every running request with one head, so the rows are shared by the batch: the union of its
requests' tokens, the most frequent across the batch first while rows are free (ContextSlots' rule). They change
only between steps, at the start of the runner's `propose_draft_token_ids`, before the drafter runs: each
proposal's drafted tokens and its q (the draft probabilities the rejection sampler gets at the next step, computed
in that proposal) come from one set of rows, and the target verifies over its full vocabulary, so the output is
unchanged.

When the set of running requests changes (one joins or finishes) the request rows are rebuilt from the union of
the running requests' tokens; otherwise only the tokens the batch gained since the last step are added, while free
rows last. The tokens are those vLLM's input batch holds on the host when drafting starts (prompt, then generated
tokens), so reading them costs no device synchronisation.
"""

from __future__ import annotations

import numpy as np
import torch

from frspec.vocab.context_vocab import ContextVocab


class BatchContextRows:
    """Keeps a ContextVocab's request rows equal to the running batch's tokens (see the module docstring)."""

    def __init__(self, vocab: ContextVocab):
        self.vocab = vocab
        self.seen: dict[str, int] = {}  # request id -> how many of its tokens the rows have seen
        self.rebuilds = 0  # how many times the request rows were rebuilt (batch composition changed)

    def update(self, req_ids: list[str], token_ids: np.ndarray, num_tokens: np.ndarray) -> None:
        """`req_ids[i]`'s tokens are `token_ids[i, :num_tokens[i]]` (vLLM's InputBatch.token_ids_cpu and
        num_tokens_no_spec)."""
        counts = {r: int(num_tokens[i]) for i, r in enumerate(req_ids)}
        if set(counts) != set(self.seen):
            union = [token_ids[i, :n] for i, n in enumerate(counts.values())]
            self.vocab.begin_request(torch.from_numpy(np.concatenate(union)) if union else ())
            self.rebuilds += 1
        else:
            new = [token_ids[i, self.seen[r]:n] for i, (r, n) in enumerate(counts.items()) if n > self.seen[r]]
            if new:
                self.vocab.add_tokens(torch.from_numpy(np.concatenate(new)))
        self.seen = counts

