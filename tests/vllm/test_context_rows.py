"""Context-aware drafting in vLLM (FRSPEC_CONTEXT_ROWS), fp32 tiny models, a batch of 4: the drafter's rows are the
map plus the batch's own tokens and change between steps; greedy outputs equal the target's own (draft model with
a fixed budget, EAGLE-3 with an additive one); with probabilistic drafting every distribution handed to the
rejection sampler is zero outside the rows that were active when it was drafted."""

import os

import pytest
import torch
from tests.vllm.vllm_tiny import (MAP_IDS, Recorder, assert_handed_as_drafted, frspec_head, greedy_outputs,
                                  hf_greedy, outside_rows, sample_seeded, start_llm, stop_llm)

NEW_TOKENS = 20
TEMPERATURE = 0.8
EXTRA_ROWS = 12
# Prompts with ids outside the 40-id map (4..43), so the batch's rows differ from the map's.
PROMPTS = [[50, 51, 52, 50, 5, 6], [60, 61, 10, 11, 60], [70, 20, 71], [80, 81, 82, 83, 30, 31, 84]]


class ContextRecorder(Recorder):
    """Also records, with every draft step, the target ids of the rows active while it was drafted."""

    def __init__(self, llm):
        super().__init__(llm)
        self.active: list[torch.Tensor] = []  # per probabilistic draft step
        self.all_active: set[int] = set()
        head, sample = frspec_head(self.drafter), self.drafter._sample_draft_tokens

        def sample_draft_tokens(hidden, sampling_metadata):
            ids, probs = sample(hidden, sampling_metadata)
            self.all_active |= set(head.target_ids.tolist())
            if probs is not None:
                self.active.append(head.target_ids.clone())
            return ids, probs

        self.drafter._sample_draft_tokens = sample_draft_tokens


def _run(tiny, target, spec, budget, sample):
    os.environ["FRSPEC_CONTEXT_ROWS"] = str(EXTRA_ROWS)
    os.environ["FRSPEC_CONTEXT_BUDGET"] = budget
    try:
        llm = start_llm(target, spec, tiny.token_map)
    finally:
        os.environ.pop("FRSPEC_CONTEXT_ROWS")
        os.environ.pop("FRSPEC_CONTEXT_BUDGET")
    try:
        rec = ContextRecorder(llm)
        head, rows = frspec_head(rec.drafter), rec.drafter.frspec_context
        run = {"head_rows_before": head.target_ids.tolist()}
        run.update(greedy=greedy_outputs(llm, PROMPTS, NEW_TOKENS), rebuilds=rows.rebuilds,
                   drafts=torch.cat([d.flatten() for d in rec.drafts]), greedy_active=set(rec.all_active))
        if sample:
            sample_seeded(llm, rec, PROMPTS[:2], TEMPERATURE)
            run.update(sampled=rec.sampled, active=rec.active, rejection=rec.rejection_draft_probs,
                       lm_head=rec.drafter.model.lm_head.weight.detach().clone())
        return run
    finally:
        stop_llm(llm)


@pytest.fixture(scope="module")
def runs(tiny):
    draft_spec = {"method": "draft_model", "model": tiny.draft, "num_speculative_tokens": 3,
                  "draft_sample_method": "probabilistic"}
    eagle3_spec = {"method": "eagle3", "model": tiny.eagle3_head, "num_speculative_tokens": 3}
    return {"reference": hf_greedy(tiny.target, PROMPTS, NEW_TOKENS),
            "eagle_reference": hf_greedy(tiny.eagle_target, PROMPTS, NEW_TOKENS),
            "draft": _run(tiny, tiny.target, draft_spec, "fixed", sample=True),
            "eagle3": _run(tiny, tiny.eagle_target, eagle3_spec, "additive", sample=False)}


def test_greedy_outputs_equal_the_target_alone(runs):
    assert runs["draft"]["greedy"] == runs["reference"]
    assert runs["eagle3"]["greedy"] == runs["eagle_reference"]


def test_rows_hold_the_batchs_tokens_outside_the_map(runs):
    batch_tokens = {t for p in PROMPTS for t in p} | {t for out in runs["reference"] for t in out}
    draft = runs["draft"]
    assert draft["head_rows_before"] == MAP_IDS, "before any request: the map alone"
    assert draft["rebuilds"] >= 1
    added = draft["greedy_active"] - set(MAP_IDS)
    assert added and added <= batch_tokens, "rows beyond the map are the batch's own tokens"
    assert {50, 60}.issubset(draft["greedy_active"]), "the prompts' repeated ids outside the map got rows"
    # The fixed budget drafted outside the static map (so the context rows are used), within the active rows.
    assert not set(draft["drafts"].tolist()) <= set(MAP_IDS)
    assert set(draft["drafts"].tolist()) <= draft["greedy_active"]
    # EAGLE-3 scores only its own (even) draft vocabulary: its added rows are the batch's even ids.
    added3 = runs["eagle3"]["greedy_active"] - set(MAP_IDS)
    eagle_tokens = {t for p in PROMPTS for t in p} | {t for out in runs["eagle_reference"] for t in out}
    assert added3 and added3 <= {t for t in eagle_tokens if t % 2 == 0}


def test_rejection_sampler_gets_distributions_zero_outside_the_active_rows(runs):
    run = runs["draft"]
    assert run["sampled"] and run["rejection"] and len(run["active"]) == len(run["sampled"])
    drafted = {}
    for (hidden, probs), active in zip(run["sampled"], run["active"]):
        outside = outside_rows(active)
        assert bool((probs[:, outside] == 0).all())
        # Independent of the plugin: the draft model's own head restricted by hand to the rows active then.
        expected = torch.zeros_like(probs)
        expected[:, active] = torch.softmax(hidden.float() @ run["lm_head"][active].float().T / TEMPERATURE, -1)
        torch.testing.assert_close(probs, expected, rtol=1e-5, atol=1e-7)
        drafted.update({row.numpy().tobytes(): outside for row in probs})
    assert any(not set(a.tolist()) <= set(MAP_IDS) for a in run["active"]), "the rows went beyond the map"
    assert_handed_as_drafted(run["rejection"], drafted)
