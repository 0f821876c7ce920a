"""Token-map file formats, each read and written:

- `thunlp`: a Python list of ints in frequency order saved with `torch.save` (the FR-Spec paper's
  `freq_32768.pt`; SGLang's `--speculative-token-map` reads it with `torch.load(path, weights_only=True)`).
  It does not record the vocabulary size.
- `vllm-scores`: a float64 tensor over the vocabulary, indexed by token id, saved with `torch.save`: the relative
  frequency of each kept id, 0 for the others (as the vLLM FR-Spec PR consumes it, with a keep threshold). Kept
  ids never counted get half the smallest positive score; maps without counts get rank-derived scores. Reading
  keeps ids scoring above the threshold, by descending score, ties by id.
- `eagle3`: safetensors with `d2t` (int64 [k], target_id = i + d2t[i], draft ids sorted by target id) and `t2d`
  (bool [vocab]), the buffers EAGLE-3 checkpoints carry. Frequency order is not representable: ids come back
  sorted. Reading also accepts a checkpoint (or a torch-saved dict) that holds these two tensors.
- `frspec`: safetensors with `ids` (and `counts` when known) plus JSON metadata: tokenizer identity, vocab size,
  k, coverage, selection, the source counts.

This module reads files into TokenMap constructor arguments and writes any map-like object (ids, vocab_size, k,
metadata, counts); `TokenMap.load` / `TokenMap.save` (token_map.py) build on it, so it never needs the class.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from frspec.errors import FrspecError
from frspec.io import atomic_path
from frspec.vocab.counts import COUNTS_METADATA_KEY

if TYPE_CHECKING:
    from frspec.vocab.token_map import TokenMap

FORMATS = ("frspec", "thunlp", "vllm-scores", "eagle3")
FRSPEC_METADATA_KEY = "frspec_token_map"
FRSPEC_FORMAT_VERSION = 1


def format_for_path(path: str | Path) -> str:
    """The default format for an output path: torch pickles (.pt/.pth) are thunlp, everything else frspec."""
    return "thunlp" if Path(path).suffix.lower() in (".pt", ".pth") else "frspec"


def write_token_map(token_map: "TokenMap", path: str | Path, format: str | None = None) -> str:
    """Write `token_map` atomically in `format` (default from the extension). Returns the format written."""
    format = format or format_for_path(path)
    if format not in _WRITERS:
        raise FrspecError(f"unknown token-map format {format!r}; choose one of {', '.join(FORMATS)}")
    if format != "thunlp" and token_map.metadata.get("vocab_size_known") is False:
        raise FrspecError(
            "this thunlp map does not record its vocabulary size, which the "
            f"{format} format needs; give it (--vocab-size N or --tokenizer)"
        )
    with atomic_path(path) as tmp:
        _WRITERS[format](token_map, tmp)
    return format


def read_token_map(
    path: str | Path, format: str | None = None, vocab_size: int | None = None, threshold: float = 0.0
) -> dict[str, Any]:
    """Read a token map file in any format (detected unless given) into TokenMap's constructor arguments
    (ids, vocab_size, metadata, counts); `vocab_size` completes a thunlp map (see `TokenMap.load`)."""
    path = Path(path)
    if not path.is_file():
        raise FrspecError(f"token map not found: {path}")
    if format is not None and format not in FORMATS:
        raise FrspecError(f"unknown token-map format {format!r}; choose one of {', '.join(FORMATS)}")
    content = _read(path)
    detected = _detect(content, path)
    if format is not None and format != detected:
        raise FrspecError(f"{path} is not a {format} token map (it looks like {detected})")
    try:
        parts = _READERS[detected](content, path, threshold)
    except FrspecError as e:
        # Name the file and the format it was read as: a map in an unexpected format reads as something else.
        reason = str(e).removeprefix(f"{path}: ")
        raise FrspecError(f"{path} (read as a {detected} token map): {reason}") from e
    parts.setdefault("metadata", {})["format"] = detected
    parts["metadata"]["path"] = str(path)  # names the file in later checks (never saved, see _write_frspec)
    if detected == "thunlp":
        if vocab_size is not None:
            parts["vocab_size"] = int(vocab_size)
        parts["metadata"]["vocab_size_known"] = vocab_size is not None
    return parts


def detect_format(path: str | Path) -> str:
    """Which of FORMATS a file holds, from its content."""
    path = Path(path)
    if not path.is_file():
        raise FrspecError(f"token map not found: {path}")
    return _detect(_read(path), path)


# -- reading ---------------------------------------------------------------------------------------------------


def _read(path: Path) -> dict[str, Any]:
    """Load a file as {"kind": "safetensors"|"torch", ...} without trusting it (weights_only, no code)."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError as e:
        raise FrspecError(f"cannot read token map {path}: {e.strerror or e}") from e
    kind = "safetensors" if len(head) == 9 and head[8:9] == b"{" else "torch"
    try:
        if kind == "safetensors" and struct.unpack("<Q", head[:8])[0] < (100 << 20):
            with safe_open(str(path), framework="pt") as f:
                return {"kind": "safetensors", "metadata": f.metadata() or {},
                        "tensors": {k: f.get_tensor(k) for k in f.keys() if k in ("ids", "counts", "d2t", "t2d")},
                        "keys": set(f.keys())}
        return {"kind": "torch", "value": torch.load(path, map_location="cpu", weights_only=True)}
    except Exception as e:  # unpickling, zip and safetensors errors all mean the file is not a readable map
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if kind == "torch" and not (head.startswith(b"PK") or head[:1] == b"\x80"):
            first = "neither a safetensors file nor a torch save (zip or pickle)"
        raise FrspecError(
            f"cannot read token map {path} (read as a {kind} file): not a token-map file or corrupt ({first[:160]})"
        ) from e


def _detect(content: dict[str, Any], path: Path) -> str:
    if content["kind"] == "safetensors":
        meta, keys = content["metadata"], content["keys"]
        if FRSPEC_METADATA_KEY in meta:
            return "frspec"
        if COUNTS_METADATA_KEY in meta:
            raise FrspecError(f"{path} is a token-counts file, not a map; make a map with `frspec vocab build`")
        if {"d2t", "t2d"} <= keys:
            return "eagle3"
        raise FrspecError(f"{path}: safetensors file holds no token map (no frspec metadata, no d2t/t2d)")
    value = content["value"]
    if isinstance(value, dict) and {"d2t", "t2d"} <= set(value):
        return "eagle3"
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return "thunlp"
    if isinstance(value, torch.Tensor) and value.dim() == 1:
        if value.dtype.is_floating_point:
            return "vllm-scores"
        if value.dtype != torch.bool:
            return "thunlp"  # some tools save the thunlp list as a tensor
    raise FrspecError(
        f"{path}: unrecognized token-map content (read as a torch file holding a {type(value).__name__}; "
        f"expected a list of ids (thunlp), a float score tensor (vllm-scores) or a d2t/t2d dict (eagle3))"
    )


def _read_thunlp(content: dict[str, Any], path: Path, threshold: float) -> dict[str, Any]:
    ids = torch.as_tensor(content["value"], dtype=torch.long)
    if ids.numel() == 0:
        raise FrspecError(f"{path}: token map is empty")
    if int(ids.min()) < 0:
        raise FrspecError(f"{path}: token map id {int(ids.min())} is negative")
    return {"ids": ids, "vocab_size": int(ids.max()) + 1}


def _read_vllm_scores(content: dict[str, Any], path: Path, threshold: float) -> dict[str, Any]:
    scores = content["value"].to(torch.float64)
    if not bool(torch.isfinite(scores).all()) or bool((scores < 0).any()):
        raise FrspecError(f"{path}: vllm-scores must be finite and non-negative")
    kept = torch.nonzero(scores > threshold).flatten()
    if kept.numel() == 0:
        raise FrspecError(f"{path}: no token scores above the threshold {threshold}")
    ids = kept[torch.sort(scores[kept], descending=True, stable=True).indices]
    return {"ids": ids, "vocab_size": scores.numel(), "metadata": {"threshold": threshold}}


def _read_eagle3(content: dict[str, Any], path: Path, threshold: float) -> dict[str, Any]:
    tensors = content["tensors"] if content["kind"] == "safetensors" else content["value"]
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    if not isinstance(d2t, torch.Tensor) or not isinstance(t2d, torch.Tensor) or d2t.dim() != 1 or t2d.dim() != 1:
        raise FrspecError(f"{path}: eagle3 d2t and t2d must be 1-D tensors")
    if d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        raise FrspecError(f"{path}: eagle3 d2t must hold integers, got {d2t.dtype}")
    ids = torch.arange(d2t.numel()) + d2t.to(torch.long)
    t2d = t2d.to(torch.bool)
    in_range = ids.numel() == 0 or (int(ids.min()) >= 0 and int(ids.max()) < t2d.numel())
    if not in_range or int(t2d.sum()) != ids.numel() or not bool(t2d[ids].all()):
        raise FrspecError(f"{path}: eagle3 d2t and t2d disagree on which ids are kept")
    return {"ids": ids, "vocab_size": t2d.numel()}


def _read_frspec(content: dict[str, Any], path: Path, threshold: float) -> dict[str, Any]:
    try:
        meta = json.loads(content["metadata"][FRSPEC_METADATA_KEY])
        ids = content["tensors"]["ids"]
        vocab_size = int(meta["vocab_size"])
    except (KeyError, ValueError, TypeError) as e:
        raise FrspecError(f"{path}: corrupt frspec token map ({e})") from e
    meta.pop("version", None)
    return {"ids": ids, "vocab_size": vocab_size, "metadata": meta, "counts": content["tensors"].get("counts")}


# -- writing ---------------------------------------------------------------------------------------------------


def _write_thunlp(token_map: "TokenMap", tmp: Path) -> None:
    torch.save([int(i) for i in token_map.ids.tolist()], tmp)


def vllm_scores(token_map: "TokenMap") -> torch.Tensor:
    """The per-id score tensor written by the vllm-scores format (see the module docstring)."""
    scores = torch.zeros(token_map.vocab_size, dtype=torch.float64)
    counts = token_map.counts
    if counts is not None and int(counts.sum()) > 0:
        total = float(token_map.metadata.get("counted_tokens") or counts.sum())
        values = counts.to(torch.float64) / total
        floor = float(values[values > 0].min()) / 2
        scores[token_map.ids] = torch.where(values > 0, values, torch.full_like(values, floor))
    else:
        k = token_map.k
        scores[token_map.ids] = torch.arange(k, 0, -1, dtype=torch.float64) * (2.0 / (k * (k + 1)))
    return scores


def _write_vllm_scores(token_map: "TokenMap", tmp: Path) -> None:
    torch.save(vllm_scores(token_map), tmp)


def _write_eagle3(token_map: "TokenMap", tmp: Path) -> None:
    target_ids = torch.sort(token_map.ids).values
    d2t = target_ids - torch.arange(token_map.k)
    t2d = torch.zeros(token_map.vocab_size, dtype=torch.bool)
    t2d[target_ids] = True
    save_file({"d2t": d2t.contiguous(), "t2d": t2d}, str(tmp))


def _write_frspec(token_map: "TokenMap", tmp: Path) -> None:
    meta = {k: v for k, v in token_map.metadata.items() if k not in ("format", "vocab_size_known", "path")}
    meta.update({"version": FRSPEC_FORMAT_VERSION, "vocab_size": token_map.vocab_size, "k": token_map.k})
    tensors = {"ids": token_map.ids}
    if token_map.counts is not None:
        tensors["counts"] = token_map.counts
    save_file(tensors, str(tmp), metadata={FRSPEC_METADATA_KEY: json.dumps(meta)})


_READERS = {"frspec": _read_frspec, "thunlp": _read_thunlp, "vllm-scores": _read_vllm_scores, "eagle3": _read_eagle3}
_WRITERS = {
    "frspec": _write_frspec, "thunlp": _write_thunlp, "vllm-scores": _write_vllm_scores, "eagle3": _write_eagle3
}
