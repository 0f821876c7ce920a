"""When generation stops, and the text that is shown: EOS ids, stop strings, and incremental detokenization."""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

# End-of-turn tokens of common chat templates. A chat-tuned model ends its answer with one of these even when its
# configs name only the base model's end-of-text, so they always stop generation when the tokenizer has them.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>")


def as_id_set(value: int | Iterable[int] | None) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


def default_eos_ids(model: torch.nn.Module, tokenizer=None) -> set[int]:
    """All ids that end a generation: every EOS id of the model's generation and model configs, the tokenizer's
    EOS, and the end-of-turn tokens the tokenizer defines."""
    ids = as_id_set(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    ids |= as_id_set(getattr(model.config, "eos_token_id", None))
    if tokenizer is not None:
        ids |= as_id_set(tokenizer.eos_token_id)
        added = getattr(tokenizer, "added_tokens_encoder", {}) or {}
        ids |= {added[t] for t in END_OF_TURN_TOKENS if t in added}
    return ids


class TextTracker:
    """Decodes the generated ids as they grow, finds stop strings, and hands out text that is safe to show.

    A stop string ends generation at the token that completes it: that token is kept in the ids (as transformers
    does) but the text is cut where the stop string begins. Streamed pieces hold back a trailing partial character
    and any tail that could still become a stop string, so no piece ever has to be taken back.
    """

    def __init__(self, tokenizer, stop_strings: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stop_strings = [s for s in stop_strings if s]
        self.ids: list[int] = []
        self.stop_at: int | None = None  # character index where a found stop string begins
        self._full = ""
        self._decoded = 0  # len(ids) when _full was decoded
        self._emitted = 0  # characters of text already handed out

    def add(self, ids: Sequence[int]) -> int:
        """Append generated ids; return how many of them to keep (fewer only when a stop string completes)."""
        if not self.stop_strings:
            self.ids.extend(ids)
            return len(ids)
        longest = max(len(s) for s in self.stop_strings)
        for j, token in enumerate(ids):
            checked = len(self._decode())
            self.ids.append(token)
            text = self._decode()
            # Earlier text was already searched; a new match must end in what this token added.
            start = max(0, checked - longest)
            hits = [pos for s in self.stop_strings if (pos := text.find(s, start)) >= 0]
            if hits:
                self.stop_at = min(hits)
                return j + 1
        return len(ids)

    @property
    def stopped(self) -> bool:
        return self.stop_at is not None

    @property
    def text(self) -> str:
        """The generated text so far, cut before a stop string."""
        full = self._decode()
        return full if self.stop_at is None else full[: self.stop_at]

    def take_piece(self, final: bool = False) -> str:
        """The text not yet handed out that is safe to show now (everything, when final)."""
        text = self.text
        end = len(text)
        if not final and self.stop_at is None:
            end = len(text.rstrip("\ufffd"))  # an incomplete multi-byte character decodes as U+FFFD
            end -= self._partial_stop_length(text[:end])
        if end <= self._emitted:
            return ""
        piece = text[self._emitted : end]
        self._emitted = end
        return piece

    def _partial_stop_length(self, text: str) -> int:
        best = 0
        for s in self.stop_strings:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _decode(self) -> str:
        if self._decoded != len(self.ids):
            self._full = self.tokenizer.decode(self.ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            self._decoded = len(self.ids)
        return self._full
