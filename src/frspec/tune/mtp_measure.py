"""What `frspec tune --mtp` measures when the drafter is the target checkpoint's own MTP layers (models/mtp.py):
the rank of each target token among the MTP head's choices at every draft depth, per token map, and the MTP
layer's forward cost against rows (its LM head is the target's, costed per map by tune/measure.head_costs).

Why ranks per depth: a draft model reads the target's tokens only, so one teacher-forced forward gives its choice
at every position whatever the depth (tune/measure.draft_ranks). An MTP layer reads the target's hidden state at
the root only; below the root it reads its own features (recursive MTP), so its choice for a token depends on how
deep in the draft that token is. On the path the target accepts the drafted tokens are the target's, so each
(root, depth) is still teacher-forced: `mtp_ranks` runs depth 1 over the whole sequence (the pairs the drafter's
cache holds after catching up), then depth d for every root at once, each root's query seeing the committed pairs
up to it and its own chain above it, as decode/eagle_drafter.py's expansion would. Replaying these ranks
(tune/predict.replay, by depth) gives the chain's and static trees' greedy acceptance exactly (up to rounding
between batched and step-by-step forwards; tests/tune/test_mtp_tune.py checks it against the engine in fp64).
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch

from frspec.decode.kv_cache import truncate_cache
from frspec.models.attention import additive_mask
from frspec.models.mtp import MtpHead
from frspec.tune.predict import MAX_RANK, OUTSIDE
from frspec.vocab.draft_vocab import DraftVocab
from frspec.vocab.token_map import TokenMap


def mtp_vocabs(head: MtpHead, token_maps: dict[int, TokenMap]) -> dict[int | None, DraftVocab]:
    """The shared LM head over the full vocabulary (None) and restricted to each map, as the MtpDrafter builds it
    (pruned copies; the target's head is untouched)."""
    vocabs: dict[int | None, DraftVocab] = {None: head.draft_vocab(None)}
    for size, token_map in sorted(token_maps.items()):
        vocabs[size] = head.draft_vocab(token_map)
    return vocabs


def _ranks(vocab: DraftVocab, head: MtpHead, features: torch.Tensor, want: torch.Tensor) -> list[int]:
    logits = vocab.logits(head.lm_head_input(features)).float()
    top = vocab.to_target(torch.topk(logits, min(MAX_RANK, logits.shape[-1]), dim=-1).indices)
    hit = top == want.unsqueeze(1)
    return torch.where(hit.any(-1), hit.int().argmax(-1), torch.full_like(want, OUTSIDE)).tolist()


@torch.inference_mode()
def mtp_ranks(target: torch.nn.Module, head: MtpHead, vocabs: dict[int | None, DraftVocab],
              sequences: Sequence[tuple[Sequence[int], Sequence[int]]], max_depth: int
              ) -> dict[int | None, list[list[list[int]]]]:
    """For each vocabulary and (prompt, output) pair: ranks[d][j], the rank of output[j] among the MTP head's top
    MAX_RANK choices when it is drafted at depth d + 1 (OUTSIDE if not among them, and for output[0], the prefill's
    token, which is never drafted)."""
    device = next(head.parameters()).device
    num_layers = int(target.config.get_text_config(decoder=True).num_hidden_layers)
    out: dict[int | None, list[list[list[int]]]] = {key: [] for key in vocabs}
    for prompt, output in sequences:
        n_out, p = len(output), len(prompt)
        table = {key: [[OUTSIDE] * n_out for _ in range(max_depth)] for key in vocabs}
        seq = torch.tensor([list(prompt) + list(output)], dtype=torch.long, device=device)
        length = seq.shape[1] - 1  # pairs t = 0 .. length-1: (x_{t+1}, h_t)
        if n_out < 2 or length < 1:
            for key in vocabs:
                out[key].append(table[key])
            continue
        hidden = target(input_ids=seq[:, :-1], output_hidden_states=head.target_layer_ids(num_layers))
        features = head.features_from_target(hidden.hidden_states)  # [1, length, H]
        cache = head.new_cache()
        positions = torch.arange(length, device=device)[None]
        feats = head(seq[:, 1:], features[:, :length], positions, cache=cache)  # depth 1 from every root t
        blocks = [length]  # cache entries per depth: the committed pairs, then each depth's roots
        for depth in range(1, max_depth + 1):
            roots = length - depth + 1  # roots t whose depth-`depth` input token x_{t+depth} exists
            if depth > 1:
                t = torch.arange(roots)
                allowed = torch.zeros(roots, sum(blocks) + roots, dtype=torch.bool)
                allowed[:, :length] = torch.arange(length)[None, :] <= t[:, None]  # committed pairs up to the root
                offset = length
                for size in blocks[1:] + [roots]:  # its own chain above the root, itself included
                    allowed[t, offset + t] = True
                    offset += size
                mask = additive_mask(allowed, dtype=feats.dtype, device=device)
                ids = seq[:, depth: depth + roots]
                feats = head(ids, feats[:, :roots], (t + depth - 1).to(device)[None], mask, cache)
                blocks.append(roots)
            # feature of root t at this depth predicts x_{t+depth+1} = output[t + depth + 1 - p]
            j = torch.arange(roots) + depth + 1 - p
            keep = (j >= 1) & (j < n_out)
            if not bool(keep.any()):
                continue
            picked = feats[0, keep.to(device)]
            want = seq[0, (torch.arange(roots)[keep] + depth + 1).to(device)]
            for key, vocab in vocabs.items():
                for jj, rank in zip(j[keep].tolist(), _ranks(vocab, head, picked, want)):
                    table[key][depth - 1][jj] = rank
        for key in vocabs:
            out[key].append(table[key])
    return out


@torch.inference_mode()
def mtp_base_costs(head: MtpHead, widths: Sequence[int], context: int, rounds: int = 5) -> dict[int, float]:
    """Median seconds of one MTP layer forward without the LM head over w rows after `context` cached pairs (the
    rows as a tree level: each sees the context and itself), in interleaved rounds over the widths."""
    device = next(head.parameters()).device
    dtype = head.embed_tokens.weight.dtype
    hidden_size = head.embed_tokens.weight.shape[1]
    gen = torch.Generator().manual_seed(0)
    vocab = head.embed_tokens.num_embeddings
    cache = head.new_cache()
    if context:
        ids = torch.randint(vocab, (1, context), generator=gen).to(device)
        hidden = torch.randn(1, context, hidden_size, generator=gen).to(device, dtype)
        head(ids, hidden, torch.arange(context, device=device)[None], cache=cache)
    samples: dict[int, list[float]] = {w: [] for w in widths}
    for r in range(rounds + 1):  # round 0 warms up
        for w in (list(widths) if r % 2 == 0 else list(reversed(widths))):
            ids = torch.randint(vocab, (1, w), generator=gen).to(device)
            hidden = torch.randn(1, w, hidden_size, generator=gen).to(device, dtype)
            allowed = torch.cat([torch.ones(w, context, dtype=torch.bool), torch.eye(w, dtype=torch.bool)], dim=1)
            mask = additive_mask(allowed, dtype=dtype, device=device)
            positions = torch.full((1, w), context, dtype=torch.long, device=device)
            start = time.perf_counter()
            feats = head(ids, hidden, positions, mask, cache)
            feats.sum().item()  # wait for the device
            if r:
                samples[w].append(time.perf_counter() - start)
            truncate_cache(cache, context)
    return {w: statistics.median(samples[w]) for w in widths}
