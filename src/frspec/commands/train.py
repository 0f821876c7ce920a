"""`frspec train eagle`: train an EAGLE-1/2 draft head for any target on chat or text data.

Heavy imports (torch, transformers) happen inside the handler so `frspec --help` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from frspec.commands.options import add_device, add_dtype, add_seed, add_threads
from frspec.errors import FrspecError


def register(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser("train", help="train draft heads", description="Train draft heads for a target.")
    sub = train.add_subparsers(dest="train_command", metavar="SUBCOMMAND")
    sub.required = True
    p = sub.add_parser("eagle", help="train an EAGLE-1/2 head for a target", description=_eagle.__doc__)
    p.add_argument("--target", required=True, help="target model: default-model name, hub id, HF directory or .gguf")
    p.add_argument("--data", required=True, nargs="+", action="extend", metavar="PATH",
                   help="files, directories or globs as for `frspec vocab count` (.txt, .jsonl, .json, chats)")
    p.add_argument("--field", help="JSON field to train on (default: detect conversations / messages / text)")
    p.add_argument("--assistant-only", action="store_true",
                   help="train only on assistant turns (the whole chat is still the target's context)")
    p.add_argument("--out", required=True, help="head directory to write (config.json + model.safetensors)")
    p.add_argument("--work", help="features, checkpoint and log directory (default: OUT/train)")
    p.add_argument("--regenerate", action="store_true",
                   help="train on the target's own greedy replies to each chat's first user turn instead of the "
                   "data's replies (self-distillation; decoded in batches, features kept on the way)")
    p.add_argument("--regenerate-max-new-tokens", type=int, default=256, metavar="N",
                   help="longest regenerated reply (default 256)")
    p.add_argument("--regenerate-batch", type=int, default=16, metavar="N",
                   help="replies decoded together (default 16)")
    p.add_argument("--max-tokens", type=int, help="collect features for at most about N tokens")
    p.add_argument("--max-seq-len", type=int, default=1024, help="cut documents to this many tokens (default 1024)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=5e-4, help="peak learning rate (AdamW, warmup then cosine)")
    p.add_argument("--batch-tokens", type=int, default=8192, help="tokens per optimizer step (default 8192)")
    p.add_argument("--loss-vocab", type=int, metavar="K",
                   help="compute the token loss over the K most frequent training ids only (cheaper on CPU)")
    p.add_argument("--token-loss-weight", type=float, default=0.1, metavar="W",
                   help="weight of the token cross-entropy against the feature regression (EAGLE: 0.1)")
    p.add_argument("--init-from", metavar="HEAD", help="start from this EAGLE-1/2 head's weights (continue or "
                   "fine-tune a head) instead of a random initialisation")
    p.add_argument("--intermediate-size", type=int, help="MLP width of the head (default: the target's)")
    p.add_argument("--unroll", type=int, default=1, metavar="D",
                   help="train draft depths 1..D: depth d > 1 reads the head's own depth d-1 output, as when "
                   "drafting a chain (training-time test, as in HASS and EAGLE-3; D times the cost). Default 1")
    p.add_argument("--eval-every", type=int, default=50, help="hold out every n-th document (default 50)")
    add_seed(p, "shuffling and initialisation seed")
    p.add_argument("--max-steps", type=int, help="stop (with a checkpoint) after this many steps")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in the work directory")
    add_device(p)
    add_dtype(p, auto="fp32 on CPU, bf16 on GPU", what="target dtype while collecting")
    p.add_argument("--save-dtype", default="bf16", help="dtype of the written head (default bf16)")
    add_threads(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_eagle)


def _check_args(args: argparse.Namespace) -> None:
    for name, low in (("epochs", 1), ("batch_tokens", 1), ("max_tokens", 1), ("max_seq_len", 3), ("loss_vocab", 1),
                      ("intermediate_size", 1), ("eval_every", 0), ("max_steps", 0),
                      ("regenerate_max_new_tokens", 1), ("regenerate_batch", 1), ("unroll", 1)):
        value = getattr(args, name)
        if value is not None and value < low:
            raise FrspecError(f"--{name.replace('_', '-')} must be at least {low}, got {value}")
    if not args.lr > 0:
        raise FrspecError(f"--lr must be positive, got {args.lr}")
    if not args.token_loss_weight >= 0:
        raise FrspecError(f"--token-loss-weight must not be negative, got {args.token_loss_weight}")
    out = Path(args.out).expanduser()
    if out.exists() and not out.is_dir():
        raise FrspecError(f"--out {args.out!r} is a file; expected a directory for the head")


def _eagle(args: argparse.Namespace) -> int:
    """Train an EAGLE-1/2 head for a target: collect the target's hidden states over the data into shards (chat
    template applied; --regenerate trains on the target's own replies instead), fit the head (feature
    regression plus token cross-entropy against the target's own distribution, as in EAGLE; --loss-vocab K
    restricts the token loss to the K most frequent ids), log loss and held-out top-1 accuracy per epoch, and
    write OUT/config.json + OUT/model.safetensors for `load_eagle_head`. Both steps resume after an interruption:
    features continue from the last shard, training from the last checkpoint with --resume."""
    import dataclasses

    from frspec.train.pipeline import EagleTraining, train_eagle

    _check_args(args)
    # The job's fields are the command's options of the same names.
    train_eagle(EagleTraining(**{f.name: getattr(args, f.name) for f in dataclasses.fields(EagleTraining)
                                 if hasattr(args, f.name)}))
    return 0
