"""`frspec generate`: generate from a target model, optionally sped up by a draft model, an EAGLE head or the
target checkpoint's own MTP layers, token trees, and an FR-Spec token map."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from frspec.commands.config_option import add_config_option, apply_drafting, apply_models, load_config
from frspec.commands.options import (
    add_device, add_dtype, add_quant_options, add_seed, add_threads, draft_load_options, draft_quant, target_quant,
)
from frspec.decode.decode_config import CONTEXT_BUDGETS
from frspec.errors import FrspecError
from frspec.io import read_text

DEFAULT_NUM_SPEC_TOKENS = 4


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text with vanilla, draft-model or FR-Spec speculative decoding",
        description="Lossless generation: the output is what the target alone would produce (greedy), or follows "
        "its distribution exactly (sampling). Text streams to stdout with a stats line on stderr, or --json prints "
        "one JSON object.",
    )
    p.add_argument("--target", help="target model: default-model name, HF directory, .gguf or hub id (or --config)")
    p.add_argument("--draft", help="draft model (same forms; must share the target's vocabulary)")
    p.add_argument("--eagle", metavar="HEAD", help="EAGLE-1/2 or EAGLE-3 head for the target (directory or hub id)")
    p.add_argument("--mtp", action="store_true",
                   help="draft with the MTP layers the --target checkpoint carries (DeepSeek-V3, GLM-4.5, "
                        "Qwen3-Next/3.5, MiMo layouts, detected from its weights; a local directory)")
    p.add_argument("--token-map", metavar="FILE", help="FR-Spec token map restricting the draft's or head's LM head")
    p.add_argument("--context-rows", type=int, default=0, metavar="N",
                   help="context-aware drafting: up to N draft LM-head rows for the prompt's and the accepted "
                        "tokens besides the --token-map's (default: 0, the static map)")
    p.add_argument("--context-budget", default="fixed", choices=CONTEXT_BUDGETS,
                   help="fixed: the N rows replace the map's least frequent ones (k rows in all); additive: "
                        "k + N rows (default: %(default)s)")
    p.add_argument("--num-spec-tokens", default=None, metavar="K|auto",
                   help="drafted tokens per step, a chain; auto: chosen before every step by the per-request "
                        "controller (decode/controller.py) from this request's acceptance and this machine's "
                        "measured costs, 0 (plain decoding) where speculation does not pay; the costs are measured "
                        "once per machine and model pair (seconds) and cached. Default: auto. The tree options "
                        "replace it")
    p.add_argument("--token-map-size", default=None, metavar="N|auto",
                   help="how many of the --token-map's ids the drafter scores: N (the first N; the head's full size: "
                        "no map) or auto (chosen before every step among 4k..64k, the map's own size and no map, "
                        "from one frequency-ranked copy of the head). Default: auto with an automatic length, else "
                        "the map's own size")
    p.add_argument("--tree-depth", type=int, metavar="D", help="draft token trees D levels deep")
    p.add_argument("--tree-branching", type=int, metavar="B",
                   help="children per node of a static tree (default 1), or a dynamic tree's top-k per level")
    p.add_argument("--tree-budget", type=int, metavar="N",
                   help="EAGLE-2 dynamic tree keeping the N best drafted nodes (needs --tree-branching)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", metavar="FILE", help="read the prompt from FILE ('-' for stdin)")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="default: 128")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p filter when sampling (1.0 = off)")
    p.add_argument("--top-k", type=int, default=0, help="top-k filter when sampling (0 = off)")
    add_seed(p)
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--raw", action="store_true", help="use the prompt as is, without the chat template")
    add_dtype(p)
    add_device(p)
    add_quant_options(p)
    add_threads(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    add_config_option(p, "a decode config (`frspec tune` writes one): target, draft, token map, draft shape, dtype "
                         "and quantization for the options not given")
    p.set_defaults(func=run_generate)


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return args.prompt
    if args.prompt_file == "-":
        return sys.stdin.read()
    return read_text(args.prompt_file, "prompt file")


def _num_spec_tokens(args: argparse.Namespace) -> int | None:
    """--num-spec-tokens as a number, or None for "chosen per step" (auto, the default)."""
    value = args.num_spec_tokens
    if value is None or str(value).strip().lower() == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise FrspecError(f"--num-spec-tokens must be a number or auto, got {value!r}") from None


def _token_map_size(args: argparse.Namespace) -> int | str | None:
    """--token-map-size as a number, "auto", or None (not given)."""
    value = args.token_map_size
    if value is None:
        return None
    if str(value).strip().lower() == "auto":
        return "auto"
    try:
        size = int(value)
    except ValueError:
        raise FrspecError(f"--token-map-size must be a number or auto, got {value!r}") from None
    if size < 1:
        raise FrspecError(f"--token-map-size must be >= 1, got {size}")
    return size


def run_generate(args: argparse.Namespace) -> int:
    # Cheap checks first: nothing slow is loaded for a command that cannot run.
    from frspec.decode.factory import build_generator
    from frspec.decode.sampling import SamplingParams
    from frspec.decode.tree_shape import TreeShape

    config = load_config(args)
    apply_models(args, config)
    apply_drafting(args, config)
    if args.target is None:
        raise FrspecError("give --target (or --config FILE)")
    # No --num-spec-tokens (nor a config's shape): the controller chooses the length per step.
    if args.draft and args.eagle:
        raise FrspecError("give --draft or --eagle, not both")
    if args.mtp and (args.draft or args.eagle):
        raise FrspecError("--mtp drafts with the target's own MTP layers: give it without --draft or --eagle")
    drafting = bool(args.draft or args.eagle or args.mtp)
    if args.token_map and not drafting:
        raise FrspecError("--token-map restricts a draft model's LM head: give --draft (or --eagle, --mtp) too")
    num_spec_tokens = _num_spec_tokens(args)
    token_map_size = _token_map_size(args)
    if token_map_size is not None and not args.token_map:
        raise FrspecError("--token-map-size takes the first N ids of a token map: give --token-map too")
    chain = DEFAULT_NUM_SPEC_TOKENS if num_spec_tokens is None else num_spec_tokens
    tree = TreeShape.from_options(chain, args.tree_depth, args.tree_branching, args.tree_budget)
    if args.tree_depth is not None and not drafting:
        raise FrspecError("token trees are drafted by a drafter: give --draft or --eagle (or --mtp) too")
    eagle = None
    if args.eagle:
        from frspec.models.eagle_loading import resolve_head_dir

        eagle = resolve_head_dir(args.eagle)  # a missing head fails here, before any model is loaded
    if args.token_map and not Path(args.token_map).is_file():
        raise FrspecError(f"token map not found: {args.token_map}")
    if args.context_rows < 0:
        raise FrspecError(f"--context-rows must be >= 0, got {args.context_rows}")
    if args.context_rows and not args.token_map:
        raise FrspecError("--context-rows extends a token map: give --token-map (and --draft or --eagle) too")
    if args.max_new_tokens < 0:
        raise FrspecError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    prompt = _read_prompt(args)

    from frspec.models.loading import load_model, resolve_model_dir, set_threads, vocab_size_of
    from frspec.models.tokenizer import load_tokenizer
    from frspec.vocab.token_map import TokenMap

    set_threads(args.threads)
    # Default-model names and GGUF files resolve to cache directories that also hold the tokenizer.
    target_dir = resolve_model_dir(args.target)
    tokenizer = load_tokenizer(target_dir)
    # The specs themselves (not their cache directories) go to load_model, so a GGUF's blocks can be converted.
    target = load_model(args.target, dtype=args.dtype, device=args.device, quant=target_quant(args))
    draft = load_model(args.draft, dtype=args.dtype, device=args.device, **draft_load_options(args)) if args.draft else None
    token_map = TokenMap.load(args.token_map, vocab_size=vocab_size_of(target)) if args.token_map else None
    if not drafting and Path(target_dir).is_dir():
        from frspec.models.mtp import detect_mtp

        layout = detect_mtp(target_dir, int(target.config.get_text_config(decoder=True).num_hidden_layers))
        if layout is not None:  # detected, not switched on: without a drafter the command stays vanilla
            print(f"note: the target carries {layout.num_layers} MTP layer(s) ({layout.family} layout); "
                  "--mtp drafts with them", file=sys.stderr)
    if args.mtp:
        from frspec.models.mtp import load_mtp_head

        if not Path(target_dir).is_dir():
            raise FrspecError(f"--mtp reads the MTP layers from a local checkpoint directory, not {args.target!r}")
        eagle = load_mtp_head(target, target_dir)  # drafted by an MtpDrafter (build_generator)
    if token_map is None and drafting and num_spec_tokens is None and args.tree_depth is None \
            and not args.context_rows:
        # No map given: with counts shipped for this tokenizer, rank the drafter's head by them and let the
        # controller choose the size per step (no map included), as it chooses the length.
        from frspec.vocab.shipped import default_ranking
        from frspec.vocab.tokenizer_identity import tokenizer_identity

        token_map = default_ranking(tokenizer_identity(tokenizer), vocab_size_of(target))
        token_map_size = "auto" if token_map is not None else None
    # The one spelling below the command line: a TreeShape when --num-spec-tokens is a number or a tree's options
    # are given; None (auto): the controller chooses the length per step.
    drafted = tree if drafting and (num_spec_tokens is not None or args.tree_depth is not None) else None
    costs = None
    if config is not None and config.costs and drafting:
        from frspec.decode.step_costs import StepCosts

        costs = StepCosts.from_dict(config.costs, f"config file {args.config}: 'costs'")
    generator = build_generator(target, draft, token_map, tokenizer=tokenizer, eagle=eagle, tree=drafted,
                                context_rows=args.context_rows, context_budget=args.context_budget,
                                token_map_size=token_map_size, costs=costs, draft_head_quant=draft_quant(args))

    kwargs = dict(
        prompt=prompt,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        stop_strings=args.stop,
        apply_chat_template=not args.raw,
    )
    if args.json:
        out = generator.generate(**kwargs)
        record = {
            "method": generator.method,
            "token_ids": out.token_ids,
            "text": out.text,
            "finish_reason": out.finish_reason,
            "stats": out.stats.to_dict(),
        }
        if generator.controller is not None:  # what the per-request controller chose
            record["auto"] = {"map_sizes": list(generator.controller.sizes),
                              "draft_lengths": list(generator.controller.depths),
                              "costs_machine": generator.costs.provenance.get("machine"),
                              # which models (and weight formats) the costs were measured for, at which contexts
                              "costs_models": [generator.costs.provenance.get("target"),
                                               generator.costs.provenance.get("drafter")],
                              "costs_contexts": generator.costs.contexts}
        if args.context_rows:  # how many of the drafter's rows this request's own tokens took
            record["context"] = {"rows": args.context_rows, "budget": args.context_budget,
                                 "request_rows": generator.drafter.vocab.context_rows}
        print(json.dumps(record, ensure_ascii=False))
        return 0
    stream = generator.stream(**kwargs)
    for piece in stream:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    print(f"[{generator.method}] {stream.output.stats.summary()}", file=sys.stderr)
    return 0
