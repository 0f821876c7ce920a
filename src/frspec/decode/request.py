"""One request, checked before any work: the prompt as token ids, the EOS ids, the stop-string tracker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from frspec.decode.sampling import SamplingParams
from frspec.decode.stopping import TextTracker, as_id_set, default_eos_ids
from frspec.errors import FrspecError


@dataclass
class Request:
    """A validated request: what to generate from, how much, and when to stop."""

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    eos_ids: set[int]
    tracker: TextTracker | None  # None without a tokenizer (no text, no stop strings)


def prepare_request(
    target: torch.nn.Module,
    tokenizer,
    vocab_size: int,
    prompt: str | None,
    input_ids: Sequence[int] | torch.Tensor | None,
    max_new_tokens: int,
    sampling: SamplingParams,
    stop_strings: Sequence[str] | str,
    eos_token_ids: Iterable[int] | None,
    apply_chat_template: bool,
) -> Request:
    """Validate a request (eagerly, also for streams) into prompt ids, EOS ids and a text tracker.

    eos_token_ids=None stops at every EOS the model and tokenizer define (`default_eos_ids`); [] never stops early.
    """
    if not isinstance(sampling, SamplingParams):
        raise FrspecError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
    ids = prompt_ids(tokenizer, vocab_size, prompt, input_ids, apply_chat_template)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise FrspecError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if isinstance(stop_strings, str):
        stop_strings = [stop_strings]
    if stop_strings and tokenizer is None:
        raise FrspecError("stop strings need a tokenizer")
    eos = default_eos_ids(target, tokenizer) if eos_token_ids is None else as_id_set(eos_token_ids)
    tracker = TextTracker(tokenizer, stop_strings) if tokenizer is not None else None
    return Request(ids, max_new_tokens, sampling, eos, tracker)


def prompt_ids(tokenizer, vocab_size: int, prompt, input_ids, apply_chat_template: bool) -> list[int]:
    """The prompt as token ids: a text prompt tokenized (as one chat user turn with `apply_chat_template`), or
    `input_ids` checked to be one sequence of in-range integer ids."""
    if (prompt is None) == (input_ids is None):
        raise FrspecError("give exactly one of prompt or input_ids")
    if prompt is not None:
        tok = tokenizer
        if tok is None:
            raise FrspecError("a text prompt needs a tokenizer (or pass input_ids)")
        if apply_chat_template:
            if not getattr(tok, "chat_template", None):
                raise FrspecError("the tokenizer has no chat template; generate from the raw prompt (--raw)")
            prompt = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            ids = tok(prompt, add_special_tokens=False)["input_ids"]
        else:
            ids = tok(prompt)["input_ids"]
    else:
        if apply_chat_template:
            raise FrspecError("apply_chat_template applies to a text prompt, not to input_ids")
        try:
            t = torch.as_tensor(input_ids)
        except (TypeError, ValueError, RuntimeError) as e:
            raise FrspecError(f"input_ids must be one sequence of integer ids: {e}") from e
        if t.numel() == 0:
            raise FrspecError("the prompt is empty")
        if t.dtype.is_floating_point or t.dtype == torch.bool or (t.dim() == 2 and t.shape[0] != 1) or t.dim() > 2:
            raise FrspecError(
                f"input_ids must be one sequence of integer ids, got {t.dtype} of shape {tuple(t.shape)}"
            )
        ids = t.reshape(-1).tolist()
    if not ids:
        raise FrspecError("the prompt is empty")
    lo, hi = min(ids), max(ids)
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise FrspecError(f"prompt token id {bad} is out of range for a vocabulary of {vocab_size}")
    return ids
