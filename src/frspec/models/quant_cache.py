"""Quantized weights converted from a GGUF, cached beside the dequantized model and checked like it.

Converting a GGUF's blocks takes seconds to a minute; loading the result takes a second. So the int4/int8 weights
of a GGUF (models/gguf_quant.py) are stored once, device-neutral (int4 codes two to a byte, fp32 scales), in
`<cache root>/quantized/<name>-<quant>-g<group>/`, and packed for the device's kernel at load. The entry follows
the model cache's rules (models/cache.py): a marker listing every file's size and SHA-256, written last; an entry
whose marker, files or source do not match is rebuilt, never used; built in a temporary directory and renamed.

Before anything is written, every converted matrix is compared with the dequantized model's own weight (the
values transformers read from the same file), so a tensor-layout mismatch (say, an architecture whose Q/K rows
llama.cpp permutes) is an error at conversion, not wrong output later.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from frspec.errors import FrspecError
from frspec.models.cache import FORMAT, MARKER, _make_readable, _replace_dir, cache_root, is_valid_entry, read_marker
from frspec.models.cache import sha256_file
from frspec.models import quant_kernels as K
from frspec.models.quant import Int4Weight, Int8Weight

WEIGHTS = "quantized.safetensors"
# Relative Frobenius error of a converted matrix against the dequantized model's weight. Exact conversions differ
# only by the bf16 rounding of the cached model (< 0.4%); re-rounded ones by their quantization error (int4 of a
# Gaussian-like row: ~10%). A misplaced or permuted matrix is off by ~140%.
EXACT_TOLERANCE = 0.01
REQUANTIZED_TOLERANCE = 0.3


def quantized_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    return cache_root(cache_dir) / "quantized"


def entry_name(base: str, quant: str, group_size: int) -> str:
    return f"{base}-{quant}-g{group_size}"


def to_tensors(weights: dict[str, Int4Weight | Int8Weight]) -> dict[str, torch.Tensor]:
    """Flat safetensors form: int4 codes packed two to a byte (low nibble first)."""
    out = {}
    for name, w in weights.items():
        if isinstance(w, Int4Weight):
            c = w.codes
            out[f"{name}.int4_codes"] = (c[:, 0::2] | (c[:, 1::2] << 4)).contiguous()
            out[f"{name}.int4_scale"] = w.scale.float().contiguous()
            out[f"{name}.int4_minimum"] = w.minimum.float().contiguous()
        else:
            out[f"{name}.int8_values"] = w.values.contiguous()
            out[f"{name}.int8_scale"] = w.scale.float().contiguous()
    return out


def from_tensors(tensors: dict[str, torch.Tensor], group_size: int) -> dict[str, Int4Weight | Int8Weight]:
    weights = {}
    for key, t in tensors.items():
        name, _, field = key.rpartition(".")
        if field == "int4_codes":
            codes = K.nibbles(t).reshape(t.shape[0], -1)
            weights[name] = Int4Weight(codes, tensors[f"{name}.int4_scale"], tensors[f"{name}.int4_minimum"],
                                       group_size)
        elif field == "int8_values":
            weights[name] = Int8Weight(t, tensors[f"{name}.int8_scale"])
    return weights


def check_against_model(weights: dict[str, Int4Weight | Int8Weight], exact: set[str], model: torch.nn.Module,
                        what: str) -> None:
    """FrspecError unless each converted matrix matches the model's (dequantized) weight of the same name."""
    for name, w in weights.items():
        try:
            ref = model.get_submodule(name).weight.detach().float()
        except AttributeError as e:
            raise FrspecError(f"{what}: the model has no linear layer {name!r} for a GGUF matrix") from e
        got = w.dequantize()
        if got.shape != ref.shape:
            raise FrspecError(f"{what}: {name} is {tuple(got.shape)} in the GGUF but {tuple(ref.shape)} in the model")
        err = float((got - ref).norm() / ref.norm().clamp(min=1e-12))
        limit = EXACT_TOLERANCE if name in exact else REQUANTIZED_TOLERANCE
        if err > limit:
            raise FrspecError(
                f"{what}: converted {name} differs from the model's weight by {err:.1%} (limit {limit:.0%}); "
                "this GGUF's tensor layout is not supported for quantized loading"
            )


def load_entry(entry: Path, source: dict[str, Any]) -> dict[str, Int4Weight | Int8Weight] | None:
    """The cached weights, or None when the entry is missing, incomplete or built from another source."""
    marker = read_marker(entry)
    # Re-hash on every load (about a second per GB): a damaged file of the right size would otherwise load as
    # wrong weights without any error.
    if marker is None or marker.get("source") != source or not is_valid_entry(entry, verify=True):
        return None
    try:
        return from_tensors(load_file(entry / WEIGHTS), int(marker["group_size"]))
    except Exception:  # a damaged file that still has its recorded size: rebuild it
        return None


def write_entry(entry: Path, weights, source: dict[str, Any], group_size: int, config_dir: Path,
                exact: set[str]) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".tmp", dir=entry.parent))
    try:
        _make_readable(tmp)
        save_file(to_tensors(weights), str(tmp / WEIGHTS))
        shutil.copyfile(config_dir / "config.json", tmp / "config.json")
        files = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(tmp.iterdir())}
        marker = {
            "format": FORMAT,
            "source": source,
            "group_size": group_size,
            "exact": sorted(exact),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "files": files,
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=1))
        for path in tmp.iterdir():
            _make_readable(path)
        _replace_dir(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def cached_gguf_weights(
    gguf_path_fn,
    base: str,
    source: dict[str, Any],
    quant: str,
    group_size: int,
    model: torch.nn.Module,
    config_dir: Path,
    cache_dir: str | os.PathLike | None = None,
) -> dict[str, Int4Weight | Int8Weight]:
    """The GGUF's converted weights from the cache, building the entry first when needed.

    `gguf_path_fn` is a context manager factory yielding the GGUF's path (a default model's GGUF is assembled
    from its packages only when the entry has to be built); `source` identifies that GGUF in the marker.
    """
    from frspec.models.gguf_quant import read_gguf_linears

    entry = quantized_dir(cache_dir) / entry_name(base, quant, group_size)
    source = {**source, "quant": quant}
    weights = load_entry(entry, source)
    if weights is not None:
        return weights
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    with gguf_path_fn() as gguf_path:
        try:
            weights, exact = read_gguf_linears(gguf_path, quant, group_size, tied_head=tied)
        except FrspecError:
            raise
        except Exception as e:  # the reader and converters raise assorted errors on files they cannot handle
            raise FrspecError(f"cannot convert GGUF file {str(gguf_path)!r} to {quant}: {e}") from e
    check_against_model(weights, exact, model, f"{base} ({quant})")
    write_entry(entry, weights, source, group_size, Path(config_dir), exact)
    return weights
