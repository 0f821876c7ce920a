"""The startup check's refusals on configurations vLLM is not needed to build (V2 runners and vLLM 0.33's
draft_lm_head_quantization cannot be started on the CPU build)."""

from types import SimpleNamespace

import pytest

from frspec.errors import FrspecError
from frspec.vllm_plugin.startup_check import check_engine_config


def _config(method, **spec):
    speculative = SimpleNamespace(method=method, use_heterogeneous_vocab=False, use_local_argmax_reduction=False)
    speculative.__dict__.update(spec)
    return SimpleNamespace(speculative_config=speculative, model_config=None, use_v2_model_runner=False)


def test_without_a_map_nothing_is_checked(monkeypatch):
    monkeypatch.delenv("FRSPEC_TOKEN_MAP", raising=False)
    assert check_engine_config(_config("medusa")) is None  # no map: the plugin does nothing at all
    # The same configuration is refused once a map is set, so it passed above only because no map was set.
    monkeypatch.setenv("FRSPEC_TOKEN_MAP", "/nonexistent/map.pt")
    with pytest.raises(FrspecError, match="not 'medusa'"):
        check_engine_config(_config("medusa"))


@pytest.mark.parametrize("method, words", [("medusa", "not 'medusa'"), ("suffix", "not 'suffix'"),
                                           ("ngram", "not 'ngram'"), ("dflash", "not 'dflash'")])
def test_drafters_without_a_prunable_head_are_refused(monkeypatch, method, words):
    monkeypatch.setenv("FRSPEC_TOKEN_MAP", "/nonexistent/map.pt")
    with pytest.raises(FrspecError, match=words):
        check_engine_config(_config(method))


@pytest.mark.parametrize("option", ["use_heterogeneous_vocab", "use_local_argmax_reduction"])
def test_options_that_replace_the_draft_logits_are_refused(monkeypatch, option):
    monkeypatch.setenv("FRSPEC_TOKEN_MAP", "/nonexistent/map.pt")
    with pytest.raises(FrspecError, match=option):
        check_engine_config(_config("draft_model", **{option: True}))


def test_context_rows_under_tensor_parallelism_are_refused(monkeypatch):
    monkeypatch.setenv("FRSPEC_TOKEN_MAP", "/nonexistent/map.pt")
    monkeypatch.setenv("FRSPEC_CONTEXT_ROWS", "64")
    config = _config("draft_model")
    config.parallel_config = SimpleNamespace(tensor_parallel_size=2)
    with pytest.raises(FrspecError, match="supports one rank"):
        check_engine_config(config)


def test_bad_context_settings_are_refused_at_startup(monkeypatch):
    monkeypatch.setenv("FRSPEC_TOKEN_MAP", "/nonexistent/map.pt")
    monkeypatch.setenv("FRSPEC_CONTEXT_ROWS", "lots")
    with pytest.raises(FrspecError, match="FRSPEC_CONTEXT_ROWS must be a non-negative integer"):
        check_engine_config(_config("draft_model"))


def test_draft_lm_head_quantization_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("FRSPEC_TOKEN_MAP", "/nonexistent/map.pt")
    with pytest.raises(FrspecError, match="draft_lm_head_quantization='fp8'") as err:
        check_engine_config(_config("mtp", draft_lm_head_quantization="fp8"))
    assert "\n" not in str(err.value)


def test_context_rows_on_the_v2_runner_are_refused(monkeypatch):
    monkeypatch.setenv("FRSPEC_TOKEN_MAP", "/nonexistent/map.pt")
    monkeypatch.setenv("FRSPEC_CONTEXT_ROWS", "64")
    config = _config("eagle3")
    config.use_v2_model_runner = True
    with pytest.raises(FrspecError, match="only vLLM's V1 model runner.*this engine runs V2") as err:
        check_engine_config(config)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("where, words", [("v2", "this engine runs V2"), ("tp", "not tensor parallelism over 2"),
                                          ("context", "does not combine with context-aware")])
def test_an_automatic_map_size_is_refused_where_it_cannot_change_between_steps(monkeypatch, where, words):
    monkeypatch.setenv("FRSPEC_TOKEN_MAP", "/nonexistent/map.pt")
    monkeypatch.setenv("FRSPEC_TOKEN_MAP_SIZE", "auto")
    config = _config("draft_model")
    config.parallel_config = SimpleNamespace(tensor_parallel_size=2 if where == "tp" else 1)
    config.use_v2_model_runner = where == "v2"
    if where == "context":
        monkeypatch.setenv("FRSPEC_CONTEXT_ROWS", "64")
    with pytest.raises(FrspecError, match=f"FRSPEC_TOKEN_MAP_SIZE=auto.*{words}") as err:
        check_engine_config(config)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("hook_point_present", [True, False])
def test_without_a_map_register_watches_for_a_later_one_or_says_it_cannot(monkeypatch, hook_point_present):
    """vLLM calls register() once per process: without a map it hooks engine-config creation so that a map set
    before a later engine of the process is applied; a vLLM without that hook point gets a warning instead of an
    engine that silently runs without FR-Spec."""
    import frspec.vllm_plugin as plugin
    from frspec.vllm_plugin import internals, settings, startup_check

    monkeypatch.delenv("FRSPEC_TOKEN_MAP", raising=False)
    hooked, warnings = [], []
    monkeypatch.setattr(startup_check, "hook_engine_config", hooked.append)
    moved = "vllm.engine.arg_utils:EngineArgs.create_engine_config"
    monkeypatch.setattr(internals, "missing_symbol", lambda symbols=None: None if hook_point_present else moved)
    # The plugin's logger, recorded directly: vLLM's logging setup stops its records from reaching pytest's capture.
    monkeypatch.setattr(settings, "logger", SimpleNamespace(warning=lambda fmt, *args: warnings.append(fmt % args)))
    plugin.register()
    if hook_point_present:
        assert hooked == [plugin.register] and warnings == []
    else:
        assert hooked == []
        assert len(warnings) == 1 and moved in warnings[0] and "FRSPEC_TOKEN_MAP" in warnings[0]
