"""The decoding loop: prefill, then decode steps until EOS, a stop string or max_new_tokens.

Everything a step does (propose, one target forward, verify, cache surgery, rollback) is in step.py; this file only
runs steps for one request at a time, cuts their tokens at EOS and stop strings, records stats, and streams text.
Vanilla decoding runs the same loop and the same step with a root-only tree, so timings compare fairly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator, Iterable, Iterator, Sequence

import torch

from frspec.decode.acceptance import chain_acceptance
from frspec.decode.answer_lengths import AnswerLengths, add_answer, expected_tokens
from frspec.decode.carried_state import CarriedStore
from frspec.decode.controller import (
    PROMPT_WINDOW, CarriedWorth, ConfidenceBins, ControllerSettings, ControllerState, Plan, carried_confidence,
    carry_worth, chain_rule, choose, count_saving, drafter_prefill_tokens, new_request, observe, observe_prompt,
    plain_tokens_first, request_kind, speculation_can_pay, step_shape, target_rows,
)
from frspec.decode.cost_calibration import RESCALE_EVERY, StepTimings, save_timings
from frspec.decode.drafter import Drafter
from frspec.decode.hybrid_target import check_hybrid_tree_support, is_hybrid
from frspec.decode.request import Request, prepare_request
from frspec.decode.sampling import SamplingParams
from frspec.decode.stats import GenerationStats
from frspec.decode.step_costs import StepCosts
from frspec.decode.step import DecodeState, StepResult, decode_step, prefill_drafter, prefill_target, start_state
from frspec.decode.timing import now
from frspec.decode.token_tree import check_tree_support
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError
from frspec.models.loading import check_context_length, vocab_size_of
from frspec.vocab.ranked_vocab import RankedVocab


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


class SpeculativeGenerator:
    """Lossless generation from `target`, sped up by `drafter` (None: vanilla decoding through the same loop).

    Greedy output is token-for-token the target's greedy output; sampled output follows the target's distribution
    exactly (speculative sampling). One request at a time (batch size 1). The drafter drafts `tree` (a TreeShape:
    chain, static or dynamic; build_generator converts `num_spec_tokens`).

    With `controller` (ControllerSettings) and the machine's `costs` (StepCosts), the draft length and the map
    size are chosen before every step (decode/controller.py): chains of any allowed length (0: a plain step), or
    the given tree or none; map sizes among the settings' on a drafter with a ranked head (vocab/ranked_vocab.py).
    With the settings' `recalibrate` (the default), the target's costs are rescaled after every request, and within
    one every RESCALE_EVERY timed forwards, from the forwards this generator timed (decode/cost_calibration.py):
    `costs` is the table the next request starts from, `measured_costs` the one given. `timings`: forwards timed
    against `costs` before (decode/cost_measure.py returns those kept beside cached costs), written back to their
    `path` after every request. `carried`: where what the requests carry to the next ones (confidence bins, worth,
    answer lengths) is kept between processes (decode/carried_state.py): loaded here, written after every request.
    """

    def __init__(
        self,
        target: torch.nn.Module,
        drafter: Drafter | None = None,
        tokenizer=None,
        tree: TreeShape | None = None,
        controller: ControllerSettings | None = None,
        costs: StepCosts | None = None,
        map_size: int | None = None,
        timings: StepTimings | None = None,
        carried: CarriedStore | None = None,
    ):
        self.target = target
        self.drafter = drafter
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size_of(target)
        self.device = next(target.parameters()).device
        self.hidden_layers = drafter.target_hidden_layers if drafter is not None else None
        if drafter is None:
            if tree is not None:
                raise FrspecError(f"a draft shape ({tree}) is drafted by a drafter: give a draft model or an EAGLE "
                                  "head")
            self.shape = None
        else:
            if drafter.vocab_size != self.vocab_size:
                raise FrspecError(
                    f"target and draft vocabularies differ: the target has {self.vocab_size} ids, "
                    f"the drafter {drafter.vocab_size}; speculative decoding needs models that share one tokenizer"
                )
            drafter_device = torch.device(drafter.device)
            if drafter_device.type != self.device.type or (drafter_device.index or 0) != (self.device.index or 0):
                raise FrspecError(f"target is on {self.device} but the drafter is on {drafter_device}")
            if controller is not None:
                if tree is not None:
                    raise FrspecError("give a tree or a controller (whose settings carry the shape), not both")
                self.shape = _check_controller(controller, costs, drafter)
            elif tree is None:
                raise FrspecError("give the shape a drafter drafts (tree=TreeShape.chain(k) for a chain of k), or "
                                  "a controller to choose it per step (build_generator does without a shape)")
            else:
                self.shape = tree
            if self.shape.kind != "chain":
                if is_hybrid(target):  # linear-attention layers read trees per node (hybrid_target.py)
                    check_hybrid_tree_support(target, "the target")
                else:
                    check_tree_support(target, "the target")
            drafter.check_shape(self.shape)
        if controller is not None and drafter is None:
            raise FrspecError("the controller chooses a drafter's draft length and map size: give a drafter")
        if map_size is not None:
            # A fixed size of a ranked head several generators share (e.g. the bench's static rows): set at the
            # start of every request, since another generator may have drafted at another size in between.
            if drafter is None or not isinstance(drafter.vocab, RankedVocab) or controller is not None:
                raise FrspecError("a fixed map size per generator needs a drafter with a ranked head and no "
                                  "controller")
            drafter.vocab.set_size(map_size)
        self.map_size = map_size
        self.controller = controller
        self.costs = costs
        self.measured_costs = costs
        self.timings = None
        if controller is not None and controller.recalibrate:
            if timings is not None and timings.reference is not costs:
                raise FrspecError("the step timings given were taken against other costs than those given")
            self.timings = timings if timings is not None else StepTimings(costs)
            self.costs = self.timings.costs()
        # The machine's costs rule out every draft at every context (a target whose forward over n rows costs n
        # one-row forwards): requests then decode plainly from the start, without prefilling or feeding the drafter
        # at all. A request whose drafter prefill drafting would not win back does the same (`_drafter_prompt`).
        self.plain_only = controller is not None and not speculation_can_pay(controller, self.costs)
        # The controller's confidence bins per sampling setting (greedy, or temperature/top-k/top-p: they change
        # what a drafted token's probability is), carried from request to request (controller.carried_confidence).
        self.confidence: dict[tuple, ConfidenceBins] = {}
        # What drafting saved against what was expected before the first step, and how the drafts were accepted, per
        # kind (sampling setting, class of prompt length, prompts of common tokens or not: `_worth_key`) and per
        # sampling setting alone (`_confidence_key`: all its kinds, whose acceptance a kind's own leans on), carried
        # from request to request into the drafter-prefill decision and the next request's prior (controller.py).
        self.worth: dict[tuple, CarriedWorth] = {}
        # How long the answers of those same kinds of request ran, for the tokens a request is expected to emit
        # (decode/answer_lengths.py), which its drafter's prefill is weighed over.
        self.lengths: dict[tuple, AnswerLengths] = {}
        self.carried_store = carried if controller is not None else None
        if self.carried_store is not None:
            self.carry_from(self.carried_store.load())

    def carried(self) -> tuple[dict, dict, dict]:
        """What this generator's requests carry to its next ones (confidence bins, worth, answer lengths), as a copy
        to go back to with `carry_from`: a benchmark that runs one prompt several times gives each run what came
        before the first, not what the prompt itself left."""
        return dict(self.confidence), dict(self.worth), dict(self.lengths)

    def carry_from(self, carried: tuple[dict, dict, dict]) -> None:
        """Go on from what `carried` held (its values are not changed in place: a request replaces its entry)."""
        self.confidence, self.worth, self.lengths = dict(carried[0]), dict(carried[1]), dict(carried[2])

    @property
    def method(self) -> str:
        """"vanilla", "draft" or "fr-spec" (a drafter with a token map); "eagle" or "eagle+fr-spec" for EAGLE;
        "mtp" or "mtp+fr-spec" for a checkpoint's MTP layers."""
        if self.drafter is None:
            return "vanilla"
        mapped = self.drafter.token_map is not None
        if self.drafter.kind in ("mtp", "eagle"):
            return f"{self.drafter.kind}+fr-spec" if mapped else self.drafter.kind
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
        request = self._prepare(prompt, input_ids, max_new_tokens, sampling, stop_strings, eos_token_ids,
                                apply_chat_template)
        run = self._run(request, stream=False)
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
        request = self._prepare(prompt, input_ids, max_new_tokens, sampling, stop_strings, eos_token_ids,
                                apply_chat_template)
        return GenerationStream(self._run(request, stream=True))

    # -- one request --------------------------------------------------------------------------------------------

    def _prepare(self, prompt, input_ids, max_new_tokens, sampling, stop_strings, eos_token_ids,
                 apply_chat_template) -> Request:
        request = prepare_request(self.target, self.tokenizer, self.vocab_size, prompt, input_ids, max_new_tokens,
                                  sampling, stop_strings, eos_token_ids, apply_chat_template)
        # Before anything is allocated: a request beyond the model's positions is an error, not garbage or an OOM.
        check_context_length(self.target, len(request.prompt_ids), request.max_new_tokens, "the target")
        if self.drafter is not None:
            self.drafter.check_request_lengths(len(request.prompt_ids), request.max_new_tokens)
        return request

    def _run(self, request: Request, stream: bool) -> Generator[str, None, GenerationOutput]:
        stats = self._new_stats(len(request.prompt_ids))
        tracker = request.tracker
        generated: list[int] = []
        finish = "length"
        paused = 0.0  # time the consumer of a stream spends between pieces is not generation time
        start = now(self.device)
        ranks = self._prompt_ranks(request.prompt_ids)
        kind = _worth_key(request.sampling, len(request.prompt_ids), ranks)
        control = self._new_control(request.sampling, ranks, kind)
        drafter_prompt = self._drafter_prompt(control, len(request.prompt_ids), request.max_new_tokens,
                                              self.lengths.get(kind))
        plain = drafter_prompt == 0
        # Tokens emitted (plainly) before a late drafter prefill; 0: the drafter prefills with the target.
        late = 0 if plain else self._plain_first(control, drafter_prompt)
        timed = StepTimings(self.measured_costs) if self.timings is not None else None  # this request's, for the costs
        costs, timed_forwards = self.costs, 0  # what this request decides by: rescaled as it times its forwards
        if request.max_new_tokens > 0:
            state = self._start(request.prompt_ids, request.max_new_tokens, request.sampling)
            new, step = [self._prefill(state, stats, 0 if late else drafter_prompt)], None
            while True:
                kept = len(new)
                eos_at = next((j for j, token in enumerate(new) if token in request.eos_ids), None)
                if eos_at is not None:
                    kept, finish = eos_at + 1, "eos"
                if tracker is not None:
                    kept_text = tracker.add(new[:kept])
                    if tracker.stopped:
                        kept, finish = kept_text, "stop_string"
                if step is not None:
                    # Drafts cut by an EOS or a stop string were accepted but never emitted: they do not count.
                    stats.record_step(step.drafted_depth, min(step.accepted, kept), step.draft_tokens,
                                      step.target_time_s)
                generated.extend(new[:kept])
                if stream:
                    piece = tracker.take_piece()
                    if piece:
                        t = now()
                        yield piece
                        paused += now() - t
                if finish != "length" or len(generated) >= request.max_new_tokens:
                    break
                remaining = request.max_new_tokens - len(generated)
                context = state.length
                if late and len(generated) >= late:
                    late, drafter_prompt = 0, self._late_prefill(state, stats, control, costs, len(generated),
                                                                 remaining, self.lengths.get(kind))
                    plain = drafter_prompt == 0
                if control is None:
                    step = self._step(state, remaining)
                elif plain or late:
                    step = self._plain_step(state, remaining)
                    stats.record_choice(0, 0)
                else:
                    step = self._controlled_step(state, remaining, control, costs, stats, timed)
                if timed is not None:  # at the row count the controller counts it under and reads costs at
                    timed.add_target(target_rows(self.controller, step.drafted_depth), context, step.target_time_s)
                    timed_forwards += 1
                    if timed_forwards % RESCALE_EVERY == 0:
                        costs = self.timings.merged(timed).costs()
                new = step.tokens
            if self.drafter is not None:
                stats.draft_time_s = self.drafter.time_s
                stats.draft_lm_head_time_s = self.drafter.lm_head_time_s
                stats.draft_steps = self.drafter.steps
        stats.wall_time_s = now(self.device) - start - paused
        self._recalibrate(timed)
        if control is not None:
            setting = _confidence_key(request.sampling)
            self.confidence[setting] = carried_confidence(control)
            whole = drafter_prompt == len(request.prompt_ids)
            self.worth[kind] = carry_worth(self.worth.get(kind), control, whole)
            self.worth[setting] = carry_worth(self.worth.get(setting), control, whole)
            window = _window_key(kind)  # aged by every request of the kind, counted from those read through one
            self.worth[window] = carry_worth(self.worth.get(window), control, 0 < drafter_prompt and not whole)
            self.lengths[kind] = add_answer(self.lengths.get(kind), len(generated), finish == "length")
            if self.carried_store is not None:
                self.carried_store.save(self.carried())
        stats.tokens = len(generated)
        stats.decode_tokens = max(len(generated) - 1, 0)
        if stream:
            piece = tracker.take_piece(final=True)
            if piece:
                yield piece
        text = tracker.text if tracker is not None else None
        return GenerationOutput(token_ids=generated, text=text, stats=stats, finish_reason=finish)

    def _recalibrate(self, timed: StepTimings | None) -> None:
        """After a request, the costs the next one starts from, rescaled by every forward timed so far
        (decode/cost_calibration.py)."""
        if timed is None or not (timed.target_ratios or timed.draft_ratios):
            return
        self.timings.merge(timed)
        self.costs = self.timings.costs()
        save_timings(self.timings)
        self.plain_only = not speculation_can_pay(self.controller, self.costs)

    def _drafter_prompt(self, control: ControllerState | None, prompt_tokens: int, max_new_tokens: int,
                        lengths: AnswerLengths | None) -> int:
        """How many prompt tokens the drafter's prefill reads: all of them (no controller); fewer, a window, where
        the drafter can read one and only that prefill is won back; 0 where the request decodes plainly from the
        start, never running the drafter: the machine's costs rule out every draft, or no prefill the drafter can
        do costs less than drafting is expected to save over the tokens the request is expected to emit (its kind's
        answer `lengths`; controller.drafter_prefill_tokens)."""
        if control is None:
            return prompt_tokens if self.drafter is not None else 0
        if self.plain_only:
            return 0
        return drafter_prefill_tokens(control, self.costs, prompt_tokens, max_new_tokens, self.drafter.prompt_windows,
                                      expected_tokens=expected_tokens(lengths, 0, max_new_tokens))

    def _plain_first(self, control: ControllerState | None, drafter_prompt: int) -> int:
        """How many tokens a request emits plainly before the drafter's prefill, where the drafter can prefill late
        (controller.plain_tokens_first); 0 where it prefills with the target."""
        if control is None or not self.drafter.late_prefill:
            return 0
        return plain_tokens_first(control, self.costs, drafter_prompt)

    @torch.inference_mode()
    def _late_prefill(self, state: DecodeState, stats: GenerationStats, control: ControllerState, costs: StepCosts,
                      emitted: int, remaining: int, lengths: AnswerLengths | None) -> int:
        """The drafter's prefill after the plain steps `_plain_first` chose, over the prompt and the tokens they
        emitted, decided again (controller.drafter_prefill_tokens) over the tokens the request is expected to emit
        after its `emitted` ones (its kind's answer `lengths`), of the `remaining` it may still emit: how many prompt
        tokens it read (a window grows by the emitted ones), 0 where the request stays plain."""
        expected = expected_tokens(lengths, emitted, emitted + remaining)
        tokens = drafter_prefill_tokens(control, costs, stats.prompt_tokens, remaining,
                                        self.drafter.prompt_windows, expected_tokens=expected)
        if tokens:
            self._prefill_drafter(state, stats, tokens)
        return tokens

    def _prefill_drafter(self, state: DecodeState, stats: GenerationStats, prompt_tokens: int) -> None:
        """The drafter's prefill over `prompt_tokens` of the prompt (fewer than all of it: a window) and the tokens
        the request emitted before it (a late prefill's plain ones; none at the target's prefill), timed apart from
        the target's: it is speculation's cost (GenerationStats.decode_tokens_per_s)."""
        emitted = state.length - 1 - stats.prompt_tokens  # all but the pending token, which the first draft reads
        start = now(self.device)
        prefill_drafter(self.drafter, state, prompt_tokens + emitted if prompt_tokens < stats.prompt_tokens else None)
        stats.draft_prefill_time_s = now(self.device) - start
        stats.draft_prompt_tokens = prompt_tokens

    def _prompt_ranks(self, prompt_ids: list[int]) -> list[int] | None:
        """The ranks of the prompt's last PROMPT_WINDOW tokens in the drafter's ranked head (None: no controller,
        or a head that is not ranked)."""
        vocab = self.drafter.vocab if self.controller is not None else None
        if not isinstance(vocab, RankedVocab):
            return None
        return vocab.rank_of[torch.as_tensor(prompt_ids[-PROMPT_WINDOW:], dtype=torch.long)].tolist()

    def _new_control(self, sampling: SamplingParams, prompt_ranks: list[int] | None, kind: tuple
                     ) -> ControllerState | None:
        if self.controller is None:
            return None
        vocab = self.drafter.vocab
        prior = {}
        if isinstance(vocab, RankedVocab) and vocab.coverage_prior is not None:
            prior = {k: vocab.coverage(k) for k in self.controller.sizes}
        state = new_request(self.controller, prior, sampling.seed,
                            None if self.timings is None else self.timings.samples(),
                            self.confidence.get(_confidence_key(sampling)),
                            worth=self.worth.get(kind), setting_worth=self.worth.get(_confidence_key(sampling)),
                            window_worth=self.worth.get(_window_key(kind)))
        # Where the prompt's tokens lie in the ranking: the first evidence of coverage. Not with context rows: they
        # are the prompt's own tokens, so the prompt says nothing of what lies beyond them.
        if prompt_ranks is not None and not vocab.extra_rows:
            observe_prompt(state, prompt_ranks)
        return state

    @torch.inference_mode()
    def _controlled_step(self, state: DecodeState, remaining: int, control: ControllerState, costs: StepCosts,
                         stats: GenerationStats, timed: StepTimings | None) -> StepResult:
        """Choose this step's length and map size by `costs`, take the step, show the controller what happened (and
        `timed` what its drafting took, at the drafter's own context: `Drafter.skipped` tokens short of the target's
        where its prefill read a window)."""
        context, behind, drafting_before = state.length, control.behind, self.drafter.time_s
        plan = choose(control, costs, remaining, context=context)
        vocab = self.drafter.vocab
        # Only a ranked head serves several map sizes; a plain DraftVocab (no map, or a static one) has one.
        if plan.depth and isinstance(vocab, RankedVocab) and vocab.map_size != plan.size:
            vocab.set_size(plan.size)  # before proposing: the proposal is drafted and verified over these rows
        shape = None if plan.depth == 0 else (self.controller.shape or TreeShape.chain(plan.drafts))
        keep = chain_rule(control, costs, plan, context) if shape is not None and shape.kind == "chain" else None
        step = decode_step(self.target, self.drafter, state, shape, self.hidden_layers, remaining, keep)
        drafting_s = self.drafter.time_s - drafting_before
        if timed is not None and step.drafted_depth:
            # Timed against the table at the context the drafter ran at. A windowed drafter's shorter cache makes its
            # forwards cheaper than the table's at the target's context; read as a fast drafter, that ratio scaled
            # down every drafting cost, the next prompt's whole prefill too (measured on long-input QA: a 0.64 scale
            # after a windowed request, and a 4,117-token prefill, 11.5 s in the table, estimated at 7.4 s; it took
            # 13.8 s).
            timed.add_draft(step_shape(self.controller, step.drafted_depth), plan.size, context - self.drafter.skipped,
                            behind, drafting_s)
        ranks = vocab.ranks(step.tokens).tolist() if isinstance(vocab, RankedVocab) else None
        expected = drawn = None
        if step.drafted_depth:
            inside = None  # an unranked head's tokens all count as inside its rows, as in `ranks` above
            if isinstance(vocab, RankedVocab) and not state.sampling.is_greedy:
                inside = vocab.ranks(torch.arange(vocab.vocab_size)) < plan.size
            expected, drawn = chain_acceptance(step.tree, step.target_logits, step.path, state.sampling, inside)
        observe(control, Plan(step.drafted_depth, plan.size, plan.probe), step.accepted, ranks, expected, drawn)
        count_saving(control, costs, step.drafted_depth, plan.size, len(step.tokens), context, behind, plan.finding_out,
                     step.target_time_s + drafting_s)
        stats.record_choice(step.drafted_depth, plan.size)
        return step

    def _new_stats(self, prompt_tokens: int) -> GenerationStats:
        k = 0 if self.shape is None else self.shape.depth
        return GenerationStats(
            prompt_tokens=prompt_tokens,
            num_spec_tokens=k,
            accepted_per_position=[0] * k,
            proposed_per_position=[0] * k,
            tree=str(self.shape) if self.shape is not None else "",
        )

    def _start(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> DecodeState:
        if self.drafter is not None:
            self.drafter.reset()
            if self.map_size is not None:
                self.drafter.vocab.set_size(self.map_size)
        return start_state(self.target, prompt_ids, max_new_tokens, sampling)

    @torch.inference_mode()
    def _prefill(self, state: DecodeState, stats: GenerationStats, drafter_prompt: int) -> int:
        """The prefill: the target's, and the drafter's over `drafter_prompt` of the prompt's tokens (0: none, a
        request that will never draft or whose drafter prefills later, `_late_prefill`; fewer than the prompt: a
        window, `_drafter_prompt`), each timed apart (`_prefill_drafter`)."""
        drafter = self.drafter if drafter_prompt else None
        start = now(self.device)
        first = prefill_target(self.target, drafter, state, self.hidden_layers if drafter else None)
        stats.prefill_time_s = now(self.device) - start
        if drafter is not None:
            self._prefill_drafter(state, stats, drafter_prompt)
        return first

    @torch.inference_mode()
    def _plain_step(self, state: DecodeState, remaining: int) -> StepResult:
        """A step of a request that never drafts: the target alone, as vanilla decoding."""
        return decode_step(self.target, None, state, None, None, remaining)

    @torch.inference_mode()
    def _step(self, state: DecodeState, remaining: int) -> StepResult:
        return decode_step(self.target, self.drafter, state, self.shape, self.hidden_layers, remaining)


def _confidence_key(sampling: SamplingParams) -> tuple:
    """The sampling settings whose requests share confidence bins."""
    return ("greedy",) if sampling.is_greedy else (sampling.temperature, sampling.top_k, sampling.top_p)


def _worth_key(sampling: SamplingParams, prompt_tokens: int, prompt_ranks: list[int] | None) -> tuple:
    """The requests that share a carried worth and acceptance: one sampling setting, one class of prompt length,
    prompts of common tokens or not (controller.request_kind)."""
    return (*_confidence_key(sampling), *request_kind(prompt_tokens, prompt_ranks))


def _window_key(kind: tuple) -> tuple:
    """The carried worth of a kind's requests whose drafter read a prompt window (controller.new_request)."""
    return (*kind, "window")


def _check_controller(settings: ControllerSettings, costs: StepCosts | None, drafter: Drafter) -> TreeShape:
    """Refuse settings the drafter cannot follow; returns the deepest shape a step may draft (for the stats)."""
    if costs is None:
        raise FrspecError("the controller decides from measured step costs: give costs (decode/step_costs.py)")
    vocab = drafter.vocab
    full = vocab.full_size if isinstance(vocab, RankedVocab) else None
    if full is None:
        if settings.sizes != (vocab.size,):
            raise FrspecError(f"this drafter scores a fixed {vocab.size} rows; map sizes {list(settings.sizes)} "
                              "need a ranked head (a token map as its ranking)")
    elif settings.sizes[-1] > full:
        raise FrspecError(f"map size {settings.sizes[-1]} exceeds the drafter's {full}-row head")
    if settings.shape is not None:
        return settings.shape
    return TreeShape.chain(max(settings.max_depth, 1))
