"""FR-Spec on vLLM's draft_model speculation, in fp32 on tiny models: greedy outputs with the map equal those
without it and the target's own, for a batch of 4; drafts stay inside the map; without a map nothing changes; with
probabilistic draft sampling the rejection sampler receives exactly the pruned head's distribution."""

import pytest
import torch
from tests.vllm.vllm_tiny import (MAP_IDS, PROMPTS, VOCAB, Recorder, frspec_head, greedy_outputs, hf_greedy,
                                  sample_seeded, start_llm, stop_llm)

from frspec.vllm_plugin.pruned_logits import pruned_logits_of

NEW_TOKENS = 24
TEMPERATURE = 0.8


def _run(tiny, token_map):
    spec = {"method": "draft_model", "model": tiny.draft, "num_speculative_tokens": 3,
            "draft_sample_method": "probabilistic"}
    llm = start_llm(tiny.target, spec, token_map)
    try:
        rec = Recorder(llm)
        drafter = rec.drafter
        run = {
            # what the plugin put on the drafter (before the recorder wrapped anything)
            "touched": {k for k in ("_greedy_sample", "frspec_heads", "compute_logits") if k in vars(drafter)}
            | ({"pruned_logits"} if pruned_logits_of(drafter.model) else set())
            | ({"compute_logits"} if "compute_logits" in vars(drafter.model) else set()),
            "head": frspec_head(drafter),
            "lm_head_weight": drafter.model.lm_head.weight.detach().clone(),
        }
        run["greedy"] = greedy_outputs(llm, PROMPTS, NEW_TOKENS)
        run["greedy_drafts"] = torch.cat([d.flatten() for d in rec.drafts])
        sample_seeded(llm, rec, PROMPTS[:1], TEMPERATURE)
        run["sampled"], run["rejection_draft_probs"] = rec.sampled, rec.rejection_draft_probs
        return run
    finally:
        stop_llm(llm)


@pytest.fixture(scope="module")
def runs(tiny):
    return {"reference": hf_greedy(tiny.target, PROMPTS, NEW_TOKENS), "plain": _run(tiny, None),
            "map": _run(tiny, tiny.token_map)}


def test_greedy_outputs_with_the_map_equal_without_it_and_the_target_alone(runs):
    assert runs["plain"]["greedy"] == runs["reference"]
    assert runs["map"]["greedy"] == runs["reference"]


def test_drafts_stay_inside_the_map(runs):
    in_map = torch.zeros(VOCAB, dtype=torch.bool)
    in_map[MAP_IDS] = True
    assert bool(in_map[runs["map"]["greedy_drafts"]].all())
    # The same drafter without the map drafts outside it, so the check above can fail.
    assert not bool(in_map[runs["plain"]["greedy_drafts"]].all())


def test_without_a_map_the_plugin_changes_nothing(runs):
    assert runs["plain"]["touched"] == set() and runs["plain"]["head"] is None
    assert runs["map"]["touched"] == {"pruned_logits", "frspec_heads", "_greedy_sample"}  # + V1 compact path
    assert torch.equal(runs["plain"]["lm_head_weight"], runs["map"]["lm_head_weight"]), "the head is never modified"


def test_rejection_sampler_gets_the_pruned_heads_distribution(runs):
    run = runs["map"]
    assert run["sampled"] and run["rejection_draft_probs"]
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[MAP_IDS] = False
    drafted_rows = {}
    for hidden, probs in run["sampled"]:
        # Independent of the plugin's code: the draft model's own full head, restricted to the map by hand.
        logits = hidden.float() @ run["lm_head_weight"][MAP_IDS].float().T
        expected = torch.zeros_like(probs)
        expected[:, MAP_IDS] = torch.softmax(logits / TEMPERATURE, dim=-1)
        torch.testing.assert_close(probs, expected, rtol=1e-5, atol=1e-7)
        assert bool((probs[:, outside] == 0).all())
        drafted_rows.update({row.numpy().tobytes(): row for row in probs})
    handed = torch.cat(run["rejection_draft_probs"])
    assert bool((handed[:, outside] == 0).all())
    torch.testing.assert_close(handed.sum(-1), torch.ones(handed.shape[0]))
    assert all(row.numpy().tobytes() in drafted_rows for row in handed), "the drafter's rows, bit for bit"
    # Without the map the same drafter's probabilities do reach outside it.
    plain = torch.cat(runs["plain"]["rejection_draft_probs"])
    assert float(plain[:, outside].sum()) > 0
