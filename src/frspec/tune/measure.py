"""What `frspec tune` measures on the calibration prompts: the target's greedy outputs, the rank of each output
token among the draft's choices per token map, the draft's forward and LM-head costs, and the engine's per-step
overhead (tune/predict.py turns them into predictions; the target's cost against rows is
tune/cost_model.py's measure_row_costs).

Ranks come from one teacher-forced draft forward per prompt over the prompt and the target's output: on the path
the target accepts, a drafter sees exactly those tokens, so its choices there are the teacher-forced ones (up to
bf16 rounding between one long forward and step-by-step ones).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Sequence

import torch

from frspec.tune.cost_model import measure_row_costs
from frspec.tune.predict import MAX_RANK, OUTSIDE
from frspec.decode.factory import build_generator
from frspec.decode.sampling import SamplingParams
from frspec.decode.stats import GenerationStats
from frspec.decode.tree_shape import TreeShape
from frspec.models.loading import vocab_size_of
from frspec.vocab.draft_vocab import DraftVocab
from frspec.vocab.token_map import TokenMap


def _generate(generator, prompt_ids: Sequence[int], max_new_tokens: int, device):
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    return generator.generate(input_ids=ids, max_new_tokens=max_new_tokens, sampling=SamplingParams())


def reference_outputs(target, tokenizer, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                      warmup_tokens: int = 8) -> tuple[list[list[int]], GenerationStats]:
    """The target's greedy output for each prompt (vanilla decoding, after one unmeasured warm-up) and the
    aggregated stats of those runs (their per-step overhead is vanilla's)."""
    device = next(target.parameters()).device
    generator = build_generator(target, tokenizer=tokenizer)
    _generate(generator, prompts[0], min(warmup_tokens, max_new_tokens), device)
    outs = [_generate(generator, p, max_new_tokens, device) for p in prompts]
    return [list(o.token_ids) for o in outs], GenerationStats.aggregate(o.stats for o in outs)


def draft_vocabs(draft: torch.nn.Module, token_maps: dict[int, TokenMap]) -> dict[int | None, DraftVocab]:
    """The draft's LM head over its full vocabulary (None) and restricted to each map, as its drafter builds them."""
    head = draft.get_output_embeddings()
    vocab_size = vocab_size_of(draft)
    bias = getattr(head, "bias", None)
    vocabs: dict[int | None, DraftVocab] = {None: DraftVocab.build(head.weight, bias, None, vocab_size=vocab_size)}
    for size, token_map in sorted(token_maps.items()):
        vocabs[size] = DraftVocab.build(head.weight, bias, token_map, vocab_size=vocab_size)
    return vocabs


@torch.inference_mode()
def draft_ranks(draft: torch.nn.Module, vocabs: dict[int | None, DraftVocab],
                sequences: Sequence[tuple[Sequence[int], Sequence[int]]]) -> dict[int | None, list[list[int]]]:
    """For each vocabulary and each (prompt, output) pair: the rank of every output token among the draft's top
    MAX_RANK choices over that vocabulary, given the prompt and the output before it (OUTSIDE if not among them)."""
    device = next(draft.parameters()).device
    ranks: dict[int | None, list[list[int]]] = {key: [] for key in vocabs}
    for prompt, output in sequences:
        if not output:
            for key in vocabs:
                ranks[key].append([])
            continue
        ids = torch.tensor([list(prompt) + list(output[:-1])], dtype=torch.long, device=device)
        hidden = draft.base_model(input_ids=ids).last_hidden_state[0, len(prompt) - 1:]  # predicts output[0..]
        want = torch.tensor(list(output), dtype=torch.long, device=device).unsqueeze(1)
        for key, vocab in vocabs.items():
            logits = vocab.logits(hidden).float()
            top = vocab.to_target(torch.topk(logits, min(MAX_RANK, logits.shape[-1]), dim=-1).indices)
            hit = top == want  # [n, MAX_RANK]
            rank = torch.where(hit.any(-1), hit.int().argmax(-1), torch.full_like(want[:, 0], OUTSIDE))
            ranks[key].append(rank.tolist())
    return ranks


@torch.inference_mode()
def head_costs(vocabs: dict[int | None, DraftVocab], widths: Sequence[int], repeats: int = 5, warmup: int = 2
               ) -> dict[int | None, dict[int, float]]:
    """Median seconds of each vocabulary's LM head over n hidden states and picking its top choices (argmax for
    one row, top-3 for tree levels), as the drafter does per forward."""
    out: dict[int | None, dict[int, float]] = {}
    gen = torch.Generator().manual_seed(0)
    for key, vocab in vocabs.items():
        weight = vocab.head.weight
        out[key] = {}
        for n in widths:
            hidden = torch.randn(n, weight.shape[1], generator=gen).to(weight.device, weight.dtype)
            times = []
            for i in range(warmup + repeats):
                start = time.perf_counter()
                logits = vocab.logits(hidden)
                picked = logits.argmax(-1) if n == 1 else torch.topk(logits.float(), 3, dim=-1).indices
                vocab.to_target(picked).tolist()  # the drafter reads its choices back: that syncs a GPU too
                if i >= warmup:
                    times.append(time.perf_counter() - start)
            out[key][n] = statistics.median(times)
    return out


def interleaved_row_costs(model: torch.nn.Module, rows: Sequence[int], context: int, rounds: int = 3
                          ) -> dict[int, float]:
    """row_costs' measurement in `rounds` passes over all row counts (alternating direction), the median per row
    count: a slow spell of a shared machine then spoils one sample of many row counts, not every sample of a few."""
    samples: dict[int, list[float]] = {n: [] for n in rows}
    for r in range(rounds):
        order = list(rows) if r % 2 == 0 else list(reversed(rows))
        for n, cost in measure_row_costs(model, order, context=context, repeats=1, warmup=1 if r == 0 else 0).items():
            samples[n].append(cost)
    return {n: statistics.median(samples[n]) for n in rows}


def draft_base_costs(draft: torch.nn.Module, widths: Sequence[int], context: int) -> dict[int, float]:
    """Median seconds of the draft's forward without its LM head over n rows."""
    return interleaved_row_costs(draft.base_model, widths, context, rounds=5)


def engine_spec_run(target, draft, tokenizer, prompt: Sequence[int], shape: TreeShape, max_new_tokens: int,
                    eagle=None) -> GenerationStats:
    """One short speculative generation drafting `shape` with the draft (or `eagle`, a head such as the target's MTP
    layers) over its full vocabulary (after a warm-up), whose stats give the engine's per-step and per-draft-forward
    overheads."""
    device = next(target.parameters()).device
    generator = build_generator(target, draft, None, tokenizer=tokenizer, tree=shape, eagle=eagle)
    _generate(generator, prompt, 8, device)
    return _generate(generator, prompt, max_new_tokens, device).stats


def overheads(spec: GenerationStats, vanilla: GenerationStats, target_costs: dict[int, float], spec_rows: int,
              base_1row: float, full_head_1row: float) -> dict[str, float]:
    """Per-step overheads from engine runs, relative to the isolated cost measurements (so anything the engine
    adds around a forward, its timing included, is counted once): a speculative step's decode time beyond its
    drafting and a `spec_rows`-row target forward; a draft forward's time beyond a one-row base forward and the
    full-vocabulary head (its catch-up rows and the drafter's Python); a vanilla step's decode time beyond a one-row
    target forward. Never negative."""

    def per_step(stats: GenerationStats, beyond: float) -> float:
        decode = stats.overhead_time_s + stats.target_time_s  # decode time beyond drafting and its prefill
        return max(decode / max(stats.target_forwards, 1) - beyond, 0.0)

    per_draft = spec.draft_time_s / spec.draft_steps if spec.draft_steps else 0.0
    return {
        "step_overhead_s": per_step(spec, target_costs[spec_rows]),
        "draft_forward_overhead_s": max(per_draft - base_1row - full_head_1row, 0.0),
        "vanilla_overhead_s": per_step(vanilla, target_costs[1]),
    }


def calibration_context(prompts: Sequence[Sequence[int]], max_new_tokens: int) -> int:
    """The KV-cache length cost curves are measured at: a median prompt halfway through its answer."""
    return int(statistics.median(len(p) for p in prompts)) + max_new_tokens // 2


def describe_ranks(ranks: dict[int | None, list[list[int]]]) -> dict[str, Any]:
    """Top-1 and top-MAX_RANK hit rates per vocabulary, for the report."""
    out = {}
    for key, per_prompt in ranks.items():
        flat = [r for rs in per_prompt for r in rs[1:]]  # the prefill's token is not drafted
        n = max(len(flat), 1)
        out["full" if key is None else str(key)] = {
            "positions": len(flat),
            "top1": sum(r == 0 for r in flat) / n,
            f"top{MAX_RANK}": sum(r < OUTSIDE for r in flat) / n,
        }
    return out
