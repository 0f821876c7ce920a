"""FR-Spec on vLLM's `mtp` method (tiny, random, fp32, batch 4; one MTP layer drafting 3 tokens, i.e. recursive
MTP), with a MiMo checkpoint (Qwen2-style target) and a GLM-4.5 one (MoE target; its MTP layer normalises before
the shared head, the DeepSeek-V3 layout): greedy outputs equal the target's own, with and without the map; drafts
stay inside the map (and without it they do not); the MTP layer's logits come from a pruned copy of the target's
shared LM head, which stays as it was; with probabilistic draft sampling the rejection sampler receives the pruned
distribution (for GLM: after the layer's own norm), zero outside the map."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.vllm.vllm_tiny import (
    MAP_IDS, PROMPTS, VOCAB, Recorder, frspec_head, greedy_outputs, hf_greedy, model_runner, sample_seeded, start_llm,
    stop_llm,
)

from frspec.vllm_plugin.pruned_logits import pruned_logits_of

NEW_TOKENS = 20
TEMPERATURE = 0.8


def _run(tiny, token_map, target=None):
    spec = {"method": "mtp", "num_speculative_tokens": 3, "draft_sample_method": "probabilistic"}
    llm = start_llm(target or tiny.mimo_target, spec, token_map)
    try:
        rec = Recorder(llm)
        runner = model_runner(llm)
        drafter = rec.drafter
        run = {"greedy": greedy_outputs(llm, PROMPTS, NEW_TOKENS),
               "drafts": torch.cat([d.flatten() for d in rec.drafts]),
               "drafter_model": type(drafter.model).__name__, "pruned": pruned_logits_of(drafter.model),
               "head": frspec_head(drafter), "draft_lm_head": drafter.model.lm_head,
               "target_lm_head": runner.model.lm_head}
        sample_seeded(llm, rec, PROMPTS[:2], TEMPERATURE)
        run.update(sampled=rec.sampled, rejection=rec.rejection_draft_probs)
        return run
    finally:
        stop_llm(llm)


@pytest.fixture(scope="module")
def runs(tiny):
    return {"reference": hf_greedy(tiny.mimo_target, PROMPTS, NEW_TOKENS), "plain": _run(tiny, None),
            "map": _run(tiny, tiny.token_map)}


@pytest.fixture(scope="module")
def glm(tiny):
    return {"reference": hf_greedy(tiny.glm_target, PROMPTS, NEW_TOKENS), "map": _run(tiny, tiny.token_map,
                                                                                    tiny.glm_target)}


def test_greedy_outputs_equal_the_target_alone(runs):
    assert runs["map"]["drafter_model"] == "MiMoMTP"
    assert runs["plain"]["greedy"] == runs["reference"]
    assert runs["map"]["greedy"] == runs["reference"]


def test_mtp_drafts_stay_inside_the_map(runs):
    in_map = torch.zeros(VOCAB, dtype=torch.bool)
    in_map[MAP_IDS] = True
    assert bool(in_map[runs["map"]["drafts"]].all())
    assert not bool(in_map[runs["plain"]["drafts"]].all()), "without the map the MTP layer drafts outside it"
    assert runs["plain"]["pruned"] == [] and runs["plain"]["head"] is None


def test_mtp_scores_with_a_pruned_copy_of_the_targets_shared_head(runs, tiny):
    run = runs["map"]
    assert run["draft_lm_head"] is run["target_lm_head"], "vLLM shares the target's head with the MTP layer"
    saved = load_file(f"{tiny.mimo_target}/model.safetensors")["lm_head.weight"]
    target_weight = run["target_lm_head"].weight.detach()
    assert torch.equal(target_weight[: saved.shape[0]], saved), "the target's LM head is untouched"
    pruned = run["head"].vocab.head.weight
    assert pruned.data_ptr() != target_weight.data_ptr()
    assert torch.equal(pruned, saved[MAP_IDS]) and run["head"].target_ids.tolist() == MAP_IDS


def test_probabilistic_draft_probabilities_are_the_pruned_distribution(runs, tiny):
    run = runs["map"]
    assert run["sampled"] and run["rejection"]
    saved = load_file(f"{tiny.mimo_target}/model.safetensors")["lm_head.weight"]
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[MAP_IDS] = False
    drafted = set()
    for hidden, probs in run["sampled"]:
        # Independent of the plugin: MiMoMTP's logits are the shared head on the MTP layer's (normed) output.
        expected = torch.zeros_like(probs)
        expected[:, MAP_IDS] = torch.softmax(hidden.float() @ saved[MAP_IDS].float().T / TEMPERATURE, dim=-1)
        torch.testing.assert_close(probs, expected, rtol=1e-5, atol=1e-7)
        drafted |= {row.numpy().tobytes() for row in probs}
    handed = torch.cat(run["rejection"])
    assert bool((handed[:, outside] == 0).all())
    torch.testing.assert_close(handed.sum(-1), torch.ones(handed.shape[0]))
    assert all(row.numpy().tobytes() in drafted for row in handed), "the drafter's rows, bit for bit"
    plain = torch.cat(runs["plain"]["rejection"])
    assert float(plain[:, outside].sum()) > 0, "without the map the MTP distribution reaches outside it"


def test_glm_mtp_greedy_outputs_equal_the_target_alone_and_drafts_stay_in_the_map(glm):
    run = glm["map"]
    assert run["drafter_model"] == "Glm4MoeMTP"
    assert run["greedy"] == glm["reference"]
    assert set(run["drafts"].tolist()) <= set(MAP_IDS)
    assert run["draft_lm_head"] is run["target_lm_head"]


def test_glm_mtp_draft_probabilities_are_the_pruned_distribution_after_its_own_norm(glm, tiny):
    run = glm["map"]
    assert run["sampled"] and run["rejection"]
    weights = load_file(f"{tiny.glm_target}/model.safetensors")
    head, norm = weights["lm_head.weight"], weights["model.layers.2.shared_head.norm.weight"]
    eps = json.loads((Path(tiny.glm_target) / "config.json").read_text())["rms_norm_eps"]
    for hidden, probs in run["sampled"]:
        # Independent of the plugin: the MTP layer's shared_head (RMSNorm, then the target's head), map rows only.
        x = hidden.float()
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm
        expected = torch.zeros_like(probs)
        expected[:, MAP_IDS] = torch.softmax(normed @ head[MAP_IDS].T / TEMPERATURE, dim=-1)
        torch.testing.assert_close(probs, expected, rtol=1e-4, atol=1e-6)
    handed = torch.cat(run["rejection"])
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[MAP_IDS] = False
    assert bool((handed[:, outside] == 0).all())
