"""`frspec tune`: pick the token map size and draft shape for this machine and these models, from measurements.

    frspec tune --quick                                  # ~5 minutes on a 2-core CPU with the default pair
    frspec tune --dataset code --out frspec-tune.json --report tune-out
    frspec tune --target DIR --mtp                       # the target checkpoint's own MTP layers as the drafter
    frspec generate --config frspec-tune.json --prompt "..."
    frspec bench --config frspec-tune.json --quick

It measures on a few prompts of --dataset (the target's forward cost against rows, the draft's forward and LM-head
cost against map size, the rank of the target's tokens among the draft's choices per map), predicts decode
throughput for no map and each map x chain lengths 1..5 x small static trees, confirms the best few with a short
interleaved bench (bench/runner.py, greedy outputs checked against vanilla) and writes the measured best as a
config file (decode/decode_config.py) that `generate`, `bench` and the vLLM plugin (FRSPEC_CONFIG) read.
Greedy decoding only: acceptance is measured against the target's greedy tokens.

With --mtp (or, without --draft, when the target checkpoint carries MTP layers) the drafter is the target's own
MTP layers (models/mtp.py): acceptance per draft depth from the MTP head over the target's hidden states
(tune/mtp_measure.py), the MTP layer's forward cost and the shared head's per map, and the config says "mtp": true.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frspec.commands.options import (
    add_device, add_dtype, add_quant_options, add_threads, draft_quant, int_list, target_quant,
)
from frspec.decode.decode_config import CONTEXT_BUDGETS
from frspec.errors import FrspecError

DEFAULT_MAP_SIZES = (8192, 16384, 32768, 65536)


@dataclass(frozen=True)
class Preset:
    num_prompts: int
    max_new_tokens: int
    confirm_prompts: int
    confirm_tokens: int


# --quick: ~5 minutes on the 2-core CPU with the default bf16 pair (about 1 minute of greedy reference outputs,
# 1 of cost curves and ranks, 2-3 of the confirming bench: vanilla and four configurations x 3 prompts x 48 tokens).
QUICK = Preset(num_prompts=4, max_new_tokens=48, confirm_prompts=3, confirm_tokens=48)
DEFAULT = Preset(num_prompts=8, max_new_tokens=128, confirm_prompts=5, confirm_tokens=96)


def register(subparsers) -> None:
    p = subparsers.add_parser("tune", help="measure and pick the token map size and draft shape; write a config",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"small calibration: {QUICK.num_prompts} prompts x {QUICK.max_new_tokens} tokens, confirmed "
                        f"on {QUICK.confirm_prompts} x {QUICK.confirm_tokens} (explicit options still override)")
    p.add_argument("--target", default=None, help="target model (default: qwen2.5-coder-1.5b-instruct)")
    p.add_argument("--draft", default=None, help="draft model (default: qwen2.5-coder-0.5b-instruct, or the "
                   "target's MTP layers when its checkpoint carries them)")
    p.add_argument("--mtp", action="store_true",
                   help="tune drafting with the MTP layers the --target checkpoint carries (DeepSeek-V3, GLM-4.5, "
                        "Qwen3-Next/3.5, MiMo layouts, detected from its weights; a local directory)")
    p.add_argument("--dataset", default=None, help="calibration prompts, as `frspec bench --dataset` (default: mtbench)")
    p.add_argument("--field", default="prompt", help="JSONL field holding the prompt (default: %(default)s)")
    p.add_argument("--num-prompts", type=int, default=None,
                   help=f"calibration prompts (quick {QUICK.num_prompts}, default {DEFAULT.num_prompts})")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"target tokens per calibration prompt (quick {QUICK.max_new_tokens}, default "
                        f"{DEFAULT.max_new_tokens})")
    p.add_argument("--confirm-prompts", type=int, default=None,
                   help=f"prompts of the confirming bench, the first calibration prompts (quick "
                        f"{QUICK.confirm_prompts}, default {DEFAULT.confirm_prompts})")
    p.add_argument("--confirm-tokens", type=int, default=None,
                   help=f"tokens per prompt in the confirming bench (quick {QUICK.confirm_tokens}, default "
                        f"{DEFAULT.confirm_tokens})")
    p.add_argument("--top", type=int, default=3,
                   help="predicted-best configurations to confirm, besides the best without a map (default: 3)")
    p.add_argument("--token-map-sizes", type=int_list, default=DEFAULT_MAP_SIZES, metavar="N,N,...",
                   help="map sizes to try besides no map (default: %(default)s; default ShareGPT maps as in bench)")
    p.add_argument("--token-map", action="append", default=None, metavar="FILE",
                   help="try these saved maps (repeatable) instead of the default ShareGPT maps")
    p.add_argument("--counts", default=None, metavar="FILE", help="build the maps from this token-counts file")
    p.add_argument("--out", default="frspec-tune.json", help="the config file to write (default: %(default)s); "
                   "the picked map is saved beside it")
    p.add_argument("--report", default=None, metavar="DIR",
                   help="also write tune.md (tables) and tune.json (every measurement and prediction) here")
    p.add_argument("--context-rows", type=int, default=None, metavar="N",
                   help="recorded in the config for the drafter (context-aware rows); not measured by the tuner")
    p.add_argument("--context-budget", default=None, choices=CONTEXT_BUDGETS, help="recorded in the config too")
    add_dtype(p)
    add_device(p)
    add_quant_options(p)
    add_threads(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run_tune)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    preset = QUICK if args.quick else DEFAULT
    s = {name: getattr(args, name) if getattr(args, name) is not None else getattr(preset, name)
         for name in ("num_prompts", "max_new_tokens", "confirm_prompts", "confirm_tokens")}
    for name, value in s.items():
        if value < 1:
            raise FrspecError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.confirm_prompts is None:
        s["confirm_prompts"] = min(s["confirm_prompts"], s["num_prompts"])
    elif s["confirm_prompts"] > s["num_prompts"]:
        raise FrspecError("--confirm-prompts cannot exceed --num-prompts (they are the first calibration prompts)")
    if args.top < 1:
        raise FrspecError(f"--top must be >= 1, got {args.top}")
    if args.draft is not None and args.draft.lower() == "none":
        raise FrspecError("frspec tune picks a drafting configuration: it needs a --draft model (or --mtp)")
    if args.mtp and args.draft is not None:
        raise FrspecError("--mtp tunes the target's own MTP layers: give it without --draft")
    if args.token_map and args.counts:
        raise FrspecError("use either --token-map files or --counts, not both")
    if any(k < 1 for k in args.token_map_sizes) or len(set(args.token_map_sizes)) != len(args.token_map_sizes):
        raise FrspecError(f"--token-map-sizes must be distinct positive sizes, got {list(args.token_map_sizes)}")
    if args.context_rows is not None and args.context_rows < 0:
        raise FrspecError(f"--context-rows must be >= 0, got {args.context_rows}")
    out = Path(args.out)
    if out.exists() and out.is_dir():
        raise FrspecError(f"--out {out} is a directory; give the config file's path")
    return s


def _write_config(args, result, token_maps, target_spec: str, draft_spec: str, dtype: str, meta: dict) -> Path:
    """The measured best as a config file; its map (if any) saved beside it, referenced relative to it."""
    from frspec.tune.search import comparison_rows
    from frspec.decode.decode_config import DecodeConfig

    pick = result.pick
    out = Path(args.out)
    map_path = None
    if pick.map_size is not None:
        map_file = out.with_name(f"{out.stem}-map{pick.map_size}.safetensors")
        token_maps[pick.map_size].save(map_file)
        map_path = map_file.name
    row = next(r for r in comparison_rows(result) if r["picked"])
    best_no_map = max((c for c in result.confirmed if c.shape is not None and c.map_size is None),
                      key=lambda c: result.measured_tokens_per_s(c) or 0.0, default=None)
    mtp = draft_spec is None  # the target's own MTP layers
    config = DecodeConfig(
        target=target_spec, draft=draft_spec if pick.shape is not None else None, mtp=mtp and pick.shape is not None,
        dtype=dtype,
        quant=args.quant, draft_quant=args.draft_quant, token_map_size=pick.map_size, token_map_path=map_path,
        tree=None if pick.shape is None else str(pick.shape), context_rows=args.context_rows,
        context_budget=args.context_budget,
        # The measured costs, so that `generate --config` with an automatic length or map size (the per-request
        # controller) decides from this machine's numbers without measuring again.
        costs=_costs_record(result, token_maps),
        predicted={"tokens_per_s": row["predicted_tokens_per_s"], "tokens_per_step": row["predicted_tokens_per_step"],
                   "rank": row["predicted_rank"], "best": result.ranked[0].candidate.label},
        measured={"tokens_per_s": row["measured_tokens_per_s"], "tokens_per_step": row["measured_tokens_per_step"],
                  "speedup_vs_vanilla": row["measured_speedup_vs_vanilla"],
                  "speedup_vs_best_no_map": (row["measured_tokens_per_s"] / result.measured_tokens_per_s(best_no_map)
                                             if best_no_map and row["measured_tokens_per_s"] else None),
                  "confirmed": {r["config"]: r["measured_tokens_per_s"] for r in comparison_rows(result)}},
        provenance=meta,
    )
    return config.save(out)


def _costs_record(result, token_maps) -> dict:
    from frspec.tune.predict import step_costs

    costs = step_costs(result.measurements)
    costs.full_size = next((m.vocab_size for m in token_maps.values()), None)
    return costs.to_dict()


def _mtp_layout(target_dir, target):
    """The MTP layers the target checkpoint carries (from its tensor names, no weights read), or None."""
    from frspec.models.mtp import detect_mtp

    if not Path(target_dir).is_dir():
        return None
    return detect_mtp(target_dir, int(target.config.get_text_config(decoder=True).num_hidden_layers))


def _load_average() -> str:
    import os

    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def run_tune(args: argparse.Namespace) -> int:
    from frspec.bench.datasets import encode_prompt, select_prompts
    from frspec.bench.environment import git_commit, machine_info
    from frspec.bench.token_maps import resolve_token_maps
    from frspec.tune.report import comparison_markdown, write_report
    from frspec.tune.search import TuneSettings, tune
    from frspec.models.defaults import ROLES
    from frspec.models.loading import (
        dtype_name,
        check_same_vocab, load_model, parse_device, parse_dtype, resolve_model_dir, set_threads,
    )
    from frspec.models.tokenizer import load_tokenizer
    from frspec.commands.options import draft_load_options

    s = _settings(args)
    parse_dtype(args.dtype)
    parse_device(args.device)
    threads = set_threads(args.threads)
    prompts = select_prompts(args.dataset, args.field, s["num_prompts"], exact=args.num_prompts is not None)
    s["confirm_prompts"] = min(s["confirm_prompts"], len(prompts))

    def say(message: str) -> None:
        print(f"frspec tune: {message}", file=sys.stderr, flush=True)

    start, load_before = time.perf_counter(), _load_average()
    commit = git_commit()  # now: the code this run imported, even if the checkout changes during the run
    target_spec = args.target or ROLES["target"]
    say(f"loading target {target_spec}")
    target_dir = resolve_model_dir(target_spec)
    tokenizer = load_tokenizer(target_dir)
    target = load_model(target_spec, dtype=args.dtype, device=args.device, quant=target_quant(args))
    layout = _mtp_layout(target_dir, target)
    mtp = args.mtp or (args.draft is None and layout is not None)
    if args.mtp and layout is None:
        raise FrspecError(f"{target_spec!r} carries no MTP layers (no mtp.*, model.mtp_layers.* or extra layers): "
                          "--mtp needs a local checkpoint directory that has them")
    if mtp and not args.mtp:
        say(f"note: the target carries {layout.num_layers} MTP layer(s) ({layout.family} layout): tuning them as "
            "the drafter (give --draft to tune a draft model)")
    elif layout is not None:
        say(f"note: the target carries {layout.num_layers} MTP layer(s) ({layout.family} layout); --mtp (or no "
            "--draft) tunes them instead of the draft model")
    draft_spec = None if mtp else args.draft or ROLES["draft"]
    say(f"loading its {layout.family} MTP layers" if mtp else f"loading draft {draft_spec}")
    if mtp:
        from frspec.models.mtp import load_mtp_head
        from frspec.models.loading import vocab_size_of

        if args.draft_quant is not None:
            raise FrspecError("--draft-quant quantizes a draft model's head; the MTP layers share the target's")
        draft, head = None, load_mtp_head(target, target_dir)
        vocab_size = vocab_size_of(target)
    else:
        draft, head = load_model(draft_spec, dtype=args.dtype, device=args.device, **draft_load_options(args)), None
        vocab_size = check_same_vocab(target, draft)
    token_maps, maps_source = resolve_token_maps(
        tokenizer, vocab_size, args.token_map_sizes, token_map_files=args.token_map, counts_file=args.counts,
        progress=not args.no_progress,
    )
    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    confirmation = [(p.id, ids) for p, ids in zip(prompts, encoded)][: s["confirm_prompts"]]
    settings = TuneSettings(max_new_tokens=s["max_new_tokens"], confirm_tokens=s["confirm_tokens"], top=args.top)
    if draft_quant(args) is not None:
        say("note: LM-head costs are measured on the float head; the confirming bench quantizes it as bench does")
    result = tune(target, draft, tokenizer, encoded, confirmation, token_maps, settings, say,
                  progress=not args.no_progress, mtp=head)

    dtype = dtype_name(next(target.parameters()).dtype)
    meta = {
        "command": "frspec " + " ".join(sys.argv[1:]),
        "commit": commit,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "threads": threads,
        "target": target_spec,
        "draft": draft_spec if draft_spec is not None else f"mtp ({layout.family} layout, the target's own)",
        "dtype": dtype,
        "dataset": args.dataset or "mtbench",
        "prompt_ids": [p.id for p in prompts],
        "num_prompts": len(prompts),
        "max_new_tokens": s["max_new_tokens"],
        "confirm_prompts": len(confirmation),
        "confirm_tokens": s["confirm_tokens"],
        "token_maps_source": maps_source,
        "load_before": load_before,
        "load_after": _load_average(),
        "time_s": time.perf_counter() - start,
    }
    path = _write_config(args, result, token_maps, target_spec, draft_spec, dtype, meta)
    print(comparison_markdown(result))
    for note in result.notes:
        say(note)
    if args.report:
        write_report(result, meta, Path(args.report))
    say(f"picked {result.pick.label}; wrote {path}" + (f" and {args.report}/tune.{{md,json}}" if args.report else ""))
    return 0
