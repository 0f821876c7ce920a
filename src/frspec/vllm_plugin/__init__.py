"""FR-Spec inside vLLM: a `vllm.general_plugins` plugin that restricts the drafter's LM head to a token map.

vLLM loads this plugin in every one of its processes (front end, engine core, workers) through the entry point in
pyproject.toml. It does nothing unless a token map is configured:

    FRSPEC_TOKEN_MAP=/path/to/map            any format `frspec vocab` reads (thunlp .pt, frspec, vllm-scores, eagle3)
    FRSPEC_TOKEN_MAP_FORMAT=thunlp           optional: the format, when detection from the content is not wanted
    FRSPEC_CONTEXT_ROWS=N                    optional: context-aware drafting, N rows for the running batch's own
                                             tokens (prompts and generated), batch_context.py
    FRSPEC_CONTEXT_BUDGET=fixed|additive     the N rows displace the map's least frequent ones (fixed, default) or
                                             come on top of the map (additive)

With a map, for `draft_model`, `eagle` (EAGLE-1/2) and `eagle3` speculation:
  - at startup (`LLM(...)`, `vllm serve`), before any request: the map is checked against the target's vocabulary
    and tokenizer, and unsupported setups (MTP, n-gram, other drafters) are refused, each with one FrspecError line;
  - when the drafter is loaded: its LM head is replaced, for drafting only, by a pruned copy of the map's rows
    (EAGLE-3: the head's rows whose d2t target ids are in the map, in map order); drafted indices are mapped to
    target ids. The target model, its LM head and everything else in vLLM are untouched.
"""

from __future__ import annotations


def register() -> None:
    """vLLM's entry point: install the startup check and the drafter hook (both return at once without a map)."""
    from frspec.vllm_plugin.batch_context import hook_runner_drafting
    from frspec.vllm_plugin.drafter_hook import hook_drafter_loading
    from frspec.vllm_plugin.settings import context_setting, token_map_path
    from frspec.vllm_plugin.startup_check import hook_engine_config

    if token_map_path() is None:
        return  # no map: nothing of vLLM is changed, nothing is imported
    hook_engine_config()
    hook_drafter_loading()
    if context_setting() is not None:
        hook_runner_drafting()
