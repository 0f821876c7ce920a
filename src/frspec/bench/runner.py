"""Run every method on every prompt in one process, interleaved, and check greedy outputs against vanilla.

Fairness rules, so that differences in the table come from the methods and not from the machine:
  - target, draft and EAGLE head are loaded once and shared by all methods;
  - every method gets the same prompts (token ids) and the same max_new_tokens;
  - each method has one short warm-up generation first (on the end of the first prompt), which is not measured;
  - methods are interleaved per prompt (prompt 1: all methods, prompt 2: all methods, ...), and the starting
    method rotates from prompt to prompt, so a slow spell of the machine is spread over all methods;
  - with `repeats` R > 1, each prompt runs R rounds of all methods (the starting method rotating from round to
    round too) and each method keeps its run of median decode time on that prompt: a VM's timings drift 10-20%
    within minutes (two runs of one prompt making the same choices measured 4.4 and 5.4 tokens/s), and one slow
    spell then moves a method's median, not its total. Every round of a prompt starts from what the controller
    carried from the prompts before it, not from what the prompt's own earlier rounds left; and a run's first prompt
    starts from nothing learnt (not from what `frspec generate` calls or an earlier run on the same prompts kept,
    decode/carried_state.py), as a new user's first request does;
  - quantized rows (int4/int8 copies of the target and draft) and the llama.cpp peer row are interleaved with the
    others in the same loop, so every row sees the same prompts and the same machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

import torch
from tqdm.auto import tqdm

from frspec.bench.divergence import Divergence, Generation, find_divergences
from frspec.bench.methods import LLAMACPP, VANILLA, Method
from frspec.models.eagle import EagleHead
from frspec.decode.sampling import SamplingParams
from frspec.vocab.token_map import TokenMap


WARMUP_PROMPT_TOKENS = 256  # prompt tokens a warm-up generation reads (the first prompt's last ones)


@dataclass
class BenchResult:
    methods: list[Method]
    prompt_ids: list[str]
    generations: list[Generation]
    divergences: list[Divergence]
    greedy: bool
    max_new_tokens: int
    run_time_s: float = 0.0
    warmup_time_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    # Per auto row, the step costs its controller chose by (StepCosts.to_dict(): cached or measured for this run),
    # with how the engine had rescaled them by the run's end (`_costs_record`): what a reader needs to tell a
    # choice from the table it rested on.
    controller_costs: dict[str, dict] = field(default_factory=dict)

    def generations_of(self, method: Method) -> list[Generation]:
        return [g for g in self.generations if g.method == method]


def margin_targets(target: torch.nn.Module, quantized: Mapping[str, tuple[Any, Any]] = {}):
    """For `find_divergences`: the target a method's divergences are measured on (its quantized copy if any)."""
    return lambda method: _models_of(method, target, None, quantized)[0]


def _models_of(m: Method, target, draft, quantized: Mapping[str, tuple[Any, Any]]):
    """(target, draft) a method runs on: the loaded pair, or its quantized copies."""
    if m.quant is None:
        return target, draft
    if m.quant not in quantized:
        raise ValueError(f"method {m.label} needs the {m.quant} target and draft")
    return quantized[m.quant]


class _PeerGenerator:
    """The llama.cpp row behind the engine's generate() interface (greedy only)."""

    def __init__(self, peer, eos_ids: set[int]):
        self.peer, self.eos_ids = peer, eos_ids

    def generate(self, input_ids, max_new_tokens, sampling, eos_token_ids=None):
        if not sampling.is_greedy:
            raise ValueError("the llama.cpp row decodes greedily only")
        eos_ids = self.eos_ids if eos_token_ids is None else set(eos_token_ids)
        tokens, stats = self.peer.generate(input_ids[0].tolist(), max_new_tokens, eos_ids)
        return SimpleNamespace(token_ids=tokens, stats=stats)


def _build_generators(methods, target, draft, eagle, tokenizer, token_maps: dict[int, TokenMap],
                      draft_head_quant: str | None = None, quantized: Mapping[str, tuple[Any, Any]] = {},
                      llamacpp=None, quant_draft_heads: Mapping[str, str | None] = {}):
    """One generator per method. Methods with the same drafter and map share one drafter (and so one pruned
    LM-head copy): they run one after another, and a drafter resets its state for every request. A quantized
    row's drafter head (full or pruned) is quantized like its draft, or as quant_draft_heads[quant] says."""
    from frspec.decode.factory import build_drafter, build_generator
    from frspec.decode.stopping import default_eos_ids

    drafters = {}  # (uses EAGLE, map size, context rows, context budget, quant) -> drafter
    generators = {}
    for m in methods:
        if m.kind == LLAMACPP:
            if llamacpp is None:
                raise ValueError(f"method {m.label} needs a llama.cpp model")
            generators[m] = _PeerGenerator(llamacpp, default_eos_ids(target, tokenizer))
            continue
        m_target, m_draft = _models_of(m, target, draft, quantized)
        if m.kind == VANILLA:
            generators[m] = build_generator(m_target, tokenizer=tokenizer)
            continue
        if m.uses_eagle and eagle is None:
            raise ValueError(f"method {m.label} needs an EAGLE head")
        if not m.uses_eagle and m_draft is None:
            raise ValueError(f"method {m.label} needs a draft model")
        # The drafter head's weight format: a quantized row's follows its draft (or quant_draft_heads), a float
        # row's --draft-quant.
        head_quant = quant_draft_heads.get(m.quant, m.quant) if m.quant is not None else draft_head_quant
        ranked = _ranked_drafter(m, methods, token_maps)
        if ranked is not None:
            # Auto rows, and static rows whose map holds the first ids of the auto row's ranking: one
            # frequency-ranked head (vocab/ranked_vocab.py) serves them all, each static row at its size (set per
            # request), the auto row choosing per step. A quantized head is packed once, whole, and every size is
            # its first rows (models/quant.py `first_rows`): the same packed rows a static map's own head has.
            ranked_key = ("ranked", m.uses_eagle, ranked.token_map_size, m.quant)
            if ranked_key not in drafters:
                drafters[ranked_key] = build_drafter(
                    m_target, draft=None if m.uses_eagle else m_draft, eagle=eagle if m.uses_eagle else None,
                    token_map=token_maps[ranked.token_map_size], tokenizer=tokenizer, token_map_size="auto",
                    head_quant=None if m.uses_eagle else head_quant)
            drafter = drafters[ranked_key]
            if m.auto:
                # tree None (a draft model's auto row): the controller chooses the length too.
                # A run starts from nothing learnt: not from what an earlier run learnt on the same prompts.
                generators[m] = build_generator(m_target, draft=drafter, token_map_size="auto", tokenizer=tokenizer,
                                                tree=m.tree, carry_between_processes=False)
            else:
                size = m.token_map_size if m.token_map_size is not None else drafter.vocab.full_size
                generators[m] = build_generator(m_target, draft=drafter, tokenizer=tokenizer, tree=m.tree,
                                                token_map_size=size, carry_between_processes=False)
            continue
        key = (m.uses_eagle, m.token_map_size, m.context_rows, m.context_budget, m.quant)
        if key not in drafters:
            token_map = token_maps[m.token_map_size] if m.token_map_size is not None else None
            # build_drafter runs the vocabulary and tokenizer checks before the DraftVocab copies any rows.
            drafters[key] = build_drafter(
                m_target, draft=None if m.uses_eagle else m_draft, eagle=eagle if m.uses_eagle else None,
                token_map=token_map, tokenizer=tokenizer,
                context_rows=m.context_rows or 0, context_budget=m.context_budget or "fixed",
                head_quant=head_quant,
            )
        generators[m] = build_generator(m_target, draft=drafters[key], tokenizer=tokenizer, tree=m.tree,
                                        carry_between_processes=False)
    return generators


def _ranked_drafter(m: Method, methods, token_maps: dict[int, TokenMap]) -> Method | None:
    """The auto row whose ranked head serves `m` (itself if it is one), or None: a row of the same drafter and
    models (quantized alike, so its head's weight format is the same too) without context rows, whose map (if
    any) is a prefix of that auto row's ranking."""
    if m.auto:
        return m
    if m.context_rows is not None:
        return None
    auto = next((a for a in methods if a.auto and a.uses_eagle == m.uses_eagle and a.quant == m.quant), None)
    if auto is None:
        return None
    if m.auto or m.token_map_size is None:
        return auto
    ranking, static = token_maps[auto.token_map_size], token_maps.get(m.token_map_size)
    if static is None or static.k > ranking.k:
        return None
    ranked = _ranked_ids(ranking)[: static.k]
    if not bool(torch.isin(static.ids, ranked).all()):  # the same ids (a map's own order does not matter)
        return None
    return auto


def _ranked_ids(ranking: TokenMap) -> torch.Tensor:
    """The ranked head's first ids for this ranking: its kept tokens first, then the rest (vocab/ranked_vocab.py)."""
    kept = torch.as_tensor(sorted({int(i) for i in (ranking.metadata.get("kept_tokens") or {}).values()}),
                           dtype=torch.long)
    is_kept = torch.isin(ranking.ids, kept)
    return torch.cat([ranking.ids[is_kept], ranking.ids[~is_kept]])


def _generate(generator, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams, device,
              eos_ids: list[int] | None = None):
    input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    return generator.generate(input_ids=input_ids, max_new_tokens=max_new_tokens, sampling=sampling,
                              eos_token_ids=eos_ids)


def run_benchmark(
    target: torch.nn.Module,
    draft: torch.nn.Module | None,
    tokenizer: Any,
    prompts: Sequence[tuple[str, list[int]]],
    methods: Sequence[Method],
    token_maps: dict[int, TokenMap],
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    warmup_tokens: int = 8,
    progress: bool = True,
    eagle: EagleHead | None = None,
    draft_head_quant: str | None = None,
    quantized: Mapping[str, tuple[torch.nn.Module, torch.nn.Module | None]] = {},
    llamacpp: Any = None,
    quant_draft_heads: Mapping[str, str | None] = {},
    repeats: int = 1,
    ignore_eos: bool = False,
) -> BenchResult:
    """Run `methods` on `prompts` (pairs of prompt id and chat-formatted token ids) and collect the results.

    `draft` serves the draft and fr-spec methods, `eagle` (a head loaded for `target`) the eagle ones;
    `quantized[q]` is the (target, draft) pair of the methods with quant q (the draft loaded with a float head),
    `llamacpp` the peer model of the llama.cpp row (bench/llamacpp.py's LlamaCppGreedy, greedy only);
    `quant_draft_heads[q]` the quantization of the q rows' drafter heads when not q itself (None: kept float).

    `repeats`: rounds of all methods per prompt; each method's run of median decode time (wall time minus prefill;
    the lower middle one for an even count) is kept, and a method whose rounds emitted different tokens (which a
    seeded or greedy run should not, except a sampled `auto` row: its costs are rescaled from its timed forwards, so its
    drafts, and with them its seeded draws, may differ) is named in `notes`.

    With sampling, each prompt gets its own seed (sampling.seed + prompt index), the same for every method. With
    greedy decoding, every speculative output is compared to vanilla's and each difference is recorded with the
    target's top-2 logit margin there (bench/divergence.py); nothing is hidden or retried. With `ignore_eos` every
    answer runs to `max_new_tokens`: no EOS ends it (the llama.cpp row's neither).
    """
    methods = list(methods)
    if not prompts:
        raise ValueError("no prompts to benchmark")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    if len({pid for pid, _ in prompts}) != len(prompts):
        raise ValueError("prompt ids must be unique: results are matched across methods by prompt id")
    device = next(target.parameters()).device
    generators = _build_generators(methods, target, draft, eagle, tokenizer, token_maps, draft_head_quant,
                                   quantized, llamacpp, quant_draft_heads)
    eos_ids = [] if ignore_eos else None  # None: each generator's own EOS ids

    # The bar counts token budgets (warm-ups included), so its ETA weighs a long generation more than a short one.
    warmup_tokens = min(warmup_tokens, max_new_tokens)
    total = len(methods) * (warmup_tokens + repeats * len(prompts) * max_new_tokens)
    bar = tqdm(total=total, desc="bench", unit="tok", disable=not progress, dynamic_ncols=True)
    result = BenchResult(
        methods=methods, prompt_ids=[p for p, _ in prompts], generations=[], divergences=[],
        greedy=sampling.is_greedy, max_new_tokens=max_new_tokens,
    )
    try:
        start = time.perf_counter()
        # The warm-up decodes the end of the first prompt (its last WARMUP_PROMPT_TOKENS, which end with the
        # assistant header): it warms the kernels and caches as well as the whole prompt would, without each
        # method paying a long-input prefill that nothing measures.
        warm_prompt = prompts[0][1][-WARMUP_PROMPT_TOKENS:]
        for m in methods:
            bar.set_postfix_str(f"warm-up {m.label}")
            _generate(generators[m], warm_prompt, warmup_tokens, sampling, device)
            bar.update(warmup_tokens)
        result.warmup_time_s = time.perf_counter() - start

        start = time.perf_counter()
        for i, (prompt_id, prompt_ids) in enumerate(prompts):
            params = sampling if sampling.seed is None else SamplingParams(
                sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed + i
            )
            runs: dict[Method, list] = {}  # in the first round's order
            # What a controller carries from request to request (engine.SpeculativeGenerator.carried), as the
            # prompts before this one left it: every round starts from it, so a later round does not start from what
            # this prompt's own earlier round taught it (a workload does not repeat its prompts).
            carried = {m: generators[m].carried() for m in methods if hasattr(generators[m], "carried")}
            for r in range(repeats):
                start_at = (i + r) % len(methods)
                for m in methods[start_at:] + methods[:start_at]:
                    bar.set_postfix_str(f"{prompt_id} {m.label}" + (f" round {r + 1}" if repeats > 1 else ""))
                    if m in carried:
                        generators[m].carry_from(carried[m])
                    runs.setdefault(m, []).append(_generate(generators[m], prompt_ids, max_new_tokens, params, device,
                                                            eos_ids))
                    bar.update(max_new_tokens)
            for m, outs in runs.items():
                if len({tuple(o.token_ids) for o in outs}) > 1:
                    why = ""
                    if getattr(generators[m], "timings", None) is not None and not sampling.is_greedy:
                        # Its costs were rescaled between rounds (decode/cost_calibration.py): another draft
                        # schedule consumes the seeded draws differently; the distribution sampled is the same.
                        why = " (its step costs were rescaled between them, so its drafts drew other samples)"
                    result.notes.append(f"{m.label} on {prompt_id}: its {repeats} rounds emitted different tokens"
                                        + why)
                # The lower median: of two rounds the faster, since on an idle machine a stall only adds time (the
                # upper one kept each row's slower round, and the rows with more varied steps lost more by it).
                kept = sorted(outs, key=lambda o: o.stats.wall_time_s - o.stats.prefill_time_s)[(len(outs) - 1) // 2]
                result.generations.append(
                    Generation(m, prompt_id, len(prompt_ids), list(kept.token_ids), kept.stats)
                )
        result.run_time_s = time.perf_counter() - start
    finally:
        bar.close()
    result.controller_costs = {m.label: _costs_record(generators[m]) for m in methods
                               if getattr(generators[m], "controller", None) is not None}

    if result.greedy:
        result.divergences = find_divergences(result.generations, dict(prompts), margin_targets(target, quantized))
    return result


def _costs_record(generator) -> dict:
    """The step costs as measured (or cached), with the provenance of the table the generator ended the run with:
    how it recalibrated them from its timed forwards (decode/cost_calibration.py)."""
    record = generator.measured_costs.to_dict()
    record["provenance"] = dict(generator.costs.provenance)
    return record
