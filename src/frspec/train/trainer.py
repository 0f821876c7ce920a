"""Fitting an EAGLE-1/2 head to a target's collected features (the EAGLE recipe), with exact resume.

For a document x_0..x_{T-1} with target features f_0..f_{T-1}, head position t reads (x_{t+1}, f_t) and outputs
features g_t that should be the target's next feature f_{t+1}:

    loss = smooth_l1(g_t, f_{t+1}) + w_cls * CE(softmax(W f_{t+1}), softmax(W g_t))

W is the target's (frozen) LM head, optionally restricted to the `loss_vocab` most frequent ids of the training
data: the soft target is the target's own next-token distribution, which is what greedy verification accepts.
Uniform noise on the input features (as in EAGLE) makes the head robust to its own, imperfect features when it
drafts several steps ahead.

Every random choice (batch order, noise) is a function of (seed, epoch, step), and the checkpoint holds the head,
the optimizer and the step, so a resumed run continues exactly where an uninterrupted one would be.
"""

from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from frspec.errors import FrspecError
from frspec.io import atomic_path
from frspec.models.eagle import Eagle2Head
from frspec.train.dataset import FeatureDataset, epoch_batches, loss_vocab_ids
from frspec.train.head import trainable_state

# Settings a checkpoint must share with the run that resumes it (the batch plan and the schedule depend on them).
RESUME_KEYS = ("epochs", "lr", "batch_tokens", "loss_vocab", "seed", "eval_every", "warmup_steps", "w_cls", "noise")


@dataclass
class TrainConfig:
    epochs: int = 2
    lr: float = 5e-4
    batch_tokens: int = 8192
    loss_vocab: int | None = None  # None: the token loss over the whole vocabulary
    w_cls: float = 0.1  # EAGLE's weight of the token loss against the feature regression
    noise: float = 0.1  # half-width of the uniform noise added to input features
    warmup_steps: int = 20
    grad_clip: float = 0.5
    seed: int = 0
    eval_every: int = 50  # hold out every n-th document
    checkpoint_every: int = 25  # steps


@dataclass
class TrainState:
    step: int = 0
    history: list[dict] = field(default_factory=list)  # one entry per finished epoch
    # Per epoch: summed training loss (times positions) and positions, so a resumed epoch reports the same mean.
    loss_sums: dict[int, list[float]] = field(default_factory=dict)
    finished: bool = False  # every epoch trained and evaluated


def lr_at(step: int, total: int, config: TrainConfig) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, total - config.warmup_steps)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def predicted_mask(mask: torch.Tensor) -> torch.Tensor:
    """[T-1]: whether head position t's prediction (token x_{t+2}) is a training token; the last position predicts
    past the end of the document and keeps its own token's mask."""
    return torch.cat([mask[2:], mask[-1:]])


def _pair(doc, device):
    """Head inputs and targets for one document: tokens x_{1..T-1}, features f_{0..T-2} -> f_{1..T-1}, and the
    mask of positions whose predicted token (x_{t+2}) is a training token."""
    ids = doc.ids.to(device)
    f = doc.hidden.to(device=device, dtype=torch.float32)
    mask = doc.mask.to(device)
    return ids[1:], f[:-1], f[1:], predicted_mask(mask)


def document_loss(head: Eagle2Head, doc, lm_weight: torch.Tensor, config: TrainConfig,
                  generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Summed (regression, token) losses over the document's training positions, and their count."""
    device = lm_weight.device
    tokens, f_in, f_next, mask = _pair(doc, device)
    if generator is not None and config.noise > 0:
        noise = torch.rand(f_in.shape, generator=generator).to(device)
        f_in = f_in + (2 * noise - 1) * config.noise
    position_ids = torch.arange(tokens.numel(), device=device).unsqueeze(0)
    g = head(tokens.unsqueeze(0), f_in.unsqueeze(0), position_ids)[0]
    g, f_next = g[mask], f_next[mask]
    reg = F.smooth_l1_loss(g, f_next, reduction="none").mean(-1).sum()
    with torch.no_grad():
        target_probs = torch.softmax(f_next @ lm_weight.T, dim=-1)
    cls = -(target_probs * torch.log_softmax(g @ lm_weight.T, dim=-1)).sum()
    return reg, cls, int(mask.sum())


@torch.no_grad()
def evaluate(head: Eagle2Head, dataset: FeatureDataset, indices: list[int], loss_weight: torch.Tensor,
             full_weight: torch.Tensor, config: TrainConfig) -> dict:
    """Held-out loss and top-1 accuracy: how often the head's greedy token (over the full vocabulary) is the
    target's greedy token at the same position, i.e. the first draft token's acceptance rate under greedy."""
    head.eval()
    reg_sum = cls_sum = 0.0
    correct = count = 0
    for i in indices:
        doc = dataset.documents[i]
        reg, cls, n = document_loss(head, doc, loss_weight, config, None)
        reg_sum, cls_sum = reg_sum + float(reg), cls_sum + float(cls)
        tokens, f_in, f_next, mask = _pair(doc, full_weight.device)
        g = head(tokens.unsqueeze(0), f_in.unsqueeze(0), torch.arange(tokens.numel()).unsqueeze(0).to(tokens.device))[0]
        for a, b in zip(g[mask].split(256), f_next[mask].split(256)):  # chunks: full-vocabulary logits are large
            correct += int(((a @ full_weight.T).argmax(-1) == (b @ full_weight.T).argmax(-1)).sum())
        count += n
    head.train()
    if count == 0:
        return {}
    return {"eval_reg": reg_sum / count, "eval_cls": cls_sum / count, "eval_loss": (reg_sum + config.w_cls * cls_sum)
            / count, "eval_top1": correct / count, "eval_positions": count}


def train_head(
    head: Eagle2Head,
    dataset: FeatureDataset,
    config: TrainConfig,
    checkpoint_path: str | Path,
    resume: bool = False,
    stop_after_steps: int | None = None,
    log: Callable[[str], None] = functools.partial(print, flush=True),
) -> TrainState:
    """Train `head` in place on `dataset`; checkpoints to `checkpoint_path`. Returns the final state with the
    per-epoch history (train loss, held-out loss and top-1). `stop_after_steps` ends the run early (with a
    checkpoint) as an interruption would."""
    checkpoint_path = Path(checkpoint_path)
    device = head.fc.weight.device
    train_ids, eval_ids = dataset.split(config.eval_every)
    if not train_ids:
        raise FrspecError("no training documents: collect more data")
    lengths = [len(d.ids) for d in dataset.documents]
    plans = [epoch_batches(train_ids, lengths, config.batch_tokens, config.seed, e) for e in range(config.epochs)]
    total_steps = sum(len(p) for p in plans)

    full_weight = head.lm_head.weight.detach().to(torch.float32)
    always = sorted({int(i) for i in _special_ids(head)})
    vocab_ids = loss_vocab_ids(dataset.token_counts(train_ids), config.loss_vocab, always)
    loss_weight = full_weight if vocab_ids is None else full_weight[vocab_ids.to(device)]

    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
    state = TrainState()
    if resume and checkpoint_path.is_file():
        state = _load_checkpoint(checkpoint_path, head, optimizer, config)
        log(f"resumed from {checkpoint_path} at step {state.step}/{total_steps}")
    elif resume:
        log(f"no checkpoint at {checkpoint_path}; starting from scratch")

    head.train()
    step, window, started = 0, [], time.perf_counter()
    try:
        for epoch, plan in enumerate(plans):
            for batch in plan:
                if step < state.step:  # done before the interruption
                    step += 1
                    continue
                if stop_after_steps is not None and state.step >= stop_after_steps:
                    _save_checkpoint(checkpoint_path, head, optimizer, state, config)
                    return state
                for group in optimizer.param_groups:
                    group["lr"] = lr_at(step, total_steps, config)
                generator = torch.Generator().manual_seed(config.seed * 7_919 + step)
                docs = [dataset.documents[i] for i in batch]
                positions = max(1, sum(int(predicted_mask(d.mask).sum()) for d in docs))
                optimizer.zero_grad(set_to_none=True)
                reg_total = cls_total = 0.0
                for doc in docs:
                    reg, cls, _ = document_loss(head, doc, loss_weight, config, generator)
                    ((reg + config.w_cls * cls) / positions).backward()
                    reg_total, cls_total = reg_total + reg.item(), cls_total + cls.item()
                torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
                optimizer.step()
                step += 1
                state.step = step
                loss = (reg_total + config.w_cls * cls_total) / positions
                sums = state.loss_sums.setdefault(epoch, [0.0, 0.0])
                sums[0], sums[1] = sums[0] + loss * positions, sums[1] + positions
                window.append((loss, sum(len(d.ids) for d in docs)))
                if step % 10 == 0 or step == total_steps:
                    rate = sum(n for _, n in window) / (time.perf_counter() - started)
                    log(f"step {step}/{total_steps}  epoch {epoch + 1}  loss {sum(l for l, _ in window) / len(window):.4f}"
                        f"  lr {optimizer.param_groups[0]['lr']:.2e}  {rate:,.0f} tok/s")
                    window, started = [], time.perf_counter()
                if step % config.checkpoint_every == 0:
                    _save_checkpoint(checkpoint_path, head, optimizer, state, config)
            if len(state.history) <= epoch:  # not evaluated before an interruption
                loss_sum, count = state.loss_sums.get(epoch, [0.0, 0.0])
                entry = {"epoch": epoch + 1, "step": step, "train_loss": loss_sum / count if count else None}
                entry.update(evaluate(head, dataset, eval_ids, loss_weight, full_weight, config))
                state.history.append(entry)
                log(f"epoch {epoch + 1}/{config.epochs}: " + "  ".join(
                    f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in entry.items() if k != "epoch"))
                _save_checkpoint(checkpoint_path, head, optimizer, state, config)
    except KeyboardInterrupt:
        _save_checkpoint(checkpoint_path, head, optimizer, state, config)
        log(f"interrupted: checkpoint at step {state.step} saved to {checkpoint_path}; rerun with --resume")
        raise
    head.eval()
    state.finished = True
    return state


def _special_ids(head: Eagle2Head) -> list[int]:
    # The end-of-turn token must stay in a reduced loss vocabulary: drafting a turn's end is common and cheap.
    ids = getattr(head.config, "eos_token_id", None)
    if ids is None:
        return []
    return [ids] if isinstance(ids, int) else list(ids)


def _save_checkpoint(path: Path, head, optimizer, state: TrainState, config: TrainConfig) -> None:
    with atomic_path(path) as tmp:
        torch.save({"head": trainable_state(head), "optimizer": optimizer.state_dict(), "step": state.step,
                    "history": state.history, "loss_sums": state.loss_sums,
                    "config": asdict(config)}, tmp)


def _load_checkpoint(path: Path, head, optimizer, config: TrainConfig) -> TrainState:
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise FrspecError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from e
    differ = [k for k in RESUME_KEYS if saved["config"].get(k) != getattr(config, k)]
    if differ:
        raise FrspecError(f"checkpoint {path} was made with other settings ({', '.join(differ)}: "
                          f"{', '.join(str(saved['config'].get(k)) for k in differ)}); use the same or drop --resume")
    missing = head.load_state_dict(saved["head"], strict=False)
    if missing.unexpected_keys:
        raise FrspecError(f"checkpoint {path} does not match the head: {missing.unexpected_keys[:3]}")
    optimizer.load_state_dict(saved["optimizer"])
    return TrainState(step=int(saved["step"]), history=list(saved["history"]),
                      loss_sums={int(k): list(v) for k, v in saved.get("loss_sums", {}).items()})


def write_history(path: str | Path, state: TrainState, extra: dict | None = None) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps({**(extra or {}), "steps": state.step, "epochs": state.history}, indent=2) + "\n")
