"""Loading target and draft models from a hub id, a local directory, a `.gguf` file or a default model's name.

    model = load_model("qwen2.5-coder-0.5b-instruct")           # a default model, prepared on first use
    model = load_model("/models/qwen.gguf", dtype="fp32")        # dequantized once, then loaded from the cache
    model = load_model("./my-hf-dir", device="cuda")

Every model comes back in eval mode with gradients off: frspec only ever runs inference.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from frspec.errors import FrspecError
from frspec.models.cache import gguf_entry
from frspec.models.defaults import DEFAULT_MODELS, prepare_default_models
from frspec.models.dtypes import DTYPE_NAMES, DTYPES, HALF_DTYPES, dtype_name, parse_dtype  # noqa: F401 (re-exported)
from frspec.models.mtp import builtin_config
from frspec.models.packed_attention import use_packed_attention
from frspec.models.wide_linear import use_wide_linears


def parse_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise FrspecError(f"unknown device {device!r}: {e}") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise FrspecError(f"device {device!r} requested but CUDA is not available on this machine")
    return dev


def auto_dtype(config, device: torch.device) -> torch.dtype:
    """bf16 on CPU (half the memory traffic of fp32, and fast on current CPUs); on an accelerator the model's own
    half dtype, or bf16 when the checkpoint says fp32 or nothing."""
    if device.type == "cpu":
        return torch.bfloat16
    own = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(own, str):
        own = DTYPES.get(own.removeprefix("torch."))
    return own if own in HALF_DTYPES else torch.bfloat16


def is_default_model_name(spec: str) -> bool:
    return spec in DEFAULT_MODELS


def resolve_model_dir(spec: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> str:
    """What `from_pretrained` should load for `spec`: a local HF directory, or a hub id passed through.

    Default-model names are prepared (assembled and converted once) and `.gguf` files are dequantized into the
    model cache, so both come back as cache directories. Tokenizer loading can use this too: every cache
    directory holds the model's tokenizer.
    """
    spec = str(spec)
    if is_default_model_name(spec):
        return str(prepare_default_models(cache_dir=cache_dir, which=(spec,))[spec])
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        return str(gguf_entry(path, cache_dir))
    if path.exists():
        if not path.is_dir():
            raise FrspecError(f"{spec!r} is a file, not a model directory or a .gguf file")
        if not (path / "config.json").is_file():
            raise FrspecError(f"{spec!r} is not a model directory (no config.json)")
        return str(path)
    # Hub ids are "name" or "org/name"; anything else that does not exist locally was meant as a path.
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1 or os.sep != "/" and os.sep in spec:
        raise FrspecError(f"model path not found: {spec!r}")
    return spec


def load_model(
    spec: str | os.PathLike,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    cache_dir: str | os.PathLike | None = None,
    quant: str | None = None,
    quantize_head: bool = True,
) -> PreTrainedModel:
    """Load a causal LM for inference from a hub id, local HF directory, `.gguf` file or default-model name.

    dtype: "auto" (bf16 on CPU, the model's own half dtype on an accelerator), "bf16", "fp16", "fp32", "fp64" or
    a torch dtype. cache_dir: the frspec cache root for GGUF conversions and default models (default
    $FRSPEC_CACHE or ~/.cache/frspec); hub downloads use the Hugging Face cache as usual.
    Note a GGUF of quantized weights is cached in bf16, so fp32 from such a file means upcast bf16 weights.
    quant: "int4" or "int8" runs the linear layers (with `quantize_head`, the LM head too) on PyTorch's weight-only
    kernels, converting a GGUF's 4-bit blocks directly (models/quant_loading.py); dtype is then the activations'.
    A bf16/fp16 model on CPU computes its wide calls (a prefill) through fp32 where this machine's half-precision
    GEMM is the slower one (models/wide_linear.py), and a CPU model's grouped-query attention over a few query rows
    packs the heads that share a key/value head into rows (models/packed_attention.py).
    """
    from frspec.models.quant import parse_quant

    torch_dtype = parse_dtype(dtype)  # validate arguments before any slow work
    quant = parse_quant(quant)
    dev = parse_device(device)
    source = resolve_model_dir(spec, cache_dir)
    model = _from_pretrained(spec, source, torch_dtype, dev)
    model.eval()
    model.requires_grad_(False)
    use_wide_linears(model)  # a half-precision CPU model's wide calls through fp32 where that is faster
    use_packed_attention(model)  # a CPU model's grouped-query attention over a few rows without copying the cache
    if quant is not None:
        from frspec.models.quant_loading import quantize_loaded

        quantize_loaded(model, spec, source, quant, cache_dir, head=quantize_head)
    return model


def _from_pretrained(spec, source: str, torch_dtype: torch.dtype | None, dev: torch.device) -> PreTrainedModel:
    try:
        # MiMo's config names remote code; its architecture is Qwen2's (models/mtp.py reads its MTP layers).
        config = builtin_config(source) or AutoConfig.from_pretrained(source)
        if torch_dtype is None:
            torch_dtype = auto_dtype(config, dev)
        return AutoModelForCausalLM.from_pretrained(source, config=config, dtype=torch_dtype, device_map=str(dev))
    except (OSError, ValueError, KeyError, SafetensorError) as e:
        # SafetensorError: a truncated or garbage model.safetensors (header too large, incomplete metadata...)
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise FrspecError(f"cannot load model {str(spec)!r}: {first_line}") from e


def vocab_size_of(model: PreTrainedModel) -> int:
    """Rows of the output embedding (what the LM head scores), falling back to config.vocab_size."""
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


def max_positions_of(model: PreTrainedModel) -> int | None:
    """The longest sequence the model is configured for (`max_position_embeddings`), None if it names none."""
    config = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    n = getattr(config, "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def check_context_length(
    model: PreTrainedModel, prompt_tokens: int, max_new_tokens: int, what: str = "the model"
) -> None:
    """Refuse a request whose prompt + max_new_tokens exceeds the model's positions, before anything is allocated.

    Drafts never reach past the token budget (the engine drafts at most `remaining - 1` tokens deep), so draft
    depth adds nothing: the deepest position any forward sees is prompt_tokens + max_new_tokens - 2.
    """
    limit = max_positions_of(model)
    if limit is not None and prompt_tokens + max_new_tokens > limit:
        raise FrspecError(
            f"prompt ({prompt_tokens} tokens) + max_new_tokens ({max_new_tokens}) = {prompt_tokens + max_new_tokens} "
            f"exceeds {what}'s context of {limit} positions; lower --max-new-tokens to at most "
            f"{max(limit - prompt_tokens, 0)}"
        )


def check_same_vocab(target: PreTrainedModel, draft: PreTrainedModel) -> int:
    """Raise FrspecError unless target and draft score the same vocabulary; return its size.

    Drafted ids are verified by the target as-is, so both LM heads must cover the same id space.
    """
    target_size, draft_size = vocab_size_of(target), vocab_size_of(draft)
    if target_size != draft_size:
        raise FrspecError(
            f"target and draft vocabularies differ: target has {target_size} output rows, draft has {draft_size}; "
            "speculative decoding needs models that share one tokenizer"
        )
    return target_size


def set_threads(n: int | None) -> int:
    """Use `n` CPU threads for torch ops (None: leave torch's default). Returns the count in effect."""
    if n is not None:
        if n < 1:
            raise FrspecError(f"thread count must be at least 1, got {n}")
        torch.set_num_threads(n)
    return torch.get_num_threads()
