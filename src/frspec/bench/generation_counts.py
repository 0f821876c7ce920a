"""Token counts of the target's own output (VocabTrim): rank the draft vocabulary by what the target generates.

A chat corpus (ShareGPT) ranks tokens by what people and other models wrote; the target's own greedy answers on
calibration prompts of the domain rank them by what this target will actually be asked to verify. Written by
`frspec vocab count-generations`, used like any counts file (`frspec vocab build`, `frspec bench --counts`).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch
from tqdm.auto import tqdm

from frspec.bench.datasets import encode_prompt
from frspec.errors import FrspecError
from frspec.vocab.counts import TokenCounts
from frspec.vocab.special_tokens import keep_token_ids
from frspec.vocab.tokenizer_identity import tokenizer_identity


def count_generations(generator: Any, tokenizer: Any, prompts: Sequence[Any], max_new_tokens: int,
                      vocab_size: int, progress: bool = True) -> TokenCounts:
    """Token counts of what `generator` (a SpeculativeGenerator; vanilla is the target alone) writes for
    `prompts` (bench `Prompt`s, chat template applied), greedy: the target's own output distribution, VocabTrim's
    observation that a drafter should rank tokens by what the target generates rather than by a chat corpus."""
    if not prompts:
        raise FrspecError("no calibration prompts to generate from")
    if max_new_tokens < 1:
        raise FrspecError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    start = time.perf_counter()
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for prompt in tqdm(prompts, desc="generating", unit="prompt", disable=not progress):
        out = generator.generate(input_ids=encode_prompt(tokenizer, prompt), max_new_tokens=max_new_tokens)
        if out.token_ids:
            counts += torch.bincount(torch.tensor(out.token_ids), minlength=vocab_size)[:vocab_size]
    if int(counts.sum()) == 0:
        raise FrspecError("the model generated no tokens for the calibration prompts")
    metadata = {
        "tokenizer": tokenizer_identity(tokenizer),
        "documents": len(prompts),
        "tokens": int(counts.sum()),
        "assistant_only": True,
        "add_special_tokens": False,
        "keep_tokens": keep_token_ids(tokenizer),
        "seconds": round(time.perf_counter() - start, 3),
        "source": f"greedy generations ({max_new_tokens} tokens max) for {len(prompts)} prompts",
        "prompt_ids": [getattr(p, "id", str(i)) for i, p in enumerate(prompts)],
    }
    return TokenCounts(counts, metadata)
