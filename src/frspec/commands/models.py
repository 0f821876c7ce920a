"""`frspec models ...`: prepare the default models and show what the model cache holds."""

from __future__ import annotations

import argparse
import time

from frspec.commands.options import add_threads

# Heavy imports (torch, transformers) happen inside the handlers, so building the CLI parser stays fast.


def register(subparsers) -> None:
    parser = subparsers.add_parser("models", help="prepare the default models; list the model cache")
    sub = parser.add_subparsers(dest="models_command", metavar="ACTION")
    sub.required = True

    prepare = sub.add_parser(
        "prepare",
        help="assemble and convert the default target/draft GGUFs into the cache (once; ~1 minute each); "
             "--only eagle-head trains the default EAGLE head",
    )
    prepare.add_argument("--cache-dir", help="cache root (default: $FRSPEC_CACHE or ~/.cache/frspec)")
    prepare.add_argument("--only", choices=["target", "draft", "eagle-head"],
                         help="prepare just this; eagle-head trains the EAGLE head for the 0.5B model on ShareGPT "
                              "(docs/training.md: ~1.5 hours on a 2-core CPU, resumes if interrupted)")
    add_threads(prepare)  # used by the eagle-head step
    prepare.add_argument("--force", action="store_true", help="rebuild even when a valid cache entry exists")
    prepare.add_argument("--keep-gguf", action="store_true", help="keep the assembled GGUF (~1.6 GB) in the cache")
    prepare.set_defaults(func=run_prepare)

    listing = sub.add_parser("list", help="show the cached models, their sizes and paths")
    listing.add_argument("--cache-dir", help="cache root (default: $FRSPEC_CACHE or ~/.cache/frspec)")
    listing.set_defaults(func=run_list)


def run_prepare(args: argparse.Namespace) -> int:
    from frspec.models.defaults import default_model, prepare_default_models

    if args.only == "eagle-head":
        return _prepare_head(args)
    which = [args.only] if args.only else ["target", "draft"]
    for role in which:
        start = time.perf_counter()
        # One model at a time, and verify=True: an explicit prepare is the place to re-hash what is cached.
        path = prepare_default_models(
            cache_dir=args.cache_dir, which=[role], force=args.force, verify=True, keep_gguf=args.keep_gguf
        )[role]
        print(f"{role}: {default_model(role).name} ready in {time.perf_counter() - start:.1f}s at {path}")
    return 0


def _prepare_head(args: argparse.Namespace) -> int:
    from frspec.train.default_head import default_head_dir, is_head_ready, prepare_default_head

    start = time.perf_counter()
    ready = is_head_ready(default_head_dir(args.cache_dir)) and not args.force
    # Its target (the 0.5B default model) is prepared on first use like any default-model name.
    path = prepare_default_head(cache_dir=args.cache_dir, force=args.force, threads=args.threads)
    print(f"eagle-head: {'already trained' if ready else f'trained in {time.perf_counter() - start:.0f}s'} at {path}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    from frspec.models.cache import list_entries, models_dir
    from frspec.models.defaults import ROLES, default_model, is_prepared
    from frspec.train.default_head import default_head_dir, is_head_ready

    root = models_dir(args.cache_dir)
    entries = list_entries(args.cache_dir)
    if not entries:
        print(f"no cached models in {root}")
    for entry in entries:
        status = "ok" if entry.valid else "INCOMPLETE (rebuilt on next use)"
        origin = entry.source.get("default") or entry.source.get("gguf") or "?"
        print(f"{entry.path.name:40s} {entry.size_bytes / 1e9:7.2f} GB  {entry.dtype or '?':9s} {status:8s}  "
              f"from {origin}  {entry.path}")
    head = default_head_dir(args.cache_dir)
    head_ready = is_head_ready(head)
    if head_ready:
        size = sum(f.stat().st_size for f in head.iterdir() if f.is_file())
        print(f"{head.name:40s} {size / 1e9:7.2f} GB  EAGLE head ok        {head}")
    missing = [default_model(role) for role in ROLES if not is_prepared(default_model(role), args.cache_dir)]
    if not head_ready:
        print(f"default EAGLE head {head.name} not trained: run `frspec models prepare --only eagle-head`")
    for model in missing:
        print(f"default {model.role} {model.name} not prepared: run `frspec models prepare --only {model.role}`")
    return 0
