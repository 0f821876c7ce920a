"""The tokens every map must keep, whatever their count: without them the drafter can never propose the end of a
turn, so every speculation at a turn boundary would be rejected (or, with a pruned-away EOS, generation would
depend on the target alone to stop)."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

# A tiny conversation rendered with the chat template, to find the tokens the template itself emits.
_PROBE_CONTENT = "\x00probe\x00"
_PROBE_CHAT = [
    {"role": "system", "content": _PROBE_CONTENT},
    {"role": "user", "content": _PROBE_CONTENT},
    {"role": "assistant", "content": _PROBE_CONTENT},
]


def keep_token_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """{token: id} of EOS/BOS/EOT/PAD, every special and added token, and every token of the chat template's own
    text (role headers, separators). These count toward k when a map is built."""
    keep: dict[str, int] = {}
    for token, idx in zip(tokenizer.all_special_tokens, tokenizer.all_special_ids):
        if idx is not None and idx >= 0:
            keep[str(token)] = int(idx)
    for idx, added in tokenizer.added_tokens_decoder.items():
        keep[str(added.content)] = int(idx)
    keep.update(_template_tokens(tokenizer))
    return dict(sorted(keep.items(), key=lambda kv: kv[1]))


def _template_tokens(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    if not getattr(tokenizer, "chat_template", None):
        return {}
    try:
        text = tokenizer.apply_chat_template(_PROBE_CHAT, tokenize=False, add_generation_prompt=False)
    except Exception:  # a template that rejects system messages, say: its special tokens are covered above
        return {}
    # Encode only the scaffolding between the probe contents, so no content token is mistaken for a template one.
    ids = [i for piece in text.split(_PROBE_CONTENT) for i in tokenizer.encode(piece, add_special_tokens=False)]
    return {str(tokenizer.convert_ids_to_tokens(i)): int(i) for i in ids}
