"""One EAGLE training run from start to finish: collect features, fit the head, write it.

`frspec train eagle` and `frspec models prepare --only eagle-head` (the default head's recipe) both run this, so
there is one sequence of steps and one place that writes the head and its training metadata.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from frspec.errors import FrspecError


@dataclass
class EagleTraining:
    """Everything a run needs; the field names are `frspec train eagle`'s option names."""

    target: str
    data: list[str]
    out: str
    work: str | None = None
    field: str | None = None
    assistant_only: bool = False
    regenerate: bool = False
    regenerate_max_new_tokens: int = 256
    regenerate_batch: int = 16
    max_tokens: int | None = None
    max_seq_len: int = 1024
    epochs: int = 2
    lr: float = 5e-4
    batch_tokens: int = 8192
    loss_vocab: int | None = None
    token_loss_weight: float = 0.1
    unroll: int = 1
    init_from: str | None = None
    intermediate_size: int | None = None
    eval_every: int = 50
    seed: int = 0
    max_steps: int | None = None
    resume: bool = False
    device: str = "cpu"
    dtype: str = "auto"
    save_dtype: str = "bf16"
    threads: int | None = None
    no_progress: bool = False
    cache_dir: str | None = None  # frspec cache root for default-model names (default: $FRSPEC_CACHE)


def train_eagle(job: EagleTraining, log: Callable[[str], None] = print) -> Path | None:
    """Run `job`; returns the head directory, or None when it stopped early at `max_steps` (checkpoint kept)."""
    from frspec.models.loading import load_model, parse_device, parse_dtype, resolve_model_dir, set_threads
    from frspec.models.tokenizer import load_tokenizer
    from frspec.train.dataset import FeatureDataset
    from frspec.train.features import CollectOptions, collect_features
    from frspec.train.head import init_from, new_head, save_head
    from frspec.train.trainer import TrainConfig, train_head, write_history

    out = Path(job.out).expanduser()
    work = Path(job.work).expanduser() if job.work else out / "train"
    checkpoint = work / "checkpoint.pt"
    if checkpoint.exists() and not job.resume:
        raise FrspecError(f"a training checkpoint exists at {checkpoint}: pass --resume to continue it, or delete it")
    save_dtype = parse_dtype(job.save_dtype)
    if save_dtype is None:
        raise FrspecError("--save-dtype must be a concrete dtype such as bf16 or fp32")
    set_threads(job.threads)
    dtype = job.dtype
    if dtype == "auto":
        # On CPU the feature pass runs ~3x faster in fp32 than bf16 (measured on the 0.5B target, 2 cores).
        dtype = "fp32" if parse_device(job.device).type == "cpu" else "bf16"
    started = time.perf_counter()
    target = load_model(job.target, dtype=dtype, device=job.device, cache_dir=job.cache_dir)
    tokenizer = load_tokenizer(resolve_model_dir(job.target, cache_dir=job.cache_dir))

    options = CollectOptions(field=job.field, assistant_only=job.assistant_only, regenerate=job.regenerate,
                             regenerate_max_new_tokens=job.regenerate_max_new_tokens,
                             regenerate_batch=job.regenerate_batch, max_seq_len=job.max_seq_len,
                             max_tokens=job.max_tokens, progress=not job.no_progress)
    manifest = collect_features(target, tokenizer, job.data, work / "features", str(job.target), options)
    log(f"features: {manifest['tokens']:,} tokens in {manifest['documents']:,} documents "
        f"({manifest['seconds']:.0f} s of target forwards, {manifest['tokens'] / max(manifest['seconds'], 1e-9):.0f}"
        f" tokens/s) in {work / 'features'}")

    dataset = FeatureDataset(work / "features")
    config = TrainConfig(epochs=job.epochs, lr=job.lr, batch_tokens=job.batch_tokens, loss_vocab=job.loss_vocab,
                         w_cls=job.token_loss_weight, seed=job.seed, eval_every=job.eval_every, unroll=job.unroll)
    head = new_head(target, job.intermediate_size, seed=job.seed)
    if job.init_from and not (job.resume and checkpoint.is_file()):
        init_from(head, job.init_from)
    train_started = time.perf_counter()
    state = train_head(head, dataset, config, checkpoint, resume=job.resume, stop_after_steps=job.max_steps, log=log)
    write_history(work / "log.json", state, {"target": str(job.target), "config": config.__dict__})
    if not state.finished:
        log(f"stopped at step {state.step} (--max-steps); checkpoint in {checkpoint}, continue with --resume")
        return None
    metadata = {"target": str(job.target), "data": [Path(p).name for p in manifest["inputs"]],
                "tokens": manifest["tokens"], "documents": manifest["documents"],
                "assistant_only": job.assistant_only, "regenerate": job.regenerate, "steps": state.step,
                "init_from": job.init_from,
                **{k: getattr(config, k) for k in ("epochs", "lr", "batch_tokens", "loss_vocab", "w_cls", "unroll")},
                "feature_seconds": manifest["seconds"], "train_seconds": round(time.perf_counter() - train_started, 1),
                "final": state.history[-1]}
    save_head(head, out, dtype=save_dtype, metadata=metadata)
    size = (out / "model.safetensors").stat().st_size
    final = state.history[-1]
    top1 = f", held-out top-1 {100 * final['eval_top1']:.1f}%" if "eval_top1" in final else ""
    log(f"trained {state.step} steps in {time.perf_counter() - train_started:.0f} s{top1}; total "
        f"{time.perf_counter() - started:.0f} s")
    log(f"wrote {out} ({size / 1e6:.1f} MB, {str(save_dtype).removeprefix('torch.')})")
    return out
