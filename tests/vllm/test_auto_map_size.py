"""The map size chosen per batch step in vLLM (FRSPEC_TOKEN_MAP_SIZE=auto), fp32 tiny models, a batch of 4: the
drafter's head is the whole LM head in the map's order and the chooser moves its size between steps; greedy outputs
equal the target's own (a draft model eager, on V1's compact path; a MiMo MTP layer compiled, on the full-row
path); every draft step drafts from the rows active then; with probabilistic drafting every distribution handed to
the rejection sampler is zero outside them."""

import os

import pytest
import torch
from tests.vllm.vllm_tiny import (MAP_IDS, PROMPTS, VOCAB, Recorder, assert_handed_as_drafted, frspec_head,
                                  greedy_outputs, hf_greedy, outside_rows, sample_seeded, start_llm, stop_llm)

NEW_TOKENS = 24
TEMPERATURE = 0.8
STEP_S = 0.1  # the chooser's clock advances this much per reading: the rest of a step is about this
HEAD_S_PER_ROW = 1e-6  # the draft head's seconds per row: 96 rows, 4 requests, 3 drafts about 1% of a step


class SizeRecorder(Recorder):
    """Also records the map size of every proposal and the target ids active at every draft step."""

    def __init__(self, llm):
        super().__init__(llm)
        self.sizes: list[int] = []
        self.active: list[set[int]] = []  # per draft step (any path)
        self.sampled_active: list[torch.Tensor] = []  # per probabilistic draft step
        chooser, head = self.drafter.frspec_map_size, frspec_head(self.drafter)
        # Its clock and head costs fixed, so its choices follow the tokens alone: with the times measured here they
        # moved with the machine's load, and one run in CI failed these tests.
        clock = iter(range(10**9))
        chooser.clock = lambda: STEP_S * next(clock)
        chooser.head_costs = {k: {1: HEAD_S_PER_ROW * k} for k in chooser.head_costs}
        chooser.rest_s.clear()
        chooser.last = None
        update = chooser.update

        def record_update(*args):
            self.sizes.append(update(*args))
            return self.sizes[-1]

        chooser.update = record_update
        logits = head.row_logits

        def record_logits(hidden):  # the full-row path: every draft step scores through here
            self.active.append(set(head.target_ids.tolist()))
            return logits(hidden)

        head.row_logits = record_logits
        sample = self.drafter._sample_draft_tokens

        def sample_draft_tokens(hidden, sampling_metadata):  # the compact path
            ids, probs = sample(hidden, sampling_metadata)
            self.active.append(set(head.target_ids.tolist()))
            if probs is not None:
                self.sampled_active.append(head.target_ids.clone())
            return ids, probs

        self.drafter._sample_draft_tokens = sample_draft_tokens


def _run(target, spec, token_map, enforce_eager=True, sample=False):
    os.environ["FRSPEC_TOKEN_MAP_SIZE"] = "auto"
    try:
        llm = start_llm(target, spec, token_map, enforce_eager=enforce_eager)
    finally:
        os.environ.pop("FRSPEC_TOKEN_MAP_SIZE")
    try:
        rec = SizeRecorder(llm)
        head = frspec_head(rec.drafter)
        run = {"start": head.target_ids.tolist(), "full": head.vocab.full_size,
               "sizes_allowed": rec.drafter.frspec_map_size.settings.sizes}
        run.update(greedy=greedy_outputs(llm, PROMPTS, NEW_TOKENS), sizes=list(rec.sizes),
                   steps=[(set(d.flatten().tolist()), a) for d, a in zip(rec.drafts, rec.active)]
                   if rec.drafts else [], active=list(rec.active))
        if sample:
            sample_seeded(llm, rec, PROMPTS[:2], TEMPERATURE)
            run.update(sampled=rec.sampled, sampled_active=rec.sampled_active,
                       rejection=rec.rejection_draft_probs)
        return run
    finally:
        stop_llm(llm)


@pytest.fixture(scope="module")
def runs(tiny):
    draft_spec = {"method": "draft_model", "model": tiny.draft, "num_speculative_tokens": 3,
                  "draft_sample_method": "probabilistic"}
    mtp_spec = {"method": "mtp", "num_speculative_tokens": 3}
    return {"reference": hf_greedy(tiny.target, PROMPTS, NEW_TOKENS),
            "mimo_reference": hf_greedy(tiny.mimo_target, PROMPTS, NEW_TOKENS),
            "draft": _run(tiny.target, draft_spec, tiny.token_map, sample=True),
            "mtp": _run(tiny.mimo_target, mtp_spec, tiny.token_map, enforce_eager=False)}


def test_greedy_outputs_equal_the_target_alone_while_the_size_moves(runs):
    assert runs["draft"]["greedy"] == runs["reference"]
    assert runs["mtp"]["greedy"] == runs["mimo_reference"]
    for name in ("draft", "mtp"):
        run = runs[name]
        assert run["start"] == MAP_IDS, "before any step: the map as it is"
        assert run["sizes_allowed"] == (12, 24, 40, VOCAB) and run["full"] == VOCAB
        assert len(set(run["sizes"])) >= 2, f"{name}: the size changed between steps ({run['sizes']})"
        assert run["sizes"][0] == len(MAP_IDS)


def test_every_draft_comes_from_the_rows_active_when_it_was_drafted(runs):
    steps = runs["draft"]["steps"]
    assert steps
    assert all(drafts <= active for drafts, active in steps)
    assert any(not active <= set(MAP_IDS) for _, active in steps), "some steps drafted beyond the map"
    assert any(not active <= set(MAP_IDS) for active in runs["mtp"]["active"])


def test_rejection_sampler_gets_distributions_zero_outside_the_active_rows(runs):
    run = runs["draft"]
    assert run["sampled"] and run["rejection"] and len(run["sampled_active"]) == len(run["sampled"])
    drafted = {}
    for (_, probs), active in zip(run["sampled"], run["sampled_active"]):
        outside = outside_rows(active)
        assert bool((probs[:, outside] == 0).all())
        drafted.update({row.numpy().tobytes(): outside for row in probs})
    assert_handed_as_drafted(run["rejection"], drafted)
