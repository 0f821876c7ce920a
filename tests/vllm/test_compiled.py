"""FR-Spec with vLLM's default compilation (enforce_eager=False: vLLM torch.compiles the target's and the drafter's
forwards; on the V1 runner the drafter's logits run eagerly between them), fp32 tiny models, batch 4: greedy outputs
equal the target's own for a draft model, an EAGLE-1/2 head and a MiMo MTP layer, and drafts stay inside the map."""

import pytest
import torch
from tests.vllm.vllm_tiny import MAP_IDS, PROMPTS, Recorder, greedy_outputs, hf_greedy, start_llm, stop_llm

NEW_TOKENS = 16


def _run(tiny, target, spec):
    llm = start_llm(target, spec, tiny.token_map, enforce_eager=False)
    try:
        assert llm.llm_engine.vllm_config.compilation_config.mode != 0, "compilation is on"
        rec = Recorder(llm)
        return greedy_outputs(llm, PROMPTS, NEW_TOKENS), torch.cat([d.flatten() for d in rec.drafts])
    finally:
        stop_llm(llm)


@pytest.mark.parametrize("method", ["draft_model", "eagle", "mtp"])
def test_compiled_greedy_outputs_equal_the_target_alone(tiny, method):
    if method == "draft_model":
        target, spec = tiny.target, {"method": "draft_model", "model": tiny.draft, "num_speculative_tokens": 3}
    elif method == "eagle":
        target, spec = tiny.eagle_target, {"method": "eagle", "model": tiny.eagle_head, "num_speculative_tokens": 3}
    else:  # MiMo's MTP layer: the full-row path (no V1 compact path), compiled
        target, spec = tiny.mimo_target, {"method": "mtp", "num_speculative_tokens": 3}
    outputs, drafts = _run(tiny, target, spec)
    assert outputs == hf_greedy(target, PROMPTS, NEW_TOKENS)
    assert drafts.numel() and set(drafts.tolist()) <= set(MAP_IDS)
