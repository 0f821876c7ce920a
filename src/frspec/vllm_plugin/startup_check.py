"""The front end's check, when vLLM builds its engine configuration (`LLM(...)`, `vllm serve`): refuse a token map
of another vocabulary or tokenizer, and drafters FR-Spec cannot apply to, with one line, before any engine process
starts or any request runs."""

from __future__ import annotations

import functools
from typing import Any

from frspec.errors import FrspecError
from frspec.vllm_plugin.settings import (
    CONTEXT_ROWS_ENV, TOKEN_MAP_ENV, context_setting, load_configured_map, token_map_path, warn_if_length_differs,
)
from frspec.vocab.context_vocab import ContextSlots
from frspec.vocab.token_map import TokenMap

# Drafters that score their next token with an LM head this plugin can prune.
SUPPORTED_METHODS = ("draft_model", "eagle", "eagle3")


def check_engine_config(vllm_config: Any) -> None:
    """Raise FrspecError if the configured map cannot serve this engine configuration (no-op without a map)."""
    spec = vllm_config.speculative_config
    warn_if_length_differs(getattr(spec, "num_speculative_tokens", None) if spec is not None else None)
    if token_map_path() is None:
        return
    if spec is None:
        raise FrspecError(f"{TOKEN_MAP_ENV} is set but vLLM has no speculative decoding configured "
                          "(--speculative-config): FR-Spec restricts a drafter's LM head, so it needs a drafter")
    if spec.method == "mtp":
        raise FrspecError(
            "FR-Spec in vLLM supports draft_model, eagle and eagle3 drafters, not MTP: an MTP layer's logits come "
            f"from the target's shared head inside the layer, which this plugin does not prune (unset {TOKEN_MAP_ENV})"
        )
    if spec.method not in SUPPORTED_METHODS:
        raise FrspecError(f"FR-Spec in vLLM supports {', '.join(SUPPORTED_METHODS)} drafters, not "
                          f"{spec.method!r}, which has no LM head to prune (unset {TOKEN_MAP_ENV})")
    if spec.use_heterogeneous_vocab:
        raise FrspecError("FR-Spec needs the drafter to share the target's vocabulary; "
                          "use_heterogeneous_vocab is not supported with a token map")
    if spec.use_local_argmax_reduction:
        raise FrspecError("use_local_argmax_reduction replaces the draft logits FR-Spec prunes; unset it to use a "
                          "token map")
    context = context_setting()
    if context is not None and vllm_config.parallel_config.tensor_parallel_size > 1:
        raise FrspecError(f"context-aware drafting ({CONTEXT_ROWS_ENV}) supports one rank, not tensor parallelism "
                          f"over {vllm_config.parallel_config.tensor_parallel_size} ranks (unset {CONTEXT_ROWS_ENV})")
    token_map = check_map_fits_target(vllm_config.model_config)
    if context is not None:
        # The budget's own refusals (e.g. more rows than a fixed budget can free), here rather than in a worker.
        ContextSlots(token_map.ids, token_map.vocab_size, context.extra_rows, context.budget,
                     keep=token_map.metadata.get("kept_tokens", {}).values())


def check_map_fits_target(model_config: Any) -> TokenMap:
    """The map must be over the target model's vocabulary and, if it records one, its tokenizer. Returns it."""
    from frspec.models.tokenizer import load_tokenizer
    from frspec.vocab.tokenizer_identity import tokenizer_identity

    vocab_size = int(model_config.get_vocab_size())
    token_map = load_configured_map(vocab_size)
    tokenizer = load_tokenizer(str(model_config.tokenizer))
    token_map.check_tokenizer(tokenizer_identity(tokenizer), vocab_size=vocab_size)
    return token_map


def hook_engine_config() -> None:
    """Run `check_engine_config` on every configuration EngineArgs creates (idempotent)."""
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_engine_config
    if getattr(original, "_frspec_hooked", False):
        return

    @functools.wraps(original)
    def create_engine_config(self, *args, **kwargs):
        config = original(self, *args, **kwargs)
        check_engine_config(config)
        return config

    create_engine_config._frspec_hooked = True
    EngineArgs.create_engine_config = create_engine_config
