"""FR-Spec inside vLLM: a `vllm.general_plugins` plugin that restricts the drafter's LM head to a token map.

vLLM loads this plugin in every one of its processes (front end, engine core, workers) through the entry point in
pyproject.toml. It changes nothing unless a token map is configured (without one it only watches for a map set before
a later engine of the same process, `_watch_for_a_later_map`):

    FRSPEC_TOKEN_MAP=/path/to/map            any format `frspec vocab` reads (thunlp .pt, frspec, vllm-scores, eagle3)
    FRSPEC_TOKEN_MAP_FORMAT=thunlp           optional: the format, when detection from the content is not wanted
    FRSPEC_CONTEXT_ROWS=N                    optional: context-aware drafting, N rows for the running batch's own
                                             tokens (prompts and generated), batch_context.py
    FRSPEC_CONTEXT_BUDGET=fixed|additive     the N rows displace the map's least frequent ones (fixed, default) or
                                             come on top of the map (additive)
    FRSPEC_TOKEN_MAP_SIZE=auto               optional: the map is a ranking; its size is chosen per batch step (V1
                                             runner, one rank: batch_map_size.py)
    FRSPEC_V1_COMPACT=1|0                    V1 runner: draft over the kept columns (1, default) or over the full
                                             -inf row every V2 speculator uses (0: measures that row's cost)

With a map, for `draft_model`, `eagle` (EAGLE-1/2), `eagle3` and `mtp` speculation, on vLLM's V1 and V2 runners:
  - `register()` refuses a vLLM that lacks a symbol the plugin uses (internals.py), in one line;
  - at startup (`LLM(...)`, `vllm serve`), before any request: the map is checked against the target's vocabulary
    and tokenizer, and unsupported setups (n-gram, other drafters, draft_lm_head_quantization, ...) are refused,
    each with one FrspecError line (startup_check.py);
  - when vLLM loads the draft model: its logits processor is replaced by the map rows' GEMM scattered into a row of
    -inf (pruned_logits.py, drafter_hook.py; EAGLE-3: the head's rows whose d2t target ids are in the map), from a
    copy of the rows of the LM head it calls. The target model, its LM head and everything else are untouched;
  - every worker confirms the pruned head before serving, or the engine stops with one line (worker_check.py).
"""

from __future__ import annotations


def register() -> None:
    """vLLM's entry point: check that this vLLM has every symbol the plugin uses, then install the start-up check,
    the drafter install and the workers' confirmation. Without a map only the start-up check's hook is installed,
    and it does nothing until a map is set; then it calls this again (startup_check.hook_engine_config)."""
    from frspec.vllm_plugin.settings import auto_map_size, context_setting, token_map_path, v1_compact_path

    if token_map_path() is None:
        _watch_for_a_later_map()
        return
    # A bad FRSPEC_V1_COMPACT or FRSPEC_TOKEN_MAP_SIZE is one line here, not inside a worker.
    v1_compact_path()
    auto = auto_map_size()
    from frspec.vllm_plugin import internals
    from frspec.vllm_plugin.between_steps import hook_runner_drafting
    from frspec.vllm_plugin.drafter_hook import hook_model_loading
    from frspec.vllm_plugin.startup_check import hook_engine_config
    from frspec.vllm_plugin.worker_check import hook_runner_loading

    internals.check_vllm()
    hook_engine_config(register)
    hook_model_loading()
    hook_runner_loading()
    if context_setting() is not None or auto:
        hook_runner_drafting()


def _watch_for_a_later_map() -> None:
    """Without a map: hook engine-config creation, so a map set later in this process reaches that engine. A vLLM
    without that hook point is left running (no map: nothing was asked of it), with one warning that a map set
    later in this process would not be seen; `register()` refuses it whenever vLLM calls it with a map set."""
    from frspec.vllm_plugin import internals
    from frspec.vllm_plugin.settings import logger
    from frspec.vllm_plugin.startup_check import hook_engine_config

    hook_point = [symbol for symbol in internals.SYMBOLS if symbol.path == "EngineArgs.create_engine_config"]
    missing = internals.missing_symbol(hook_point)
    if missing is None:
        hook_engine_config(register)
    else:
        # vLLM calls register() once per process: an engine of this process started after a map is set would run
        # without FR-Spec, and nothing else would say so.
        logger.warning("FR-Spec: this vLLM lacks %s, so a token map set after this point in this process is not "
                       "applied; set FRSPEC_TOKEN_MAP before the process starts its first engine", missing)
