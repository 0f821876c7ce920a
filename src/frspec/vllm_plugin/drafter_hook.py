"""The worker's hook: after vLLM loads a drafter (SpecDecodeBaseProposer.load_model, which draft_model, EAGLE and
EAGLE-3 proposers share), give that proposer an FR-Spec head and route its drafting through it.

Only the proposer instance and its own draft-model object are changed: `_greedy_sample` and `_sample_draft_tokens`
(the proposer's two ways of turning a hidden state into draft tokens, and probabilities for rejection sampling)
and the draft model's `compute_logits`. The LM-head module is never modified; an EAGLE-1/2 head that shares the
target's LM head gets a pruned copy of its rows, so the target's own head and forward are untouched. Every
per-step operation is a device op (matmul, argmax, index): no host-device synchronisation is added.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from frspec.errors import FrspecError
from frspec.vllm_plugin.batch_context import BatchContextRows
from frspec.vllm_plugin.drafter_head import DrafterHead, build_drafter_head, vllm_shard_ranges
from frspec.vllm_plugin.settings import ContextSetting, context_setting, load_configured_map, token_map_path
from frspec.vllm_plugin.startup_check import SUPPORTED_METHODS


def drafter_model(proposer: Any) -> Any:
    model = proposer.model
    return model.unwrap() if hasattr(model, "unwrap") else model


def head_for(model: Any, context: ContextSetting | None = None) -> DrafterHead:
    """The FR-Spec head for a loaded vLLM draft model (or EAGLE head) and the configured map (context-aware with
    `context`)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    lm_head, processor = model.lm_head, model.logits_processor
    if not isinstance(getattr(lm_head, "quant_method", None), UnquantizedEmbeddingMethod):
        raise FrspecError("FR-Spec in vLLM needs an unquantized drafter LM head")
    if processor.scale != 1.0 or processor.soft_cap is not None or processor.logits_as_input:
        raise FrspecError("FR-Spec in vLLM does not support drafters with scaled or soft-capped logits")
    vocab_size = int(model.config.vocab_size)  # the target vocabulary (EAGLE-3: not its draft_vocab_size)
    token_map = load_configured_map(vocab_size)
    n_rows = int(lm_head.org_vocab_size)
    d2t = getattr(model, "draft_id_to_target_id", None)
    head_to_target = None
    if d2t is not None:  # EAGLE-3: head row i drafts target id i + d2t[i]
        head_to_target = torch.arange(n_rows, device=d2t.device) + d2t.detach().to(torch.long)
    elif n_rows != vocab_size:
        raise FrspecError(f"the drafter's LM head has {n_rows} rows but the vocabulary has {vocab_size} ids")
    weight = lm_head.weight.detach()
    bias = getattr(lm_head, "bias", None)
    if processor.head_dtype is not None and processor.head_dtype != weight.dtype:
        weight = weight.to(processor.head_dtype)  # vLLM's head_dtype override (e.g. an fp32 head)
    all_gather = None
    if lm_head.tp_size > 1:
        from vllm.distributed import get_tp_group

        group = lm_head.parallel_group or get_tp_group()
        all_gather = functools.partial(group.all_gather, dim=-1)
    head = build_drafter_head(
        weight, token_map, vocab_size, n_rows, shard_ranges=vllm_shard_ranges(lm_head), rank=lm_head.tp_rank,
        bias=None if bias is None else bias.detach(), head_to_target=head_to_target, all_gather=all_gather,
        context=context,
    )
    # A context-aware head's rows change between steps: a prepacked copy of them would go stale, so it multiplies
    # with torch's own matmul over the live rows.
    head.matmul = None if context is not None else vllm_gemm(head.vocab.head)
    return head


def vllm_gemm(linear: torch.nn.Linear):
    """vLLM's GEMM for the pruned rows, set up as vLLM sets up an LM head (on CPU: a prepacked oneDNN or SGL
    kernel), so the pruned head is not slower per row than the full head it replaces. None for an empty shard."""
    from vllm.model_executor.layers.utils import dispatch_unquantized_gemm
    from vllm.platforms import current_platform

    if linear.weight.shape[0] == 0:
        return None
    if current_platform.is_cpu():
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(linear, remove_weight=False)
    gemm = dispatch_unquantized_gemm()
    return lambda x: gemm(linear, x, linear.weight, linear.bias)


def install(proposer: Any) -> DrafterHead:
    """Route the proposer's drafting through an FR-Spec head; returns the head (also `proposer.frspec_head`)."""
    if proposer.method not in SUPPORTED_METHODS:
        raise FrspecError(f"FR-Spec in vLLM supports {', '.join(SUPPORTED_METHODS)} drafters, not {proposer.method!r}")
    if proposer.use_heterogeneous_vocab or proposer.use_local_argmax_reduction:
        raise FrspecError("FR-Spec in vLLM does not support use_heterogeneous_vocab or use_local_argmax_reduction")
    model = drafter_model(proposer)
    context = context_setting()
    head = head_for(model, context)

    def greedy_sample(hidden_states: torch.Tensor) -> torch.Tensor:
        return head.to_target(head.kept_logits(hidden_states).argmax(dim=-1))

    def sample_draft_tokens(hidden_states: torch.Tensor, sampling_metadata: Any):
        if not proposer._enable_probabilistic_draft_probs or sampling_metadata.all_greedy:
            return greedy_sample(hidden_states), None
        # vLLM's own draft sampling (temperature, Gumbel noise), over the kept columns only.
        idx, probs = proposer._sample_from_logits(head.kept_logits(hidden_states), sampling_metadata)
        return head.to_target(idx), None if probs is None else head.to_full(probs)

    proposer._greedy_sample = greedy_sample
    proposer._sample_draft_tokens = sample_draft_tokens
    model.compute_logits = head.full_logits  # any other caller of the drafter's logits sees the pruned head too
    proposer.frspec_head = head
    if context is not None:
        proposer.frspec_context = BatchContextRows(head.vocab)  # updated by the runner hook between steps
    from vllm.logger import init_logger

    init_logger("vllm.frspec").info(
        "FR-Spec: %s drafter scores %d of %d target ids (this rank: %d LM-head rows) from %s%s",
        proposer.method, head.size, head.vocab_size, head.vocab.size, token_map_path(),
        "" if context is None else f", context-aware: {context.extra_rows} rows for the batch's tokens "
        f"({context.budget} budget)")
    return head


def hook_drafter_loading() -> None:
    """Install FR-Spec on every drafter vLLM loads while a map is configured (idempotent)."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    original = SpecDecodeBaseProposer.load_model
    if getattr(original, "_frspec_hooked", False):
        return

    @functools.wraps(original)
    def load_model(self, target_model):
        original(self, target_model)
        if token_map_path() is not None:
            install(self)

    load_model._frspec_hooked = True
    SpecDecodeBaseProposer.load_model = load_model
