"""The model cache: GGUF files dequantized once into ordinary Hugging Face directories (safetensors).

Dequantizing a GGUF takes tens of seconds; loading safetensors takes seconds. So each GGUF is converted once into
`<cache root>/models/<name>/` (config, generation config, weights, tokenizer) and loaded from there afterwards.

An entry is trusted only through its marker file, `frspec-cache.json`, written last: it lists every file with its
size and SHA-256 and says which source it was built from. An entry without a marker, with a missing file or with a
size mismatch is rebuilt, never used; `verify=True` also re-hashes the files. Entries are built in a temporary
directory and renamed into place, so an interrupted build leaves no half-entry under the real name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from frspec.errors import FrspecError
from frspec.paths import cache_dir as default_cache_root

MARKER = "frspec-cache.json"
FORMAT = 1
GGUF_MAGIC = b"GGUF"
# Hashing the ends of a file is enough to tell GGUFs apart (header+metadata at the start, last tensor at the end)
# and costs milliseconds instead of seconds for a multi-GB file.
IDENTITY_CHUNK = 1 << 20


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache root: `cache_dir` if given, else $FRSPEC_CACHE, else ~/.cache/frspec."""
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()


def models_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where converted models live inside the cache root."""
    return cache_root(cache_dir) / "models"


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def gguf_identity(path: str | os.PathLike) -> str:
    """A short key for a GGUF file's content: its size and a SHA-256 of its first and last MiB."""
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        digest.update(f.read(IDENTITY_CHUNK))
        f.seek(max(0, size - IDENTITY_CHUNK))
        digest.update(f.read(IDENTITY_CHUNK))
    return digest.hexdigest()[:16]


def read_marker(entry: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((entry / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("format") != FORMAT or not isinstance(marker.get("files"), dict):
        return None
    return marker


def is_valid_entry(entry: str | os.PathLike, verify: bool = False) -> bool:
    """Whether `entry` is a complete cache entry: marker present, every listed file there with its recorded size
    (and, with `verify`, its recorded SHA-256), and at least a config and one safetensors file."""
    entry = Path(entry)
    marker = read_marker(entry)
    if marker is None:
        return False
    files = marker["files"]
    if "config.json" not in files or not any(name.endswith(".safetensors") for name in files):
        return False
    for name, info in files.items():
        path = entry / name
        try:
            if path.stat().st_size != info["size"]:
                return False
        except (OSError, KeyError, TypeError):
            return False
        if verify and sha256_file(path) != info.get("sha256"):
            return False
        if name.endswith(".safetensors") and not _safetensors_header_ok(path):
            return False
    return True


def _safetensors_header_ok(path: Path) -> bool:
    """A cheap check that catches damage which keeps the file's size: the header must parse and its tensors must
    end exactly at the end of the file. (Flipped bytes inside tensor data need `verify`.)"""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 2 <= n <= (100 << 20):
                return False
            header = json.loads(f.read(n))
        ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
        return 8 + n + max(ends, default=0) == path.stat().st_size
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return False


def gguf_storage_dtype(gguf_path: Path) -> torch.dtype:
    """The dtype a GGUF's weights are kept in once dequantized.

    Float files keep their own precision. Quantized files become bf16: their values are approximations anyway,
    bf16 is what the models compute in on CPU, and it halves disk and load time against fp32.
    """
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFReader

    try:
        types = {tensor.tensor_type for tensor in GGUFReader(gguf_path).tensors}
    except Exception as e:  # the reader raises assorted errors on damaged files
        raise FrspecError(f"cannot read GGUF file {str(gguf_path)!r}: {e}") from e
    if not types <= {T.F32, T.F16, T.BF16}:
        return torch.bfloat16
    if T.BF16 in types:
        return torch.bfloat16
    # F32 norms sit beside the half-precision matrices in F16 files, so any F16 makes it an F16 model.
    return torch.float16 if T.F16 in types else torch.float32


def check_gguf_file(gguf_path: Path) -> None:
    if not gguf_path.is_file():
        raise FrspecError(f"GGUF file not found: {str(gguf_path)!r}")
    try:
        with open(gguf_path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise FrspecError(f"cannot read GGUF file {str(gguf_path)!r}: {e}") from e
    if magic != GGUF_MAGIC:
        raise FrspecError(f"{str(gguf_path)!r} is not a GGUF file (bad magic {magic!r})")


def dequantize_gguf(gguf_path: Path, dtype: torch.dtype):
    """Load a GGUF as a plain (dequantized) transformers model and its tokenizer. Takes tens of seconds for 1B+."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    directory, name = str(gguf_path.parent), gguf_path.name
    try:
        # dequantize=True: never keep packed GGUF blocks, even where a GGUF matmul kernel is installed.
        model = AutoModelForCausalLM.from_pretrained(
            directory, gguf_file=name, dtype=dtype, quantization_config=GgufConfig(dequantize=True)
        )
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    except Exception as e:  # whatever transformers trips over in a user's file (architecture, tokenizer, tensors)
        raise FrspecError(f"cannot convert GGUF file {str(gguf_path)!r}: {e}") from e
    return model, tokenizer


def build_entry(gguf_path: str | os.PathLike, entry: str | os.PathLike, source: dict[str, Any]) -> Path:
    """Dequantize `gguf_path` into the cache entry directory `entry`, atomically; return `entry`.

    `source` is recorded in the marker (what the entry was built from, e.g. the GGUF's identity or SHA-256).
    An existing entry at that path is replaced.
    """
    gguf_path, entry = Path(gguf_path), Path(entry)
    check_gguf_file(gguf_path)
    dtype = gguf_storage_dtype(gguf_path)
    model, tokenizer = dequantize_gguf(gguf_path, dtype)
    # A GGUF-loaded model still carries its quantizer; transformers refuses to save it (or would record a GGUF
    # quantization config) unless both are dropped. The weights themselves are already plain tensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = dtype

    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".tmp", dir=entry.parent))
    try:
        _make_readable(tmp)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        del model
        files = {
            str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted(tmp.rglob("*"))
            if p.is_file()
        }
        marker = {
            "format": FORMAT,
            "source": {"gguf": gguf_path.name, **source},
            "dtype": str(dtype).removeprefix("torch."),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "files": files,
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=1))
        for path in tmp.rglob("*"):
            _make_readable(path)
        _replace_dir(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return entry


def _make_readable(path: Path) -> None:
    """Give temp-created files and directories (mode 0600/0700) the permissions the umask would have given, so a
    shared cache stays readable by other users."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def _replace_dir(new: Path, dest: Path) -> None:
    """Move directory `new` to `dest`, discarding whatever (invalid) entry was at `dest`."""
    if dest.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".old", dir=dest.parent))
        os.replace(dest, trash / "entry")
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.replace(new, dest)
    except OSError:
        # Another process put a valid entry there in the meantime: theirs is as good as ours.
        if not is_valid_entry(dest):
            raise
        shutil.rmtree(new, ignore_errors=True)


def gguf_entry(gguf_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None, force: bool = False) -> Path:
    """The cache entry for a GGUF file, converting it first if it is missing, incomplete or `force`d."""
    gguf_path = Path(gguf_path).expanduser()
    check_gguf_file(gguf_path)
    identity = gguf_identity(gguf_path)
    entry = models_dir(cache_dir) / f"{gguf_path.stem}-{identity}"
    if force or not is_valid_entry(entry):
        build_entry(gguf_path, entry, {"identity": identity, "size": gguf_path.stat().st_size})
    return entry


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    valid: bool
    size_bytes: int
    source: dict[str, Any]
    dtype: str | None


def list_entries(cache_dir: str | os.PathLike | None = None) -> list[CacheEntry]:
    """Every model entry in the cache (temporary build directories excluded), valid or not."""
    root = models_dir(cache_dir)
    if not root.is_dir():
        return []
    entries = []
    for path in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        marker = read_marker(path) or {}
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        entries.append(CacheEntry(path, is_valid_entry(path), size, marker.get("source", {}), marker.get("dtype")))
    return entries
