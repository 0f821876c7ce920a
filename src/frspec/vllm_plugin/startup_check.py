"""The front end's check, when vLLM builds its engine configuration (`LLM(...)`, `vllm serve`): refuse a token map
of another vocabulary or tokenizer, and drafters FR-Spec cannot apply to, with one line, before any engine process
starts or any request runs."""

from __future__ import annotations

from typing import Any, Callable

from frspec.errors import FrspecError
from frspec.vllm_plugin import internals
from frspec.vllm_plugin.settings import (
    CONTEXT_ROWS_ENV, MAP_SIZE_ENV, TOKEN_MAP_ENV, auto_map_size, context_setting, load_configured_map,
    token_map_path, warn_if_length_differs,
)
from frspec.vocab.context_vocab import ContextSlots
from frspec.vocab.token_map import TokenMap

# Drafters that score their next token through a vLLM LogitsProcessor and an LM head this plugin can prune: a draft
# model, EAGLE-1/2 and MTP layers (both usually sharing the target's head), EAGLE-3 (its own reduced-vocabulary head).
SUPPORTED_METHODS = ("draft_model", "eagle", "eagle3", "mtp")


def check_engine_config(vllm_config: Any) -> None:
    """Raise FrspecError if the configured map cannot serve this engine configuration (no-op without a map)."""
    spec = vllm_config.speculative_config
    warn_if_length_differs(getattr(spec, "num_speculative_tokens", None) if spec is not None else None)
    if token_map_path() is None:
        return
    if spec is None:
        raise FrspecError(f"{TOKEN_MAP_ENV} is set but vLLM has no speculative decoding configured "
                          "(--speculative-config): FR-Spec restricts a drafter's LM head, so it needs a drafter")
    if spec.method not in SUPPORTED_METHODS:
        raise FrspecError(f"FR-Spec in vLLM supports {', '.join(SUPPORTED_METHODS)} drafters, not "
                          f"{spec.method!r}, which has no LM head to prune (unset {TOKEN_MAP_ENV})")
    if spec.use_heterogeneous_vocab:
        raise FrspecError("FR-Spec needs the drafter to share the target's vocabulary; "
                          "use_heterogeneous_vocab is not supported with a token map")
    if spec.use_local_argmax_reduction:
        raise FrspecError("use_local_argmax_reduction replaces the draft logits FR-Spec prunes; unset it to use a "
                          "token map")
    if getattr(spec, "draft_lm_head_quantization", None) is not None:
        raise FrspecError(f"FR-Spec and draft_lm_head_quantization={spec.draft_lm_head_quantization!r} both shrink the "
                          "drafter's LM head; use one of them (unset draft_lm_head_quantization or "
                          f"{TOKEN_MAP_ENV})")
    context = context_setting()
    if context is not None and runner_name(vllm_config) != "V1":
        raise FrspecError(f"context-aware drafting ({CONTEXT_ROWS_ENV}) updates the drafter's rows between steps, "
                          f"which only vLLM's V1 model runner lets it do; this engine runs {runner_name(vllm_config)} "
                          f"(unset {CONTEXT_ROWS_ENV}, or set VLLM_USE_V2_MODEL_RUNNER=0)")
    if context is not None and vllm_config.parallel_config.tensor_parallel_size > 1:
        raise FrspecError(f"context-aware drafting ({CONTEXT_ROWS_ENV}) supports one rank, not tensor parallelism "
                          f"over {vllm_config.parallel_config.tensor_parallel_size} ranks (unset {CONTEXT_ROWS_ENV})")
    if auto_map_size():
        why = None
        if runner_name(vllm_config) != "V1":
            why = (f"only vLLM's V1 model runner lets it change the rows between steps; this engine runs "
                   f"{runner_name(vllm_config)} (set VLLM_USE_V2_MODEL_RUNNER=0)")
        elif vllm_config.parallel_config.tensor_parallel_size > 1:
            ranks = vllm_config.parallel_config.tensor_parallel_size
            why = f"it supports one rank, not tensor parallelism over {ranks}"
        elif context is not None:
            why = f"it does not combine with context-aware drafting ({CONTEXT_ROWS_ENV})"
        if why:
            raise FrspecError(f"a map size chosen per batch step ({MAP_SIZE_ENV}=auto): {why} (or unset "
                              f"{MAP_SIZE_ENV} to serve the map as it is)")
    token_map = check_map_fits_target(vllm_config.model_config)
    if context is not None:
        # The budget's own refusals (e.g. more rows than a fixed budget can free), here rather than in a worker.
        ContextSlots(token_map.ids, token_map.vocab_size, context.extra_rows, context.budget,
                     keep=token_map.metadata.get("kept_tokens", {}).values())


def runner_name(vllm_config: Any) -> str:
    """V1 or V2: the model runner this engine's workers use."""
    return "V2" if vllm_config.use_v2_model_runner else "V1"


def check_map_fits_target(model_config: Any) -> TokenMap:
    """The map must be over the target model's vocabulary and, if it records one, its tokenizer. Returns it."""
    from frspec.models.tokenizer import load_tokenizer
    from frspec.vocab.tokenizer_identity import tokenizer_identity

    vocab_size = int(model_config.get_vocab_size())
    token_map = load_configured_map(vocab_size)
    tokenizer = load_tokenizer(str(model_config.tokenizer))
    token_map.check_tokenizer(tokenizer_identity(tokenizer), vocab_size=vocab_size)
    return token_map


def hook_engine_config(install_for_a_map: Callable[[], None]) -> None:
    """Run `check_engine_config` on every configuration EngineArgs creates while a map is configured, after
    `install_for_a_map` (the plugin's `register`; idempotent).

    Installed even without a map (the only hook that is): vLLM calls `register()` once per process, when its first
    engine starts, so in a program that runs engines in its own process and sets the map only for a later one, this
    is where the rest of the plugin gets installed, before that engine loads its drafter. Without it, that engine
    would come up without FR-Spec and nothing would say so."""

    def make(original):
        def create_engine_config(self, *args, **kwargs):
            config = original(self, *args, **kwargs)
            if token_map_path() is not None:
                install_for_a_map()  # register(), idempotent: the hooks a map needs, if this process lacks them
                check_engine_config(config)
            return config

        return create_engine_config

    internals.patch_method("vllm.engine.arg_utils", "EngineArgs.create_engine_config", make)
