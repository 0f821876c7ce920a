"""Rendering chat documents into the exact text a model sees, via the tokenizer's own chat template."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from frspec.errors import FrspecError
from frspec.vocab.corpus import Message


class ChatRenderer:
    """Renders a chat either whole, or as only the text the model generates in its assistant turns.

    An assistant turn's generated text is what the template adds when that message is appended to a prompt that
    already ends with the generation header (`add_generation_prompt=True`): the content plus the end-of-turn
    token (`<|im_end|>`, `<|eot_id|>`, ...). That is exactly what a drafter has to predict. Templates that are not
    prefix-stable (e.g. ones that drop earlier reasoning) fall back to the content followed by EOS.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        if not getattr(tokenizer, "chat_template", None):
            raise FrspecError(
                f"tokenizer {tokenizer.name_or_path!r} has no chat template, so chat data cannot be rendered; "
                "pass --field to count a plain-text field instead"
            )
        self.tokenizer = tokenizer
        self.special_strings = tuple(t for t in tokenizer.all_special_tokens if t) + tuple(
            t.content for t in tokenizer.added_tokens_decoder.values()
        )
        self.failed = 0  # conversations the template refused (e.g. strict role alternation)

    def render(self, messages: list[Message], add_generation_prompt: bool = False) -> str:
        """The conversation as the tokenizer's chat template writes it (raises if the template rejects it)."""
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def full(self, messages: list[Message]) -> list[str]:
        """The whole conversation as one text (empty list if the template rejects it)."""
        try:
            return [self.render(messages)]
        except Exception:  # jinja raise_exception() for unsupported role orders: skip, counted in `failed`
            self.failed += 1
            return []

    def assistant_turns(self, messages: list[Message]) -> list[str]:
        """One text per assistant turn: what the model generates for it, end-of-turn token included."""
        texts = []
        try:
            for i, message in enumerate(messages):
                if message["role"] != "assistant":
                    continue
                prompt = self.render(messages[:i], add_generation_prompt=True) if i else ""
                whole = self.render(messages[: i + 1])
                if i and whole.startswith(prompt):
                    texts.append(self.strip_after_turn(whole[len(prompt) :]))
                else:
                    texts.append(message["content"] + (self.tokenizer.eos_token or ""))
        except Exception:
            self.failed += 1
            return []
        return [t for t in texts if t]

    def strip_after_turn(self, text: str) -> str:
        """An assistant turn's text without what the template adds after its end-of-turn token."""
        # Templates put a newline after the end-of-turn token ("<|im_end|>\n"); the model stops at the token and
        # never generates that newline, so it must not be counted.
        stripped = text.rstrip()
        if stripped != text and stripped.endswith(self.special_strings):
            return stripped
        return text
