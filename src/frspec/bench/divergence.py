"""Greedy identity, checked once for both engines: where a speculative output first differs from its reference
vanilla row's on the same prompt, and the target's top-2 logit margin there.

frspec's engine (bench/runner.py) and vLLM (bench/vllm_runner.py) hand their outputs over as `Generation`s: vLLM's
carry the round and batch size they ran in (a method is compared with vanilla of the same round and batch size);
frspec's engine runs every prompt once, one at a time (round 0, batch size 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

from frspec.bench.methods import LLAMACPP, VANILLA, Method


@dataclass
class Generation:
    """One measured generation: which method on which prompt, what it produced, and the engine's stats (frspec's
    engine: a GenerationStats; vLLM: None, its counters are per batch)."""

    method: Method
    prompt_id: str
    prompt_tokens: int
    token_ids: list[int]
    stats: Any  # frspec.decode.stats.GenerationStats
    round: int = 0
    batch_size: int = 1


@dataclass
class Divergence:
    """Where a greedy speculative output first differs from vanilla's on the same prompt.

    top2_margin is the target's logit gap between its best and second-best token at that position, computed with
    one forward over the prompt plus the shared prefix. A small margin means a numerical near-tie (expected in
    bf16, where a 1-row and a (k+1)-row forward round differently), a large one would mean a real bug. A token
    of -1 means that output had already ended (EOS) at that position.
    """

    method: Method
    prompt_id: str
    position: int
    vanilla_token: int
    method_token: int
    top2_margin: float
    round: int = 0
    batch_size: int = 1


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where a and b differ (a length mismatch counts), or None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def top2_margin(model: torch.nn.Module, input_ids: Sequence[int]) -> float:
    """The model's logit gap between its top-1 and top-2 next token after input_ids (computed in float64)."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(input_ids)], dtype=torch.long, device=device)
    logits = model(input_ids=ids).logits[0, -1].double()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def find_divergences(generations: Iterable[Generation], prompt_tokens: dict[str, list[int]],
                     target_of: Callable[[Method], torch.nn.Module]) -> list[Divergence]:
    """Compare each greedy speculative output to its reference vanilla row's (`Method.reference`: the same,
    possibly quantized, target alone) on the same prompt, round and batch size; measure the margin with
    `target_of(method)`, called only where an output differs (vLLM's runner loads the target then). The llama.cpp
    row is not checked here (other kernels: see `reference_agreement`)."""
    generations = list(generations)
    reference = {(g.method, g.round, g.batch_size, g.prompt_id): g.token_ids for g in generations
                 if g.method.kind == VANILLA}
    found = []
    for g in generations:
        key = (g.method.reference, g.round, g.batch_size, g.prompt_id)
        if g.method.kind in (VANILLA, LLAMACPP) or key not in reference:
            continue
        ref = reference[key]
        pos = first_difference(ref, g.token_ids)
        if pos is None:
            continue
        found.append(Divergence(
            method=g.method, prompt_id=g.prompt_id, position=pos,
            vanilla_token=ref[pos] if pos < len(ref) else -1,
            method_token=g.token_ids[pos] if pos < len(g.token_ids) else -1,
            top2_margin=top2_margin(target_of(g.method), prompt_tokens[g.prompt_id] + ref[:pos]),
            round=g.round, batch_size=g.batch_size,
        ))
    return found


def reference_agreement(generations: Sequence[Generation], method: Method) -> tuple[int, int] | None:
    """(tokens before the first difference from the reference row, summed over prompts; tokens of the method):
    how long the method's greedy output follows its reference's. None without the reference row."""
    reference = {g.prompt_id: g.token_ids for g in generations if g.method == method.reference}
    if not reference:
        return None
    agree = total = 0
    for g in generations:
        if g.method == method and g.prompt_id in reference:
            pos = first_difference(reference[g.prompt_id], g.token_ids)
            agree += len(g.token_ids) if pos is None else pos
            total += len(g.token_ids)
    return agree, total
