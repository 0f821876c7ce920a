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
from transformers import DynamicCache

from frspec.errors import FrspecError
from frspec.io import atomic_path
from frspec.models.eagle import Eagle2Head
from frspec.models.attention import additive_mask
from frspec.train.dataset import FeatureDataset, epoch_batches, loss_vocab_ids
from frspec.train.head import trainable_state

# Settings a checkpoint must share with the run that resumes it (the batch plan and the schedule depend on them).
RESUME_KEYS = ("epochs", "lr", "batch_tokens", "loss_vocab", "seed", "eval_every", "warmup_steps", "w_cls", "noise",
               "unroll")


@dataclass
class TrainConfig:
    epochs: int = 2
    lr: float = 5e-4
    batch_tokens: int = 8192
    loss_vocab: int | None = None  # None: the token loss over the whole vocabulary
    w_cls: float = 0.1  # EAGLE's weight of the token loss against the feature regression
    noise: float = 0.1  # half-width of the uniform noise added to input features
    unroll: int = 1  # draft depths trained per position: d > 1 feeds the head its own features (training-time test)
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


def predicted_mask(mask: torch.Tensor, depth: int = 1) -> torch.Tensor:
    """[T-1]: whether the depth-`depth` draft rooted at head position t (it predicts token x_{t+depth+1}) is a
    training position. A draft that would read past the document is not; the last feature of the document predicts
    a token past its end and keeps that feature's own token's mask."""
    n = mask.numel() - 1
    index = torch.arange(n, device=mask.device) + depth + 1
    out = mask[index.clamp(max=n)]
    return out & (index - 1 <= n)


def _unrolled_mask(length: int, depth: int, device) -> torch.Tensor:
    """Attention of the depth-`depth` drafts over the cache [real inputs, depth-2 inputs, ..., these]: the draft
    rooted at t sees the real inputs up to t and its own chain's earlier drafts, exactly as when drafting."""
    t = torch.arange(length, device=device)
    blocks = [t[None, :] <= t[:, None]] + [torch.eye(length, dtype=torch.bool, device=device)] * (depth - 1)
    return additive_mask(torch.cat(blocks, dim=1), device=device)


def document_loss(head: Eagle2Head, doc, lm_weight: torch.Tensor, config: TrainConfig,
                  generator: torch.Generator | None, depths: int | None = None):
    """Per draft depth d = 1..depths: summed regression and token losses over the document's training positions,
    their count, and the head's features for depth d. Depth 1 reads the target's features (with noise when
    training); depth d > 1 reads the head's own depth d-1 output, as when drafting a chain (training-time test)."""
    device = lm_weight.device
    depths = config.unroll if depths is None else depths
    ids = doc.ids.to(device)
    f = doc.hidden.to(device=device, dtype=torch.float32)
    n = ids.numel() - 1
    f_in = f[:-1]
    if generator is not None and config.noise > 0:
        noise = torch.rand(f_in.shape, generator=generator).to(device)
        f_in = f_in + (2 * noise - 1) * config.noise
    cache = DynamicCache() if depths > 1 else None
    out = []
    g = f_in
    for d in range(1, depths + 1):
        # Draft depth d rooted at t reads (x_{t+d}, its parent's features) at position t+d-1 and should give f_{t+d}.
        src = torch.arange(n, device=device) + d
        tokens = ids[src.clamp(max=n)]
        target = f[src.clamp(max=n)]
        positions = (torch.arange(n, device=device) + d - 1).unsqueeze(0)
        attention = None if d == 1 else _unrolled_mask(n, d, device)
        g = head(tokens.unsqueeze(0), g.unsqueeze(0), positions, attention_mask=attention, cache=cache)[0]
        mask = predicted_mask(doc.mask.to(device), d)
        gm, tm = g[mask], target[mask]
        reg = F.smooth_l1_loss(gm, tm, reduction="none").mean(-1).sum()
        with torch.no_grad():
            target_probs = torch.softmax(tm @ lm_weight.T, dim=-1)
        cls = -(target_probs * torch.log_softmax(gm @ lm_weight.T, dim=-1)).sum()
        out.append((reg, cls, int(mask.sum()), g))
    return out


@torch.no_grad()
def evaluate(head: Eagle2Head, dataset: FeatureDataset, indices: list[int], loss_weight: torch.Tensor,
             full_weight: torch.Tensor, config: TrainConfig) -> dict:
    """Held-out loss (depth 1) and top-1 accuracy per draft depth: how often the head's greedy token (over the full
    vocabulary) is the target's greedy token, i.e. at depth 1 the first draft token's acceptance rate under greedy,
    at depth 2 the second's given a correct first."""
    head.eval()
    reg_sum = cls_sum = 0.0
    correct = [0, 0]
    counts = [0, 0]
    for i in indices:
        doc = dataset.documents[i]
        results = document_loss(head, doc, loss_weight, config, None, depths=2)
        reg_sum, cls_sum = reg_sum + float(results[0][0]), cls_sum + float(results[0][1])
        # The target's greedy token after each position, once: the depth-d draft rooted at t should give it at t+d.
        expected = _greedy(doc.hidden.to(device=full_weight.device, dtype=torch.float32), full_weight)
        n = expected.numel() - 1
        for d, (_, _, count, g) in enumerate(results, start=1):
            mask = predicted_mask(doc.mask.to(g.device), d)
            target = expected[(torch.arange(n, device=g.device) + d).clamp(max=n)][mask]
            correct[d - 1] += int((_greedy(g[mask], full_weight) == target).sum())
            counts[d - 1] += count
    head.train()
    if counts[0] == 0:
        return {}
    return {"eval_reg": reg_sum / counts[0], "eval_cls": cls_sum / counts[0],
            "eval_loss": (reg_sum + config.w_cls * cls_sum) / counts[0], "eval_top1": correct[0] / counts[0],
            "eval_top1_depth2": correct[1] / max(counts[1], 1), "eval_positions": counts[0]}


def _greedy(features: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Argmax over the full vocabulary of features [N, H], in chunks: full-vocabulary logits are large."""
    return torch.cat([(chunk @ weight.T).argmax(-1) for chunk in features.split(256)])


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
                    # Every draft depth weighs the same; the loss is per depth-1 position.
                    results = document_loss(head, doc, loss_weight, config, generator)
                    reg = sum(r for r, _, _, _ in results)
                    cls = sum(c for _, c, _, _ in results)
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
    defaults = TrainConfig()  # checkpoints from before a setting existed used its default
    differ = [k for k in RESUME_KEYS if saved["config"].get(k, getattr(defaults, k)) != getattr(config, k)]
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
