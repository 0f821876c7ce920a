"""The install: when vLLM loads the speculative config's draft model (its model-loading entry,
BaseModelLoader.load_model, whatever runner, proposer or speculator asks for it), its LogitsProcessor modules are
replaced by FR-Spec's (pruned_logits.py); the pruned rows are built from the LM head the model calls, so after vLLM
shared the target's head with an EAGLE-1/2 or MTP drafter, the rows are a copy of the target's. The worker then
confirms the head is in place before serving (worker_check.py).

Nothing else of vLLM is changed: not the LM-head module, not the target model, not the proposer.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from frspec.errors import FrspecError
from frspec.vllm_plugin import internals
from frspec.vllm_plugin.batch_map_size import BatchMapSize
from frspec.vllm_plugin.drafter_head import DrafterHead, build_drafter_head, vllm_shard_ranges
from frspec.vllm_plugin.pruned_logits import attach_pruned_logits
from frspec.vllm_plugin.settings import auto_map_size, context_setting, load_configured_map, token_map_path


def head_for(model: Any, lm_head: Any, processor: Any) -> DrafterHead:
    """The FR-Spec head for one LM head of a loaded vLLM draft model (the head its `processor` is called with) and
    the configured map (context-aware when FRSPEC_CONTEXT_ROWS is set)."""
    embedding_method = internals.get("vllm.model_executor.layers.vocab_parallel_embedding",
                                     "UnquantizedEmbeddingMethod")
    if not isinstance(getattr(lm_head, "quant_method", None), embedding_method):
        raise FrspecError("FR-Spec in vLLM needs an unquantized drafter LM head, got "
                          f"{type(getattr(lm_head, 'quant_method', None)).__name__}")
    if processor.scale != 1.0 or processor.soft_cap is not None or processor.logits_as_input:
        raise FrspecError("FR-Spec in vLLM does not support drafters with scaled or soft-capped logits")
    context = context_setting()
    ranked = auto_map_size()
    config = getattr(model, "config", None)
    vocab_size = int(getattr(config, "vocab_size", processor.vocab_size))  # the target vocabulary (EAGLE-3 too)
    token_map = load_configured_map(vocab_size)
    n_rows = int(lm_head.org_vocab_size)
    d2t = getattr(model, "draft_id_to_target_id", None)
    head_to_target = None
    if d2t is not None and n_rows != vocab_size:  # EAGLE-3: head row i drafts target id i + d2t[i]
        head_to_target = torch.arange(n_rows, device=d2t.device) + d2t.detach().to(torch.long)
    elif n_rows != vocab_size:
        raise FrspecError(f"the drafter's LM head has {n_rows} rows but the vocabulary has {vocab_size} ids")
    weight = lm_head.weight.detach()
    bias = getattr(lm_head, "bias", None)
    if processor.head_dtype is not None and processor.head_dtype != weight.dtype:
        weight = weight.to(processor.head_dtype)  # vLLM's head_dtype override (e.g. an fp32 head)
    all_gather = None
    if lm_head.tp_size > 1:
        group = getattr(lm_head, "parallel_group", None) or internals.get("vllm.distributed", "get_tp_group")()
        all_gather = functools.partial(group.all_gather, dim=-1)
    head = build_drafter_head(
        weight, token_map, vocab_size, n_rows, shard_ranges=vllm_shard_ranges(lm_head), rank=lm_head.tp_rank,
        bias=None if bias is None else bias.detach(), head_to_target=head_to_target, all_gather=all_gather,
        context=context, ranked=ranked,
    )
    # A context-aware or ranked head's rows change between steps: a prepacked copy of them would go stale (and a
    # ranked head would need one per size), so it multiplies with torch's own matmul over the live rows.
    head.matmul = None if context is not None or ranked else vllm_gemm(head.vocab.head)
    internals.get("vllm.logger", "init_logger")("vllm.frspec").info(
        "FR-Spec: %s scores %d of %d target ids (this rank: %d LM-head rows) from %s%s%s", type(model).__name__,
        head.size, head.vocab_size, head.vocab.size, token_map_path(),
        "" if context is None else f", context-aware: {context.extra_rows} rows for the batch's tokens "
        f"({context.budget} budget)", "" if not ranked else f", ranked: the map size chosen per batch step among "
        f"{list(BatchMapSize.sizes_for(head.vocab))} (one copy of the head's {head.vocab.full_size} rows)")
    return head


def vllm_gemm(linear: torch.nn.Linear):
    """vLLM's GEMM for the pruned rows, set up as vLLM sets up an LM head (on CPU: a prepacked oneDNN or SGL
    kernel), so the pruned head is not slower per row than the full head it replaces. None for an empty shard."""
    if linear.weight.shape[0] == 0:
        return None
    if internals.get("vllm.platforms", "current_platform").is_cpu():
        internals.get("vllm.model_executor.layers.utils", "dispatch_cpu_unquantized_gemm")(linear, remove_weight=False)
    gemm = internals.get("vllm.model_executor.layers.utils", "dispatch_unquantized_gemm")()
    return lambda x: gemm(linear, x, linear.weight, linear.bias)


def is_draft_model(vllm_config: Any, model_config: Any) -> bool:
    """Whether a load is the speculative config's draft model (the same config object vLLM made for it)."""
    spec = getattr(vllm_config, "speculative_config", None)
    draft_config = getattr(spec, "draft_model_config", None)
    return draft_config is not None and (model_config or vllm_config.model_config) is draft_config


def hook_model_loading() -> None:
    """Give every draft model vLLM loads, while a map is configured, the FR-Spec logits (idempotent)."""

    def make(original):
        def load_model(self, vllm_config, model_config=None, *args, **kwargs):
            model = original(self, vllm_config, model_config, *args, **kwargs)
            if token_map_path() is not None and is_draft_model(vllm_config, model_config):
                if attach_pruned_logits(model, functools.partial(head_for, model)) == 0:
                    raise FrspecError(f"FR-Spec in vLLM cannot prune {type(model).__name__}: its logits do not go "
                                      "through vLLM's LogitsProcessor (unset FRSPEC_TOKEN_MAP)")
            return model

        return load_model

    internals.patch_method("vllm.model_executor.model_loader.base_loader", "BaseModelLoader.load_model", make)
