"""What one benchmark run does: a frozen, validated BenchPlan (models, prompts, methods, maps, quantization, engine,
batch sizes), built from the presets plus explicit values, as `frspec bench` takes them or from Python:

    plan = plan_bench(quick=True, target="qwen2.5-coder-1.5b-instruct", token_map_sizes=(32768,))
    run_plan(plan)                                            # bench/session.py: load, run, report

`plan_bench` takes each option under its `frspec bench` name (None: the preset's value) and checks every value and
combination before anything slow runs; its errors name the command-line options. Our engine and vLLM
(bench/vllm_runner.py) both run from the plan.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from frspec.bench.eagle_heads import DEFAULT_EAGLE_TARGET, MTP_HEAD
from frspec.bench.methods import EAGLE, MTP, Method, add_context_methods, plan_methods
from frspec.decode.decode_config import DecodeConfig
from frspec.decode.sampling import SamplingParams
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError
from frspec.models.defaults import ROLES
from frspec.models.quant import parse_quant

ENGINES = ("frspec", "vllm")


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
# once); after that the whole preset takes about 6-8 minutes. (scripts/quickstart.sh leaves those parts out unless
# --full.)
QUICK = Preset(num_prompts=3, max_new_tokens=48, num_spec_tokens=(3,), token_map_sizes=(8192, 32768),
               eagle_tree_shapes=(TreeShape.chain(4), TreeShape.dynamic(5, 4, 16)), eagle_token_map_sizes=(32768,),
               quant_rows=("int4",), llamacpp=True, row_cost_quants=("int8", "int4"))
# The default is the full grid of the FR-Spec paper's sizes: meant for a GPU, or an hour or more of CPU. Its
# largest EAGLE tree is EAGLE-2's default (depth 5, top-10, 60 nodes).
DEFAULT = Preset(num_prompts=16, max_new_tokens=256, num_spec_tokens=(1, 3, 5),
                 token_map_sizes=(8192, 16384, 32768, 65536),
                 eagle_tree_shapes=(TreeShape.chain(4), TreeShape.static(3, 2), TreeShape.dynamic(5, 10, 60)),
                 eagle_token_map_sizes=(8192, 16384, 32768, 65536), row_costs=0, row_cost_quants=())


@dataclass(frozen=True)
class BenchPlan:
    """One benchmark run, every value resolved (build it with `plan_bench`, which also checks it)."""

    # Models: specs as load_model takes them; draft None = vanilla only; eagle = the EAGLE head's spec.
    target: str
    draft: str | None
    eagle: str | None = None
    eagle_target_given: str | None = None  # --eagle-target as given (None: the default EAGLE target)
    # --mtp: the EAGLE rows draft with the target checkpoint's own MTP layers (eagle is then "mtp") and are
    # labelled mtp / mtp+fr-spec (`--eagle mtp` drafts the same, labelled eagle).
    mtp: bool = False
    dtype: str = "auto"
    device: str = "cpu"
    quant: str | None = None  # the target's weight quantization (int4, int8; None: --dtype)
    draft_quant: str | None = None  # the draft's (plan_bench: as the target's unless given)
    threads: int | None = None
    # Prompts: num_prompts spread evenly over categories; a preset's count is capped at what the dataset has, an
    # explicit one (exact_num_prompts) is an error when the dataset has fewer.
    dataset: str | None = None
    field: str = "prompt"
    num_prompts: int = 16
    exact_num_prompts: bool = False
    max_new_tokens: int = 256
    # Methods.
    num_spec_tokens: tuple[int, ...] = ()
    token_map_sizes: tuple[int, ...] = ()
    draft_tree_shapes: tuple[TreeShape, ...] = ()
    eagle_tree_shapes: tuple[TreeShape, ...] = ()
    eagle_token_map_sizes: tuple[int, ...] = ()
    context_rows: tuple[int, ...] = ()
    context_budgets: tuple[str, ...] = ("fixed",)
    # With maps: an `auto` row per drafter (the per-request controller chooses map size and, for a draft model's
    # chain, the draft length; frspec's engine only).
    auto: bool = True
    config: DecodeConfig | None = None  # adds its configuration as a row (and the same drafter without its map)
    config_path: str | None = None
    # Token maps: saved files (their sizes replace the planned sizes), a counts file, or the default maps' source.
    token_map_files: tuple[str, ...] = ()
    counts: str | None = None
    token_map_source: str = "sharegpt"
    # Quantized rows, the llama.cpp peer row, the cost curve.
    quant_rows: tuple[str, ...] = ()
    quant_num_spec_tokens: tuple[int, ...] | str = "auto"
    quant_token_map_sizes: tuple[int, ...] = ()
    quant_draft_head: str | None = None  # "int4", "int8", "none", or None: as the row
    llamacpp: bool = False
    row_costs: int = 0
    row_cost_quants: tuple[str, ...] = ()
    # Decoding and the run.
    sampling: SamplingParams = SamplingParams()
    # Every answer runs to max_new_tokens, EOS or not (as vLLM's --ignore-eos): sampled rows then compare answers
    # of one length, where their own EOS would end them anywhere from a dozen tokens to the cap.
    ignore_eos: bool = False
    warmup_tokens: int = 8
    engine: str = "frspec"
    batch_sizes: tuple[int, ...] = (1,)  # vLLM only
    repeats: int = 1  # rounds of all methods per prompt (frspec: each method's median run kept; vLLM: medians)
    vllm_compiled: bool = False  # vLLM only: its default compilation instead of enforce_eager
    vllm_full_row: bool = False  # vLLM only: each map row also through the full -inf row (FRSPEC_V1_COMPACT=0)
    progress: bool = True
    out: str = "bench-out"
    preset: str = "default"
    command: str = ""  # how the run was asked for, recorded in the report

    @property
    def eagle_target(self) -> str | None:
        """The model the EAGLE head drafts for (None without EAGLE rows)."""
        if not self.eagle:
            return None
        # `--eagle mtp` drafts with a checkpoint's own MTP layers: by default the main target's.
        return self.eagle_target_given or (self.target if self.eagle == "mtp" else DEFAULT_EAGLE_TARGET)

    @property
    def head_kind(self) -> str:
        """The kind of the EAGLE slot's rows: "mtp" with --mtp, else "eagle"."""
        return MTP if self.mtp else EAGLE

    @property
    def quant_draft_heads(self) -> dict[str, str | None]:
        """The quantized rows' drafter-head quantization where --quant-draft-head overrides the row's own."""
        if self.quant_draft_head is None:
            return {}
        return {q: parse_quant(self.quant_draft_head) for q in self.quant_rows}

    def prompts(self) -> list:
        """The benchmark's prompts (bench/datasets.py's Prompt), chosen as `select_prompts` does."""
        from frspec.bench.datasets import select_prompts

        return select_prompts(self.dataset, self.field, self.num_prompts, exact=self.exact_num_prompts)

    def methods(self) -> list[Method]:
        """The grid's methods as planned (before maps are known and config rows are added)."""
        return add_context_methods(
            plan_methods(self.num_spec_tokens, self.token_map_sizes, True, self.draft_tree_shapes,
                         self.eagle_tree_shapes, self.eagle_token_map_sizes, auto=self.auto,
                         head_kind=self.head_kind),
            self.context_rows, self.context_budgets)


def _quant_list(text: str) -> tuple[str, ...]:
    """--quant-rows: "int4", "int4,int8" or "none"."""
    if text.strip().lower() == "none":
        return ()
    values = tuple(parse_quant(v) for v in text.replace(" ", "").split(",") if v)
    if None in values or len(set(values)) != len(values):
        raise FrspecError(f"--quant-rows: expected int4, int8, both comma-separated, or none; got {text!r}")
    return values


def _vllm_eagle_shapes(tree_shapes: str | None, num_spec_tokens: Sequence[int]) -> tuple[TreeShape, ...]:
    """vLLM drafts chains: the EAGLE rows draft a chain of each --num-spec-tokens (or each chain --tree-shapes
    names); a tree shape is refused."""
    if tree_shapes is None:
        return tuple(TreeShape.chain(k) for k in num_spec_tokens)
    shapes = TreeShape.parse_list(tree_shapes)
    trees = [str(s) for s in shapes if s.kind != "chain"]
    if trees:
        raise FrspecError(f"--engine vllm drafts chains only (vLLM's CPU build has no tree attention); "
                          f"drop {', '.join(trees)} from --tree-shapes")
    return shapes


def plan_bench(
    *,
    quick: bool = False,
    target: str | None = None,
    draft: str | None = None,
    eagle: str | None = None,
    mtp: bool = False,
    eagle_target: str | None = None,
    dtype: str = "auto",
    device: str = "cpu",
    quant: str | None = None,
    draft_quant: str | None = None,
    threads: int | None = None,
    dataset: str | None = None,
    mix: str | None = None,
    field: str = "prompt",
    num_prompts: int | None = None,
    max_new_tokens: int | None = None,
    num_spec_tokens: Sequence[int] | None = None,
    token_map_sizes: Sequence[int] | None = None,
    draft_tree_shapes: str | None = None,
    tree_shapes: str | None = None,
    eagle_token_map_sizes: Sequence[int] | None = None,
    context_rows: Sequence[int] | None = None,
    context_budgets: str = "fixed",
    auto: bool = True,
    config: DecodeConfig | None = None,
    config_path: str | None = None,
    token_map: Sequence[str] | None = None,
    counts: str | None = None,
    token_map_source: str = "sharegpt",
    quant_rows: str | None = None,
    quant_num_spec_tokens: Sequence[int] | str = "auto",
    quant_token_map_sizes: Sequence[int] | None = None,
    quant_draft_head: str | None = None,
    no_llamacpp: bool = False,
    row_costs: int | None = None,
    sampling: SamplingParams = SamplingParams(),
    ignore_eos: bool = False,
    warmup_tokens: int = 8,
    engine: str = "frspec",
    batch_sizes: Sequence[int] = (1,),
    repeats: int | None = None,
    vllm_compiled: bool = False,
    vllm_full_row: bool = False,
    progress: bool = True,
    out: str = "bench-out",
    command: str = "",
    say=None,
) -> BenchPlan:
    """The preset's values (QUICK with quick, else DEFAULT) with the given ones on top, checked. With a config that
    drafts, the grid's draft lengths and map sizes are only the ones given explicitly (the config adds its own row).
    Tree shapes are given as text (decode/tree_shape.py's syntax); `mix` "A,B" is `dataset="mix:A,B"`; `say`
    receives notes (default: none)."""
    if mix is not None:
        if dataset is not None:
            raise FrspecError("give --dataset or --mix, not both")
        dataset = f"mix:{mix}"
    preset = QUICK if quick else DEFAULT
    quant = parse_quant(quant)
    draft_quant = parse_quant(draft_quant) if draft_quant is not None else quant  # default: as the target
    if config is not None and config.shape is not None:
        preset = dataclasses.replace(preset, num_spec_tokens=(), token_map_sizes=())
    on_cpu = str(device).startswith("cpu")
    # Quantized rows on CUDA only on request: int4 (tinygemm) is faster than bf16 at one row only, and int8 has no
    # CUDA kernel (dequantized per call, 8.5x bf16's time on an H200: docs/head-costs.md).
    if not on_cpu or quant is not None:  # --quant: the main rows are the quantized ones already
        preset = dataclasses.replace(preset, quant_rows=(), llamacpp=False, row_cost_quants=())

    def pick(value, default):
        return value if value is not None else default

    rows = _quant_list(quant_rows) if quant_rows is not None else preset.quant_rows
    num_spec = tuple(pick(num_spec_tokens, preset.num_spec_tokens))
    eagle_shapes: tuple[TreeShape, ...] = ()
    eagle_sizes: tuple[int, ...] = ()
    draft_shapes = (TreeShape.parse_list(draft_tree_shapes, "--draft-tree-shapes")
                    if draft_tree_shapes is not None else ())
    if config is not None and config.mtp and eagle is not None and eagle != MTP_HEAD:
        raise FrspecError("the config drafts with the target's own MTP layers: drop --eagle HEAD (or give --config "
                          "a config of that head)")
    if config is not None and config.mtp and config.shape is not None and eagle is None:
        mtp = True  # the config's rows are drafted by the target's MTP layers: only those unless a grid is given
        preset = dataclasses.replace(preset, eagle_tree_shapes=(), eagle_token_map_sizes=())
    if mtp:
        if eagle is not None:
            raise FrspecError("--mtp drafts in the EAGLE rows' place, with the target's own MTP layers: give --mtp or "
                              "--eagle HEAD, not both")
        eagle = MTP_HEAD
    if eagle == MTP_HEAD and engine == "vllm":
        raise FrspecError("MTP rows run on frspec's own engine (--engine vllm benchmarks draft models and EAGLE heads)")
    if eagle is not None:
        if engine == "vllm":
            eagle_shapes = _vllm_eagle_shapes(tree_shapes, num_spec)
        else:
            eagle_shapes = TreeShape.parse_list(tree_shapes) if tree_shapes is not None else preset.eagle_tree_shapes
        eagle_sizes = tuple(pick(eagle_token_map_sizes, preset.eagle_token_map_sizes))
    else:
        for option, value in (("--eagle-target", eagle_target), ("--tree-shapes", tree_shapes),
                              ("--eagle-token-map-sizes", eagle_token_map_sizes)):
            if value is not None:
                raise FrspecError(f"{option} configures the EAGLE rows: give --eagle HEAD too (or --mtp)")
    if rows and quant is not None:
        raise FrspecError("--quant already quantizes every row: drop --quant-rows")
    n_row_costs = pick(row_costs, preset.row_costs)
    if n_row_costs < 0:
        raise FrspecError(f"--row-costs must be >= 0, got {n_row_costs}")
    if rows and not on_cpu and say is not None:
        say(f"note: quantized rows on {device}: int4 runs tinygemm (faster than bf16 at one row only); int8 has no "
            "CUDA kernel and is dequantized per call (slower than bf16)")
    if token_map and counts:
        raise FrspecError("use either --token-map files or --counts, not both")
    if token_map and token_map_sizes is not None:
        raise FrspecError("--token-map files set the map sizes themselves; drop --token-map-sizes")
    if token_map and eagle_token_map_sizes is not None:
        raise FrspecError("--token-map files set the map sizes themselves; drop --eagle-token-map-sizes")
    if (token_map or counts) and token_map_source != "sharegpt":
        raise FrspecError("--token-map-source picks the default maps' counts; drop it with --token-map or --counts")
    if ignore_eos and engine != "frspec":
        raise FrspecError("--ignore-eos runs on frspec's own engine; drop it with --engine vllm")
    if context_rows and engine != "frspec":
        raise FrspecError("--context-rows runs on frspec's own engine (the vLLM plugin has no context rows yet)")
    plan = BenchPlan(
        target=target or ROLES["target"],
        draft=None if draft is not None and draft.lower() == "none" else draft or ROLES["draft"],
        eagle=eagle, eagle_target_given=eagle_target, mtp=mtp, dtype=dtype, device=device, quant=quant,
        draft_quant=draft_quant, threads=threads,
        dataset=dataset, field=field, num_prompts=pick(num_prompts, preset.num_prompts),
        exact_num_prompts=num_prompts is not None, max_new_tokens=pick(max_new_tokens, preset.max_new_tokens),
        num_spec_tokens=num_spec, token_map_sizes=tuple(pick(token_map_sizes, preset.token_map_sizes)),
        draft_tree_shapes=tuple(draft_shapes), eagle_tree_shapes=tuple(eagle_shapes),
        eagle_token_map_sizes=eagle_sizes, context_rows=tuple(context_rows or ()),
        context_budgets=tuple(b for b in context_budgets.replace(" ", "").split(",") if b),
        auto=auto,
        config=config, config_path=config_path,
        token_map_files=tuple(token_map or ()), counts=counts, token_map_source=token_map_source,
        quant_rows=rows,
        quant_num_spec_tokens=(quant_num_spec_tokens if quant_num_spec_tokens == "auto"
                               else tuple(quant_num_spec_tokens)),
        # Explicit --token-map-sizes serve the quantized rows too unless they have their own.
        quant_token_map_sizes=tuple(pick(quant_token_map_sizes, pick(token_map_sizes, preset.quant_token_map_sizes))),
        quant_draft_head=quant_draft_head,
        llamacpp=(preset.llamacpp or (on_cpu and bool(rows))) and not no_llamacpp,
        row_costs=n_row_costs, row_cost_quants=preset.row_cost_quants,
        sampling=sampling, ignore_eos=ignore_eos, warmup_tokens=warmup_tokens, engine=engine,
        batch_sizes=tuple(batch_sizes),
        repeats=(2 if engine == "vllm" else 1) if repeats is None else repeats, vllm_compiled=vllm_compiled, vllm_full_row=vllm_full_row, progress=progress, out=str(out), preset="quick" if quick else "default", command=command,
    )
    _check(plan)
    return plan


def _check(plan: BenchPlan) -> None:
    """Value checks that need no knowledge of what was given explicitly; the method lists validate themselves."""
    if plan.max_new_tokens < 1:
        raise FrspecError(f"--max-new-tokens must be >= 1, got {plan.max_new_tokens}")
    if plan.warmup_tokens < 1:
        raise FrspecError(f"--warmup-tokens must be >= 1, got {plan.warmup_tokens}")
    if isinstance(plan.repeats, bool) or not isinstance(plan.repeats, int) or plan.repeats < 1:
        raise FrspecError(f"--repeats must be an integer >= 1, got {plan.repeats}")
    if plan.engine not in ENGINES:
        raise FrspecError(f"--engine must be one of {', '.join(ENGINES)}, got {plan.engine!r}")
    plan.methods()  # the method lists check themselves
    if plan.quant_num_spec_tokens != "auto":
        plan_methods(plan.quant_num_spec_tokens, plan.quant_token_map_sizes, True)
    if plan.vllm_full_row and plan.engine != "vllm":
        raise FrspecError("--vllm-full-row compares vLLM's two ways to apply a map: it needs --engine vllm")
    if plan.engine == "vllm":
        if not plan.batch_sizes or min(plan.batch_sizes) < 1:
            raise FrspecError(f"--batch-sizes must be positive integers, got {plan.batch_sizes}")

