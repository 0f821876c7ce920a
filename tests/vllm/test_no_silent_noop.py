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


def test_a_map_set_after_the_first_engine_of_a_process_reaches_the_next_engine(tiny, monkeypatch):
    """vLLM calls the plugin's register() once per process, when its first engine starts. A program whose first
    engine has no map and a later one has (in-process engines) must get FR-Spec in the later one without calling
    register() itself: the one hook installed without a map installs the rest when it sees the map."""
    import vllm.plugins
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    import frspec.vllm_plugin
    from frspec.bench.vllm_runner import _drafter_rows
    from frspec.vllm_plugin import internals

    # This process as vLLM leaves it before its first engine: none of the plugin's hooks in place.
    for symbol in internals.SYMBOLS:
        if not symbol.use.startswith("hook:"):
            continue
        owner, name = internals.hook_owner(symbol.module, symbol.path)
        method = vars(owner).get(name)
        if getattr(method, "_frspec_hooked", False):
            monkeypatch.setattr(owner, name, method.__wrapped__)
    monkeypatch.delenv("FRSPEC_TOKEN_MAP", raising=False)
    frspec.vllm_plugin.register()  # the first engine's start, without a map...
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", True)  # ...after which vLLM does not call it again
    assert not getattr(BaseModelLoader.load_model, "_frspec_hooked", False)  # so only the watch can bring FR-Spec

    spec = {"method": "draft_model", "model": tiny.draft, "num_speculative_tokens": 2}
    llm = start_llm(tiny.target, spec, tiny.token_map)  # sets the map the way users do, then starts the engine
    try:
        assert [r for r in llm.collective_rpc(_drafter_rows) if r is not None] == [40]
    finally:
        stop_llm(llm)
