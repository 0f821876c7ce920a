"""The decoding loop: prefill, then draft -> verify -> roll back, until EOS, a stop string or max_new_tokens.

Invariant between steps: `buf[:, :length]` holds prompt and accepted tokens; the last of them ("pending") has not
been processed by the target yet, so the target cache covers `length - 1` tokens and the drafter's cache at most
that. A step drafts after the pending token, runs the target once over [pending, drafts], verifies, and truncates
both caches to the new `length - 1`. Vanilla decoding is the same loop with no drafts, so timings compare fairly.

With a token tree (`tree=`, always for EAGLE) a step drafts a tree rooted at the pending token, runs the target once
over all its nodes with a tree attention mask, verifies the tree, and keeps only the accepted path's cache entries
(spec/tree.py, spec/tree_verify.py). A drafter that reads the target's hidden states gets them from the prefill and
from each of these forwards, for the accepted positions: no extra target forward.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Generator, Iterable, Iterator, Sequence

import torch

from frspec.errors import FrspecError
from frspec.spec.cache import enable_rollback, new_cache, truncate_cache
from frspec.models.eagle import EagleHead
from frspec.models.eagle_loading import load_eagle_head
from frspec.models.loading import check_same_vocab, vocab_size_of
from frspec.spec.drafters import Draft, Drafter, DraftModelDrafter, check_token_map
from frspec.spec.eagle_drafter import EagleDrafter
from frspec.spec.sampling import SamplingParams, logits_to_probs, make_generator
from frspec.spec.stats import GenerationStats
from frspec.spec.stopping import TextTracker, as_id_set, default_eos_ids
from frspec.spec.timing import now
from frspec.spec.tree import TokenTree, TreeShape, check_tree_support, keep_cache_entries
from frspec.spec.tree_verify import verify_tree
from frspec.spec.verify import verify_greedy, verify_sampling
from frspec.vocab.token_map import TokenMap


@dataclass
class GenerationOutput:
    """Generated ids (prompt excluded; a final EOS included), their text (None without a tokenizer; special tokens
    and a matched stop string left out), stats, and why generation ended: "eos", "stop_string" or "length"."""

    token_ids: list[int]
    text: str | None
    stats: GenerationStats
    finish_reason: str = "length"


class GenerationStream:
    """Iterate to receive text pieces as tokens are accepted; afterwards `output` holds the GenerationOutput."""

    def __init__(self, run: Generator[str, None, GenerationOutput]):
        self._run = run
        self.output: GenerationOutput | None = None

    def __iter__(self) -> Iterator[str]:
        self.output = yield from self._run


@dataclass
class _Request:
    """The running state of one generation."""

    buf: torch.Tensor  # [1, capacity] token ids: prompt, accepted tokens, then the current draft
    length: int  # valid tokens in buf
    cache: object
    sampling: SamplingParams
    generator: torch.Generator | None
    stats: GenerationStats


def check_num_spec_tokens(num_spec_tokens: int) -> None:
    if isinstance(num_spec_tokens, bool) or not isinstance(num_spec_tokens, int) or num_spec_tokens < 1:
        raise FrspecError(f"num_spec_tokens must be an integer >= 1, got {num_spec_tokens!r}")


class SpeculativeGenerator:
    """Lossless generation from `target`, sped up by `drafter` (None: vanilla decoding through the same loop).

    Greedy output is token-for-token the target's greedy output; sampled output follows the target's distribution
    exactly (speculative sampling). One request at a time (batch size 1). `tree` drafts token trees instead of
    chains; a drafter that reads the target's hidden states (EAGLE) always drafts trees, a chain of
    num_spec_tokens by default.
    """

    def __init__(
        self,
        target: torch.nn.Module,
        drafter: Drafter | None = None,
        tokenizer=None,
        num_spec_tokens: int = 4,
        tree: TreeShape | None = None,
    ):
        check_num_spec_tokens(num_spec_tokens)
        self.target = target
        self.drafter = drafter
        self.tokenizer = tokenizer
        self.num_spec_tokens = num_spec_tokens
        self.vocab_size = vocab_size_of(target)
        self.device = next(target.parameters()).device
        self.dtype = next(target.parameters()).dtype
        self.hidden_layers = drafter.target_hidden_layers if drafter is not None else None
        if tree is None and self.hidden_layers is not None:
            tree = TreeShape.chain(num_spec_tokens)
        if tree is not None:
            if drafter is None:
                raise FrspecError("a token tree is drafted by a drafter: give a draft model or an EAGLE head")
            check_tree_support(target, "the target")
        self.tree = tree
        if drafter is not None:
            if drafter.vocab_size != self.vocab_size:
                raise FrspecError(
                    f"target and draft vocabularies differ: the target has {self.vocab_size} ids, "
                    f"the drafter {drafter.vocab_size}"
                )
            drafter_device = torch.device(getattr(drafter, "device", self.device))
            if drafter_device.type != self.device.type or (drafter_device.index or 0) != (self.device.index or 0):
                raise FrspecError(f"target is on {self.device} but the drafter is on {drafter_device}")

    @property
    def method(self) -> str:
        """"vanilla", "draft" or "fr-spec" (a drafter with a token map); "eagle" or "eagle+fr-spec" for EAGLE."""
        if self.drafter is None:
            return "vanilla"
        mapped = getattr(self.drafter, "token_map", None) is not None
        if isinstance(self.drafter, EagleDrafter):
            return "eagle+fr-spec" if mapped else "eagle"
        return "fr-spec" if mapped else "draft"

    def generate(
        self,
        prompt: str | None = None,
        input_ids: Sequence[int] | torch.Tensor | None = None,
        max_new_tokens: int = 128,
        sampling: SamplingParams = SamplingParams(),
        stop_strings: Sequence[str] = (),
        eos_token_ids: Iterable[int] | None = None,
        apply_chat_template: bool = False,
    ) -> GenerationOutput:
        """Generate a continuation of `prompt` (text, needs the tokenizer) or `input_ids`.

        eos_token_ids=None stops at every EOS the model and tokenizer define (see `default_eos_ids`); pass [] to
        never stop early. `apply_chat_template` wraps `prompt` as one user turn of the tokenizer's chat template.
        """
        prepared = self._prepare(
            prompt, input_ids, max_new_tokens, sampling, stop_strings, eos_token_ids, apply_chat_template
        )
        run = self._run(*prepared, max_new_tokens, sampling, stream=False)
        while True:
            try:
                next(run)
            except StopIteration as done:
                return done.value

    def stream(
        self,
        prompt: str | None = None,
        input_ids: Sequence[int] | torch.Tensor | None = None,
        max_new_tokens: int = 128,
        sampling: SamplingParams = SamplingParams(),
        stop_strings: Sequence[str] = (),
        eos_token_ids: Iterable[int] | None = None,
        apply_chat_template: bool = False,
    ) -> GenerationStream:
        """Like `generate`, but iterate the result for text pieces; its `.output` is set once iteration ends."""
        if self.tokenizer is None:
            raise FrspecError("streaming text needs a tokenizer")
        prepared = self._prepare(
            prompt, input_ids, max_new_tokens, sampling, stop_strings, eos_token_ids, apply_chat_template
        )
        return GenerationStream(self._run(*prepared, max_new_tokens, sampling, stream=True))

    # -- one request --------------------------------------------------------------------------------------------

    def _prepare(
        self, prompt, input_ids, max_new_tokens, sampling, stop_strings, eos_token_ids, apply_chat_template
    ) -> tuple[list[int], set[int], TextTracker | None]:
        """Validate a request (eagerly, also for streams): prompt ids, the EOS ids, and a text tracker."""
        if not isinstance(sampling, SamplingParams):
            raise FrspecError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        prompt_ids = self._prompt_ids(prompt, input_ids, apply_chat_template)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise FrspecError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        if isinstance(stop_strings, str):
            stop_strings = [stop_strings]
        if stop_strings and self.tokenizer is None:
            raise FrspecError("stop strings need a tokenizer")
        eos = default_eos_ids(self.target, self.tokenizer) if eos_token_ids is None else as_id_set(eos_token_ids)
        tracker = TextTracker(self.tokenizer, stop_strings) if self.tokenizer is not None else None
        return prompt_ids, eos, tracker

    def _run(
        self,
        prompt_ids: list[int],
        eos: set[int],
        tracker: TextTracker | None,
        max_new_tokens: int,
        sampling: SamplingParams,
        stream: bool,
    ) -> Generator[str, None, GenerationOutput]:
        stats = self._new_stats(len(prompt_ids))
        generated: list[int] = []
        finish = "length"
        paused = 0.0  # time the consumer of a stream spends between pieces is not generation time
        start = now(self.device)
        if max_new_tokens > 0:
            req = self._start(prompt_ids, max_new_tokens, sampling, stats)
            new = self._prefill(req)
            while True:
                for j, token in enumerate(new):
                    if token in eos:
                        new, finish = new[: j + 1], "eos"
                        break
                if tracker is not None:
                    kept = tracker.add(new)
                    if tracker.stopped:
                        new, finish = new[:kept], "stop_string"
                generated.extend(new)
                if stream:
                    piece = tracker.take_piece()
                    if piece:
                        t = now()
                        yield piece
                        paused += now() - t
                if finish != "length" or len(generated) >= max_new_tokens:
                    break
                new = self._step(req, max_new_tokens - len(generated))
            if self.drafter is not None:
                stats.draft_time_s = self.drafter.time_s
                stats.draft_lm_head_time_s = self.drafter.lm_head_time_s
                stats.draft_steps = self.drafter.steps
        stats.wall_time_s = now(self.device) - start - paused
        stats.tokens = len(generated)
        stats.decode_tokens = max(len(generated) - 1, 0)
        if stream:
            piece = tracker.take_piece(final=True)
            if piece:
                yield piece
        text = tracker.text if tracker is not None else None
        return GenerationOutput(token_ids=generated, text=text, stats=stats, finish_reason=finish)

    def _prompt_ids(self, prompt, input_ids, apply_chat_template) -> list[int]:
        if (prompt is None) == (input_ids is None):
            raise FrspecError("give exactly one of prompt or input_ids")
        if prompt is not None:
            tok = self.tokenizer
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
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            raise FrspecError(f"prompt token id {bad} is out of range for a vocabulary of {self.vocab_size}")
        return ids

    def _new_stats(self, prompt_tokens: int) -> GenerationStats:
        k = 0 if self.drafter is None else self.tree.depth if self.tree is not None else self.num_spec_tokens
        return GenerationStats(
            prompt_tokens=prompt_tokens,
            num_spec_tokens=k,
            accepted_per_position=[0] * k,
            proposed_per_position=[0] * k,
            tree=self.tree.describe() if self.tree is not None else "",
        )

    def _start(
        self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams, stats: GenerationStats
    ) -> _Request:
        buf = torch.empty((1, len(prompt_ids) + max_new_tokens + 1), dtype=torch.long, device=self.device)
        buf[0, : len(prompt_ids)] = torch.tensor(prompt_ids, dtype=torch.long)
        generator = None if sampling.is_greedy else make_generator(sampling.seed, self.device)
        if self.drafter is not None:
            self.drafter.reset()
        return _Request(buf, len(prompt_ids), new_cache(self.target), sampling, generator, stats)

    @torch.inference_mode()
    def _prefill(self, req: _Request) -> list[int]:
        start = now(self.device)
        n = req.length
        out = self.target(
            input_ids=req.buf[:, :n], cache=req.cache, use_cache=True, logits_to_keep=1,
            output_hidden_states=self.hidden_layers,
        )
        enable_rollback(req.cache)
        if self.hidden_layers is not None:
            self.drafter.observe_target(out.hidden_states)
        _, first = self._verify(out.logits[0, -1:], None, req)
        req.buf[0, n] = first
        req.length = n + 1
        if self.drafter is not None:
            self.drafter.prefill(req.buf[:, :n])
        req.stats.prefill_time_s = now(self.device) - start
        return [first]

    @torch.inference_mode()
    def _step(self, req: _Request, remaining: int) -> list[int]:
        if self.tree is not None:
            return self._tree_step(req, remaining)
        n = req.length
        # Drafts beyond the token budget could never be emitted: draft at most remaining - 1 (the target adds one).
        k = min(self.num_spec_tokens, remaining - 1) if self.drafter is not None else 0
        draft = None
        if k > 0:
            draft = self.drafter.propose(req.buf[:, :n], k, req.sampling, req.generator)
            req.buf[0, n : n + k] = draft.token_ids
        start = now(self.device)
        logits = self.target(input_ids=req.buf[:, n - 1 : n + k], cache=req.cache, use_cache=True).logits[0]
        req.stats.target_time_s += now(self.device) - start
        req.stats.target_forwards += 1
        accepted, next_token = self._verify(logits, draft, req)
        req.buf[0, n + accepted] = next_token
        new = req.buf[0, n : n + accepted + 1].tolist()
        req.length = n + accepted + 1
        truncate_cache(req.cache, req.length - 1)
        if self.drafter is not None:
            self.drafter.rollback(req.length - 1)
        if k > 0:
            req.stats.record_step(k, accepted, k)
        return new

    def _tree_step(self, req: _Request, remaining: int) -> list[int]:
        n = req.length
        past = n - 1  # the target cache holds everything but the pending token, the tree's root
        # As for chains, never draft deeper than the token budget could emit.
        depth = min(self.tree.depth, remaining - 1)
        if depth >= 1:
            shape = replace(self.tree, depth=depth)
            tree = self.drafter.propose_tree(req.buf[:, :n], shape, req.sampling, req.generator)
        else:
            tree = TokenTree.from_root(int(req.buf[0, n - 1]))
        start = now(self.device)
        out = self.target(
            input_ids=tree.tokens_tensor(self.device)[None],
            cache=req.cache,
            use_cache=True,
            attention_mask=tree.attention_mask(past, dtype=self.dtype, device=self.device),
            position_ids=tree.position_ids(past, device=self.device),
            output_hidden_states=self.hidden_layers,
        )
        req.stats.target_time_s += now(self.device) - start
        req.stats.target_forwards += 1
        verdict = verify_tree(tree, out.logits[0], req.sampling, req.generator)
        keep_cache_entries(req.cache, past, verdict.path)
        if self.hidden_layers is not None:
            self.drafter.observe_target(out.hidden_states, torch.tensor(verdict.path, device=self.device))
        new = verdict.tokens
        req.buf[0, n : n + len(new)] = torch.tensor(new, dtype=torch.long)
        req.length = n + len(new)
        self.drafter.rollback(req.length - 1)
        if depth >= 1:
            req.stats.record_step(depth, verdict.num_accepted, tree.num_drafts)
        return new

    def _verify(self, logits: torch.Tensor, draft: Draft | None, req: _Request) -> tuple[int, int]:
        if req.sampling.is_greedy:
            return verify_greedy(logits, draft)
        return verify_sampling(logits_to_probs(logits, req.sampling), draft, req.generator)


def build_generator(
    target: torch.nn.Module,
    draft: torch.nn.Module | Drafter | None = None,
    token_map: TokenMap | None = None,
    num_spec_tokens: int = 4,
    tokenizer=None,
    eagle: EagleHead | str | os.PathLike | None = None,
    tree: TreeShape | None = None,
) -> SpeculativeGenerator:
    """A generator for the usual methods: vanilla (no draft), draft model, or draft model + FR-Spec token map;
    or an EAGLE head (a loaded head, or a directory / hub id to load one from), + FR-Spec on the head with a map.

    `tree` drafts token trees (chain, static or dynamic, see TreeShape) instead of num_spec_tokens chains.
    Every check (depth, vocabularies, map size) runs before the pruned head is built.
    """
    check_num_spec_tokens(num_spec_tokens)
    drafter = None
    if eagle is not None:
        if draft is not None:
            raise FrspecError("give a draft model or an EAGLE head, not both")
        if token_map is not None:
            check_token_map(token_map, vocab_size_of(target), "the target model", tokenizer)
        head = eagle if isinstance(eagle, EagleHead) else load_eagle_head(eagle, target)
        drafter = EagleDrafter(head, int(target.config.num_hidden_layers), token_map)
    elif draft is None:
        if token_map is not None:
            raise FrspecError("a token map restricts a drafter's LM head: give a draft model too")
    elif isinstance(draft, Drafter):
        if token_map is not None:
            raise FrspecError("give the token map to the drafter itself, not to build_generator")
        drafter = draft
    else:
        vocab_size = check_same_vocab(target, draft)
        if token_map is not None:
            check_token_map(token_map, vocab_size, "the target model", tokenizer)
        drafter = DraftModelDrafter(draft, token_map)
    return SpeculativeGenerator(target, drafter, tokenizer, num_spec_tokens, tree)
