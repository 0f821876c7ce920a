"""No silent no-op: every worker confirms, when its runner has loaded the models and before it serves anything, that
its drafter scores through the pruned head; otherwise the engine stops with one line naming the vLLM version, the
runner (V1 or V2) and the drafter class.

The confirmation runs the drafter's own `compute_logits` on a probe hidden state (every draft step, for MTP
drafters whose logits depend on `spec_step_idx`) and checks that FR-Spec's logits were called and left every id
outside the map at -inf. This also builds the pruned rows from the LM head the drafter really calls, so nothing is
built while a graph is captured or a request runs.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from frspec.errors import FrspecError
from frspec.vllm_plugin import internals
from frspec.vllm_plugin.batch_context import BatchContextRows
from frspec.vllm_plugin.batch_map_size import BatchMapSize
from frspec.vllm_plugin.compact_path import use_compact_path
from frspec.vllm_plugin.pruned_logits import pruned_logits_of
from frspec.vllm_plugin.settings import auto_map_size, context_setting, token_map_path, v1_compact_path

# Where each runner keeps its drafter (a V1 proposer or a V2 speculator, both with the draft model as `.model`).
RUNNERS = {
    "V1": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.load_model", "drafter"),
    "V1-CPU": ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner.load_model", "drafter"),
    "V2": ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.load_model", "speculator"),
}


def drafter_model(drafter: Any) -> Any:
    model = getattr(drafter, "model", None)
    return model.unwrap() if hasattr(model, "unwrap") else model


def refusal(runner_kind: str, drafter: Any, model: Any, why: str) -> FrspecError:
    return FrspecError(
        f"FR-Spec is not active on this worker (vLLM {internals.vllm_version()}, runner {runner_kind.split('-')[0]}, "
        f"drafter {type(drafter).__name__} with model {type(model).__name__}): {why}; refusing to serve without it "
        "(unset FRSPEC_TOKEN_MAP to run without FR-Spec)")


def probe_steps(model: Any, num_speculative_tokens: int) -> list[dict]:
    """The keyword arguments of every distinct draft step's compute_logits call."""
    try:
        params = inspect.signature(model.compute_logits).parameters
    except (TypeError, ValueError):
        return [{}]
    if "spec_step_idx" not in params:
        return [{}]
    return [{"spec_step_idx": i} for i in range(max(1, int(num_speculative_tokens)))]


def confirm_pruned_head(runner: Any, runner_kind: str) -> None:
    """Raise FrspecError unless the runner's drafter scores through FR-Spec's pruned head (no-op without a map or
    without a drafter: the front end refuses a map without one)."""
    if token_map_path() is None:
        return
    drafter = getattr(runner, RUNNERS[runner_kind][2], None)
    if drafter is None:
        return
    model = drafter_model(drafter)
    processors = pruned_logits_of(model) if model is not None else []
    if not processors:
        raise refusal(runner_kind, drafter, model, "the draft model was loaded by a path FR-Spec's install does not "
                      "reach, so it would draft from its full LM head")
    spec = runner.vllm_config.speculative_config
    param = next(model.parameters())
    hidden_size = int(model.config.hidden_size)
    probe = torch.randn(2, hidden_size, generator=torch.Generator().manual_seed(0)).to(param.device, param.dtype)
    for kwargs in probe_steps(model, spec.num_speculative_tokens):
        before = sum(p.calls for p in processors)
        try:
            with torch.no_grad():
                logits = model.compute_logits(probe, **kwargs)
        except (IndexError, KeyError, AssertionError):
            if kwargs.get("spec_step_idx", 0) == 0:
                raise
            break  # an MTP model with fewer layers than draft steps: its runner repeats step 0 (recursive MTP)
        if sum(p.calls for p in processors) == before:
            raise refusal(runner_kind, drafter, model, "its compute_logits does not call the pruned head")
        if logits is None:  # a tensor-parallel rank that does not receive the gathered logits
            continue
        kept = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        for p in processors:
            for head in p.heads.values():
                kept[head.target_ids.to(logits.device)] = True
        if bool(torch.isfinite(logits[..., ~kept]).any()):
            raise refusal(runner_kind, drafter, model, "its logits are finite outside the token map")
    heads = [h for p in processors for h in p.heads.values()]
    if context_setting() is not None:
        if len(heads) != 1:
            raise refusal(runner_kind, drafter, model, f"context-aware rows need one LM head, it has {len(heads)}")
        drafter.frspec_context = BatchContextRows(heads[0].vocab)  # updated by the runner hook between steps
    if auto_map_size():
        if len(heads) != 1:
            raise refusal(runner_kind, drafter, model, f"a map size chosen per step needs one LM head, it has "
                          f"{len(heads)}")
        # The head's costs at every size, measured now (before serving); updated by the runner hook between steps.
        drafter.frspec_map_size = BatchMapSize.measure(heads[0].vocab, spec.num_speculative_tokens, probe)
    compact = (runner_kind.startswith("V1") and len(heads) == 1 and v1_compact_path()
               and use_compact_path(drafter, heads[0]))
    drafter.frspec_heads = heads
    drafter.frspec_path = "compact" if compact else "full-row"  # what the bench reports (FRSPEC_V1_COMPACT)
    internals.get("vllm.logger", "init_logger")("vllm.frspec").info(
        "FR-Spec confirmed before serving: runner %s, drafter %s (%s), %d pruned LM head(s), %s path",
        runner_kind.split("-")[0], type(drafter).__name__, type(model).__name__, len(heads),
        "compact" if compact else "full-row")


def hook_runner_loading() -> None:
    """Confirm the pruned head at the end of every runner's load_model (idempotent)."""
    for kind, (module, path, _) in RUNNERS.items():
        def make(original, kind=kind):
            def load_model(self, *args, **kwargs):
                result = original(self, *args, **kwargs)
                confirm_pruned_head(self, kind)
                return result

            return load_model

        internals.patch_method(module, path, make)
