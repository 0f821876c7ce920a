"""The options of `frspec bench`, as `plan_bench` (bench/plan.py) takes them: each under its plan_bench name
(PLAN_OPTIONS), except --temperature/--top-k/--top-p/--seed (one SamplingParams), --no-progress and --config,
which commands/bench.py converts."""

from __future__ import annotations

import argparse

from frspec.bench.eagle_heads import DEFAULT_EAGLE_TARGET, DEFAULT_HEAD
from frspec.bench.plan import DEFAULT, ENGINES, QUICK
from frspec.bench.token_maps import MAP_SOURCES
from frspec.commands.config_option import add_config_option
from frspec.commands.options import (
    QUANT_CHOICES, add_device, add_dtype, add_quant_options, add_seed, add_threads, int_list,
)
from frspec.decode.tree_shape import SYNTAX, shapes_text

# Options passed to plan_bench under their own names.
PLAN_OPTIONS = (
    "quick", "target", "draft", "eagle", "mtp", "eagle_target", "dtype", "device", "quant", "draft_quant", "threads",
    "dataset", "mix", "field", "num_prompts", "max_new_tokens", "num_spec_tokens", "token_map_sizes",
    "draft_tree_shapes", "tree_shapes", "eagle_token_map_sizes", "context_rows", "context_budgets", "token_map",
    "counts", "token_map_source", "quant_rows", "quant_num_spec_tokens", "quant_token_map_sizes", "quant_draft_head",
    "no_llamacpp", "row_costs", "warmup_tokens", "engine", "batch_sizes", "repeats", "vllm_compiled", "vllm_full_row", "out",
    "auto", "ignore_eos",
)


def _k_list(text: str) -> tuple[int, ...] | str:
    return "auto" if text.strip().lower() == "auto" else int_list(text)


def add_bench_options(p: argparse.ArgumentParser) -> None:
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
                   help="prompts: mtbench (default, first turns), code, multilingual (Vim's translated messages "
                        "to continue, 8 languages), long-qa, long-qa-squad, long-qa-hotpotqa, sharegpt-multiturn, "
                        "mix:A,B,... (those interleaved in one run), or a JSONL file")
    p.add_argument("--mix", default=None, metavar="A,B,...",
                   help="interleave the prompts of several datasets in one run (as --dataset mix:A,B,...), e.g. "
                        "mtbench,code,multilingual: the workload one static map must serve all of")
    p.add_argument("--field", default="prompt", help="JSONL field holding the prompt (default: %(default)s)")
    p.add_argument("--num-prompts", type=int, default=None,
                   help=f"prompts, spread evenly over categories (quick {QUICK.num_prompts}, default {DEFAULT.num_prompts})")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"tokens per answer (quick {QUICK.max_new_tokens}, default {DEFAULT.max_new_tokens})")
    p.add_argument("--num-spec-tokens", type=int_list, default=None, metavar="K,K,...",
                   help="draft lengths, e.g. 1,3,5 (default 1,3,5; quick 3)")
    p.add_argument("--token-map-sizes", type=int_list, default=None, metavar="N,N,...",
                   help="FR-Spec map sizes, e.g. 8192,16384,32768,65536 (quick 8192,32768)")
    p.add_argument("--token-map", action="append", default=None, metavar="FILE",
                   help="use this saved token map (repeatable) instead of the default ShareGPT maps; its size "
                        "replaces --token-map-sizes and --eagle-token-map-sizes")
    p.add_argument("--draft-tree-shapes", default=None, metavar="SHAPES",
                   help=f"also draft these token trees with the draft model (and its maps): {SYNTAX}")
    p.add_argument("--eagle", default=None, metavar="HEAD",
                   help=f"add EAGLE rows: an EAGLE head directory or hub id, '{DEFAULT_HEAD}' for the head "
                        f"`frspec train eagle` wrote to the model cache for {DEFAULT_EAGLE_TARGET}, or 'mtp' for "
                        "the MTP layers the EAGLE target's checkpoint carries (default EAGLE target: --target)")
    p.add_argument("--mtp", action="store_true",
                   help="add rows drafted by the MTP layers the target checkpoint carries (DeepSeek-V3, GLM-4.5, "
                        "Qwen3-Next, Qwen3.5, MiMo layouts), labelled mtp / mtp+fr-spec: in the EAGLE rows' place, "
                        "so --tree-shapes, --eagle-token-map-sizes and --eagle-target (default: --target) apply")
    p.add_argument("--eagle-target", default=None, metavar="T",
                   help=f"the target the EAGLE head drafts for (default: {DEFAULT_EAGLE_TARGET}); its own vanilla "
                        "row is the EAGLE rows' reference, and it shares one table with --target if they are the same")
    p.add_argument("--tree-shapes", default=None, metavar="SHAPES",
                   help=f"EAGLE draft shapes: {SYNTAX} (quick {shapes_text(QUICK.eagle_tree_shapes)}; default "
                        f"{shapes_text(DEFAULT.eagle_tree_shapes)})")
    p.add_argument("--eagle-token-map-sizes", type=int_list, default=None, metavar="N,N,...",
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
    p.add_argument("--quant-token-map-sizes", type=int_list, default=None, metavar="N,N,...",
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
    p.add_argument("--context-rows", type=int_list, default=None, metavar="N,N,...",
                   help="after each FR-Spec row, the same map drafting context-aware with up to N rows for the "
                        "request's prompt and accepted tokens (rows labelled '+ctx=N BUDGET')")
    p.add_argument("--context-budgets", default="fixed", metavar="B,B",
                   help="budgets of the context-aware rows: fixed (N of the map's k rows) and/or additive (k + N "
                        "rows) (default: %(default)s)")
    p.add_argument("--no-auto", dest="auto", action="store_false",
                   help="leave out the auto rows (by default, with token maps, each drafter gets a row whose map "
                        "size, and for a draft model's chain whose length, the per-request controller chooses per "
                        "step from one frequency-ranked head; with --engine vllm: the draft model's map size per "
                        "batch step, vLLM's length fixed)")
    add_dtype(p)
    add_device(p)
    add_quant_options(p)
    add_threads(p)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=int, default=0, help="top-k filter when sampling (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p filter when sampling (1.0 = off)")
    add_seed(p, "sampling seed; prompt i uses seed + i for every method")
    p.add_argument("--ignore-eos", action="store_true",
                   help="every answer runs to --max-new-tokens, EOS or not (sampled rows then compare answers of one "
                        "length)")
    p.add_argument("--warmup-tokens", type=int, default=8, help="tokens of each method's unmeasured warm-up (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--engine", choices=ENGINES, default="frspec",
                   help="frspec's own engine (default) or vLLM's CPU build with the frspec plugin (.venv-vllm)")
    p.add_argument("--batch-sizes", type=int_list, default=(1,), metavar="B,B,...",
                   help="--engine vllm: prompts decoded together, e.g. 1,4,16 (default: 1)")
    p.add_argument("--repeats", type=int, default=None, metavar="R",
                   help="rounds of all methods on each prompt; each method's run of median decode time is kept "
                        "(default: 1; --engine vllm: 2, medians shown)")
    p.add_argument("--vllm-compiled", action="store_true",
                   help="--engine vllm: vLLM's default compilation (torch.compile) instead of enforce_eager")
    p.add_argument("--vllm-full-row", action="store_true",
                   help="--engine vllm: each map row twice, V1's compact path and the full -inf row V2 drafts over")
    add_config_option(p, "a decode config (`frspec tune` writes one): its target, draft, dtype and quantization "
                         "unless given, and its configuration as a row (with the same drafter without a map); "
                         "without --num-spec-tokens / --token-map-sizes, only those rows and vanilla")
