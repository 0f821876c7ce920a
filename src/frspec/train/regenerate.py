"""Self-distillation data: the target's own greedy replies, generated in batches, with its features kept on the way.

A head drafts well what it was trained on. Trained on ShareGPT's replies (another model's text) it learns to
predict the target's next token after text the target would not have written; trained on the target's own greedy
replies it sees exactly the sequences greedy decoding produces. Decoding one prompt at a time on a CPU is slow,
so prompts are decoded together (left-padded, finished rows dropped from the batch), and the final-normed hidden
state of every fed token, which a decode step computes anyway, is the feature the head trains on: no second
forward over the generated text.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from transformers import DynamicCache, PreTrainedModel

from frspec.vocab.corpus import Message


def first_exchange(messages: list[Message]) -> list[Message] | None:
    """The chat up to and including its first user message (with any system message before it): the prompt a
    regenerated reply answers. None when the chat opens with something else."""
    prompt: list[Message] = []
    for message in messages:
        prompt.append(message)
        if message["role"] == "user":
            return prompt
        if message["role"] != "system":
            return None
    return None


@torch.inference_mode()
def generate_with_features(
    target: PreTrainedModel,
    prompts: list[list[int]],
    max_new_tokens: int | list[int],
    stop_ids: Iterable[int],
    pad_id: int = 0,
) -> list[tuple[list[int], torch.Tensor]]:
    """Greedy replies to a batch of prompts, and the target's features for every token of prompt + reply.

    Returns per prompt (reply ids, features [len(prompt) + len(reply), H] on the CPU). A reply ends with its first
    stop id (kept) or after its `max_new_tokens`; the reply's last token is fed once more so that its own feature
    (the regression target of the head's last position) exists.
    """
    n = len(prompts)
    if n == 0:
        return []
    limits = [max_new_tokens] * n if isinstance(max_new_tokens, int) else list(max_new_tokens)
    stop = torch.tensor(sorted(set(stop_ids)), dtype=torch.long)
    device = target.get_input_embeddings().weight.device
    base, lm_head = target.base_model, target.get_output_embeddings()
    width = max(len(p) for p in prompts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding: every row's next token goes to the same column
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    out = base(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
    hidden = out.last_hidden_state
    features = [[hidden[i, width - len(p):].float().cpu()] for i, p in enumerate(prompts)]
    replies: list[list[int]] = [[] for _ in range(n)]
    rows = torch.arange(n)  # which prompt each batch row holds
    last = hidden[:, -1]
    next_pos = positions[:, -1] + 1
    while rows.numel():
        tokens = lm_head(last).argmax(-1)
        for r, t in zip(rows.tolist(), tokens.tolist()):
            replies[r].append(t)
        mask = torch.cat([mask, mask.new_ones((rows.numel(), 1))], dim=1)
        hidden = base(input_ids=tokens[:, None], attention_mask=mask, position_ids=next_pos[:, None], cache=cache,
                      use_cache=True).last_hidden_state[:, -1]
        for k, r in enumerate(rows.tolist()):
            features[r].append(hidden[k : k + 1].float().cpu())
        done = torch.isin(tokens.cpu(), stop) | torch.tensor([len(replies[r]) >= limits[r] for r in rows.tolist()])
        if done.any():
            keep = (~done).nonzero().flatten()
            rows, keep = rows[keep], keep.to(device)
            cache.batch_select_indices(keep)
            mask, hidden, next_pos = mask[keep], hidden[keep], next_pos[keep]
        last, next_pos = hidden, next_pos + 1
    return [(replies[i], torch.cat(features[i])) for i in range(n)]
