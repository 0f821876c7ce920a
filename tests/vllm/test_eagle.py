"""FR-Spec on vLLM's EAGLE-1/2 and EAGLE-3 drafters (tiny random heads, fp32, batch 4): greedy outputs equal the
target's own; EAGLE-1/2, whose head shares the target's LM head, drafts from a pruned copy and leaves the target's
head as it was; EAGLE-3 drafts from the intersection of the map and its d2t vocabulary, in map order."""

import pytest
import torch
from safetensors.torch import load_file
from tests.vllm.vllm_tiny import (MAP_IDS, PROMPTS, Recorder, frspec_head, greedy_outputs, hf_greedy, model_runner,
                                  start_llm, stop_llm)

NEW_TOKENS = 16


def _run(tiny, method, head):
    spec = {"method": method, "model": head, "num_speculative_tokens": 3}
    llm = start_llm(tiny.eagle_target, spec, tiny.token_map)
    try:
        rec = Recorder(llm)
        runner = model_runner(llm)
        greedy = greedy_outputs(llm, PROMPTS, NEW_TOKENS)
        drafter = rec.drafter
        return {"greedy": greedy, "drafts": torch.cat([d.flatten() for d in rec.drafts]),
                "head": frspec_head(drafter), "draft_lm_head": drafter.model.lm_head,
                "target_lm_head": runner.model.lm_head}
    finally:
        stop_llm(llm)


@pytest.fixture(scope="module")
def runs(tiny):
    return {"reference": hf_greedy(tiny.eagle_target, PROMPTS, NEW_TOKENS),
            "eagle": _run(tiny, "eagle", tiny.eagle_head), "eagle3": _run(tiny, "eagle3", tiny.eagle3_head)}


def test_greedy_outputs_equal_the_target_alone(runs):
    assert runs["eagle"]["greedy"] == runs["reference"]
    assert runs["eagle3"]["greedy"] == runs["reference"]


def test_eagle_head_sharing_the_targets_lm_head_drafts_from_a_pruned_copy(runs, tiny):
    run = runs["eagle"]
    assert run["draft_lm_head"] is run["target_lm_head"], "vLLM shares the target's head with this EAGLE head"
    saved = load_file(f"{tiny.eagle_target}/model.safetensors")["lm_head.weight"]
    target_weight = run["target_lm_head"].weight.detach()
    assert torch.equal(target_weight[: saved.shape[0]], saved), "the target's LM head is untouched"
    pruned = run["head"].vocab.head.weight
    assert pruned.data_ptr() != target_weight.data_ptr()
    assert torch.equal(pruned, saved[MAP_IDS]) and run["head"].target_ids.tolist() == MAP_IDS
    assert set(run["drafts"].tolist()) <= set(MAP_IDS)


def test_eagle3_drafts_from_the_maps_intersection_with_d2t_in_map_order(runs, tiny):
    run = runs["eagle3"]
    both = [i for i in MAP_IDS if i in set(tiny.eagle3_target_ids)]
    assert run["head"].target_ids.tolist() == both
    rows = [tiny.eagle3_target_ids.index(i) for i in both]
    saved = load_file(f"{tiny.eagle3_head}/model.safetensors")["lm_head.weight"]
    assert torch.equal(run["head"].vocab.head.weight, saved[rows])
    assert set(run["drafts"].tolist()) <= set(both)
