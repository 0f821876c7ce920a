"""No silent no-op: a drafter loaded through a path FR-Spec's install does not reach (here a loader that, like
vLLM's tensorizer or ModelExpress loaders, does not go through BaseModelLoader.load_model) stops the engine with
one line naming the vLLM version, the runner and the drafter class, before any request is served."""

import pytest
from tests.vllm.vllm_tiny import start_llm, stop_llm

from frspec.errors import FrspecError
from frspec.vllm_plugin.internals import vllm_version


def test_a_drafter_loaded_around_the_install_stops_the_engine_in_one_line(tiny, monkeypatch):
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from vllm.v1.spec_decode.draft_model import DraftModelProposer

    import frspec.vllm_plugin

    monkeypatch.setenv("FRSPEC_TOKEN_MAP", tiny.token_map)
    frspec.vllm_plugin.register()  # the hooks are in place...
    unhooked_load = BaseModelLoader.load_model.__wrapped__  # ...and this path goes around them

    def load_around_the_install(self):
        config = self._create_draft_vllm_config()
        return unhooked_load(get_model_loader(config.load_config), vllm_config=config,
                             model_config=config.model_config, prefix="draft_model")

    monkeypatch.setattr(DraftModelProposer, "_get_model", load_around_the_install)
    spec = {"method": "draft_model", "model": tiny.draft, "num_speculative_tokens": 2}
    with pytest.raises(FrspecError) as err:
        stop_llm(start_llm(tiny.target, spec, tiny.token_map))
    message = str(err.value)
    assert "\n" not in message
    for words in (f"vLLM {vllm_version()}", "runner V1", "drafter DraftModelProposer", "not active"):
        assert words in message, (words, message)


def test_this_vllm_has_every_symbol_the_plugin_uses():
    from frspec.vllm_plugin.internals import missing_symbol

    assert missing_symbol() is None


def test_register_refuses_a_vllm_without_a_symbol_it_uses(tiny, monkeypatch):
    """As vLLM calls it in every process (load_general_plugins does not catch what register() raises)."""
    import frspec.vllm_plugin
    from frspec.vllm_plugin import internals

    monkeypatch.setenv("FRSPEC_TOKEN_MAP", tiny.token_map)
    moved = internals.Symbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.load_model_moved", "hook", "V2")
    monkeypatch.setattr(internals, "SYMBOLS", internals.SYMBOLS + (moved,))
    with pytest.raises(FrspecError) as err:
        frspec.vllm_plugin.register()
    message = str(err.value)
    assert f"vLLM {vllm_version()}" in message and moved.name in message and "\n" not in message
