"""Which model loads get FR-Spec's logits: exactly the speculative config's draft model, recognised by identity
(vLLM hands the same ModelConfig object to every runner's draft load; a copy is not guessed at, the workers' check
refuses it instead), never the target."""

import copy
from types import SimpleNamespace

from frspec.vllm_plugin.drafter_hook import is_draft_model


def _configs():
    target, draft = SimpleNamespace(model="target"), SimpleNamespace(model="draft")
    spec = SimpleNamespace(draft_model_config=draft)
    return SimpleNamespace(model_config=target, speculative_config=spec), target, draft


def test_the_target_is_never_the_draft_model():
    vllm_config, target, _ = _configs()
    assert not is_draft_model(vllm_config, target)
    assert not is_draft_model(vllm_config, None)  # get_model's default: the config's own model


def test_the_draft_model_config_passed_or_carried_is_recognised():
    vllm_config, _, draft = _configs()
    assert is_draft_model(vllm_config, draft)  # V1 EAGLE/MTP, V2 load_eagle_model: model_config=draft_model_config
    draft_vllm_config = SimpleNamespace(model_config=draft, speculative_config=vllm_config.speculative_config)
    # V1 draft_model, V2 StandaloneAR: replace(vllm_config, model_config=draft), then get_model without one
    assert is_draft_model(draft_vllm_config, None)


def test_a_copy_or_no_speculative_config_is_not_guessed():
    vllm_config, _, draft = _configs()
    assert not is_draft_model(vllm_config, copy.copy(draft))
    assert not is_draft_model(SimpleNamespace(model_config=draft, speculative_config=None), draft)
