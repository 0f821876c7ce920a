"""`load_model(..., quant="int4"|"int8")`: where a loaded model's quantized weights come from.

- a default model (by name or its prepared cache directory) or a `.gguf` file: the GGUF's own blocks, converted once (models/gguf_quant.py) and cached
  (models/quant_cache.py). A default model's GGUF is deleted after `frspec models prepare`, so it is assembled
  again from its packages, into a temporary file, only while the cache entry is built.
- a Hugging Face directory or hub id (bf16/fp16/fp32 checkpoints): group-wise quantization of the loaded float
  weights at load, which takes seconds, so nothing is cached.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import torch

from frspec.models.quant import DEFAULT_GROUP_SIZE, quantize_model


def quantize_loaded(
    model: torch.nn.Module,
    spec: str | os.PathLike,
    model_dir: str,
    quant: str,
    cache_dir: str | os.PathLike | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    head: bool = True,
) -> torch.nn.Module:
    """Quantize the float `model` loaded from `spec` (resolved to `model_dir`) in place; return it."""
    from frspec.models.cache import cache_root, gguf_identity, read_marker
    from frspec.models.defaults import DEFAULT_MODELS, assemble_gguf
    from frspec.models.quant_cache import cached_gguf_weights

    spec = str(spec)
    path = Path(spec).expanduser()
    gguf_source = None
    # A default model may come by name or as its prepared cache directory (which records the name).
    recorded = (read_marker(Path(model_dir)) or {}).get("source") or {}
    default_name = spec if spec in DEFAULT_MODELS else recorded.get("default")
    if default_name in DEFAULT_MODELS:
        default = DEFAULT_MODELS[default_name]

        @contextlib.contextmanager
        def assembled():
            scratch = cache_root(cache_dir) / "gguf"
            scratch.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix=".quant-", dir=scratch) as tmp:
                yield assemble_gguf(default, Path(tmp) / default.gguf_name)

        gguf_source = (assembled, default.name, {"default": default.name, "sha256": default.sha256})
    elif path.suffix == ".gguf":
        identity = gguf_identity(path)
        gguf_source = (lambda: contextlib.nullcontext(path), f"{path.stem}-{identity}",
                       {"gguf": path.name, "identity": identity})
    weights = None
    if gguf_source is not None:
        path_fn, base, source = gguf_source
        weights = cached_gguf_weights(path_fn, base, source, quant, group_size, model, Path(model_dir), cache_dir)
        # Weights are read back on the CPU; the modules are built on the model's device.
    return quantize_model(model, quant, group_size, head=head, weights=weights)
