"""The quantized fast path against llama.cpp, measured side by side in one process:

    flock /tmp/frspec-bench.lock python -m frspec.bench.quant_compare --out docs/bench-quant

Rows (same prompts as token ids, same token budget, greedy, interleaved per prompt with a rotating start, one
unmeasured warm-up each, the fairness rules of bench/runner.py): frspec int4 vanilla; int4 target + int4 draft
chains with and without the FR-Spec map; optionally int8 and bf16 vanilla; `llama.cpp vanilla` on the same GGUF
when llama-cpp-python is installed. Before the rows run, the target's forward cost against rows (1..16) is
measured for each loaded variant (bench/row_costs.py), and the chain length comes from that curve.

Every speculative row is checked token for token against the int4 target's own vanilla output (divergences listed
with the target's top-2 margin); llama.cpp's output is compared with frspec int4 vanilla's as a fidelity figure
(same weights, different kernels and rounding), not as a correctness check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from frspec.io import atomic_path

# Per-draft acceptance assumed when choosing the chain length before anything is decoded: the committed bf16
# quick bench accepted 2.82 tokens per step with 3 drafts of the 0.5B draft, (1 - a^4) / (1 - a) = 2.82 at a = 0.72.
ASSUMED_ACCEPTANCE = 0.72
MAP_SIZE = 32768


def _args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m frspec.bench.quant_compare", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--chains", default="auto", help="comma-separated chain lengths, or auto (from the cost curve)")
    p.add_argument("--int8", action="store_true", help="add an int8 vanilla row")
    p.add_argument("--bf16", action="store_true", help="add a bf16 vanilla row (the unquantized cache)")
    p.add_argument("--no-llamacpp", action="store_true")
    p.add_argument("--llamacpp-no-repack", action="store_true",
                   help="llama.cpp without its repacked (AMX/interleaved) weight buffers, for builds that crash")
    p.add_argument("--rows-max", type=int, default=16, help="largest row count of the cost curve")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def _first_difference(a, b):
    from frspec.bench.runner import first_difference

    return first_difference(a, b)


def main(argv=None) -> int:
    from frspec.bench.datasets import encode_prompt, even_spread, load_prompts
    from frspec.bench.environment import git_commit, machine_info
    from frspec.bench import llamacpp
    from frspec.bench.row_costs import best_chain_length, chain_throughputs, measure_row_costs, plot_row_costs
    from frspec.bench.runner import top2_margin
    from frspec.bench.summary import decode_tokens_per_s
    from frspec.bench.token_maps import resolve_token_maps
    from frspec.models.loading import load_model, resolve_model_dir, set_threads, vocab_size_of
    from frspec.models.quant import quantize_drafter_head
    from frspec.models.tokenizer import load_tokenizer
    from frspec.decode.factory import build_generator
    from frspec.decode.stats import GenerationStats
    from frspec.decode.stopping import default_eos_ids

    args = _args(argv)
    out_dir = Path(args.out)
    threads = set_threads(args.threads)

    def say(msg):
        print(f"quant_compare: {msg}", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    tokenizer = load_tokenizer(resolve_model_dir(args.target))
    prompts = even_spread(load_prompts(None, "prompt"), args.num_prompts)
    encoded = [(p.id, encode_prompt(tokenizer, p.text)) for p in prompts]
    say("loading int4 target and draft")
    target = load_model(args.target, quant="int4")
    draft = load_model(args.draft, quant="int4", quantize_head=False)
    others = {}
    if args.int8:
        others["int8"] = load_model(args.target, quant="int8")
    if args.bf16:
        others["bf16"] = load_model(args.target)
    load_time = time.perf_counter() - t0
    vocab = vocab_size_of(draft)
    token_maps, maps_source = resolve_token_maps(tokenizer, vocab, [MAP_SIZE], progress=False)
    eos = default_eos_ids(target, tokenizer)

    say("measuring forward cost against rows")
    rows = range(1, args.rows_max + 1)
    curves = {"int4 target": measure_row_costs(target, rows)}
    for name, model in others.items():
        curves[f"{name} target"] = measure_row_costs(model, rows)
    draft_probe = build_generator(target, draft, token_maps[MAP_SIZE], 1).drafter
    quantize_drafter_head(draft_probe, "int4")
    draft_step = _draft_step_cost(draft_probe, vocab)
    if args.chains == "auto":
        best = best_chain_length(curves["int4 target"], ASSUMED_ACCEPTANCE, draft_step)
        chains = sorted({max(best, 1), 2, 3})
    else:
        chains = sorted({int(x) for x in args.chains.split(",")})
    say(f"cost curve picks k={best if args.chains == 'auto' else '-'}; running chains {chains}")

    methods: dict[str, Callable[[list[int]], tuple[list[int], GenerationStats]]] = {}

    def engine_row(generator):
        def run(ids):
            o = generator.generate(input_ids=torch.tensor([ids]), max_new_tokens=args.max_new_tokens)
            return list(o.token_ids), o.stats
        return run

    methods["frspec int4 vanilla"] = engine_row(build_generator(target, tokenizer=tokenizer))
    for k in chains:
        for size in (None, MAP_SIZE):
            g = build_generator(target, draft, token_maps[size] if size else None, k, tokenizer)
            quantize_drafter_head(g.drafter, "int4")
            methods[f"frspec int4 + int4 draft k={k}" + (f" map={size}" if size else "")] = engine_row(g)
    for name, model in others.items():
        methods[f"frspec {name} vanilla"] = engine_row(build_generator(model, tokenizer=tokenizer))
    if not args.no_llamacpp:
        if llamacpp.available():
            peer = llamacpp.LlamaCppGreedy(llamacpp.gguf_file(args.target), threads,
                                           repack=not args.llamacpp_no_repack)
            methods[llamacpp.LABEL] = lambda ids: peer.generate(ids, args.max_new_tokens, eos)
        else:
            say(f"no llama.cpp row: {llamacpp.INSTALL_HINT}")

    labels = list(methods)
    for label in labels:  # one unmeasured warm-up each
        methods[label](encoded[0][1][:64])
    results: dict[str, list[tuple[str, list[int], GenerationStats]]] = {label: [] for label in labels}
    start = time.perf_counter()
    for i, (pid, ids) in enumerate(encoded):
        for label in labels[i % len(labels):] + labels[: i % len(labels)]:
            tokens, stats = methods[label](ids)
            results[label].append((pid, tokens, stats))
            say(f"{pid} {label}: {len(tokens)} tokens, {decode_tokens_per_s(stats) or 0:.2f} tok/s")
    run_time = time.perf_counter() - start

    reference = {pid: toks for pid, toks, _ in results["frspec int4 vanilla"]}
    prompt_ids = dict(encoded)
    table, divergences = [], []
    rate = {}
    for label in labels:
        agg = GenerationStats.aggregate(s for _, _, s in results[label])
        rate[label] = decode_tokens_per_s(agg)
        differ, agree = 0, []
        for pid, toks, _ in results[label]:
            pos = _first_difference(reference[pid], toks)
            agree.append(len(toks) if pos is None else pos)
            if pos is not None and label != llamacpp.LABEL and label.startswith("frspec int4 +"):
                differ += 1
                divergences.append({"method": label, "prompt_id": pid, "position": pos,
                                    "top2_margin": top2_margin(target, prompt_ids[pid] + reference[pid][:pos])})
        table.append({
            "method": label,
            "tokens_per_s": rate[label],
            "acceptance_length": agg.acceptance_length if "draft" in label else None,
            "tokens": agg.tokens,
            "forward_ratio": agg.forward_ratio if "draft" in label else None,
            "lm_head_share": agg.lm_head_share if "draft" in label else None,
            "greedy_identical_to_int4_vanilla": (None if not label.startswith("frspec int4 +")
                                                 else "yes" if differ == 0 else f"{differ} differ"),
            "tokens_agreeing_with_int4_vanilla": sum(agree),
        })
    peer_rate = rate.get(llamacpp.LABEL)
    for row in table:
        row["vs_llamacpp"] = row["tokens_per_s"] / peer_rate if peer_rate and row["tokens_per_s"] else None
        row["vs_int4_vanilla"] = (row["tokens_per_s"] / rate["frspec int4 vanilla"]
                                  if row["tokens_per_s"] else None)
        mapless = row["method"].removesuffix(f" map={MAP_SIZE}")
        row["vs_same_draft_without_map"] = (row["tokens_per_s"] / rate[mapless]
                                            if mapless != row["method"] and rate.get(mapless) else None)

    meta = {
        "commit": git_commit(), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": "python -m frspec.bench.quant_compare " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine_info(), "threads": threads, "target": args.target, "draft": args.draft,
        "prompt_ids": [p.id for p in prompts], "max_new_tokens": args.max_new_tokens, "decoding": "greedy",
        "token_map": {"size": MAP_SIZE, "source": maps_source}, "chains": chains,
        "assumed_acceptance": ASSUMED_ACCEPTANCE, "draft_step_s": draft_step,
        "predicted_tokens_per_s": {str(k): v for k, v in
                                   chain_throughputs(curves["int4 target"], ASSUMED_ACCEPTANCE, draft_step).items()},
        "llamacpp_repack": None if args.no_llamacpp else not args.llamacpp_no_repack,
        "load_time_s": load_time, "run_time_s": run_time,
        # Other sessions share this machine: the load average says how busy it was around the run.
        "load_average_after_run": list(os.getloadavg()),
    }
    payload = {"meta": meta, "rows": table, "divergences": divergences,
               "row_costs_s": {name: {str(n): c for n, c in curve.items()} for name, curve in curves.items()},
               "generations": {label: [{"prompt_id": pid, "token_ids": toks, "stats": s.to_dict()}
                                       for pid, toks, s in results[label]] for label in labels}}
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(out_dir / "results.json") as tmp:
        tmp.write_text(json.dumps(payload, indent=1))
    with atomic_path(out_dir / "results.md") as tmp:
        tmp.write_text(render_markdown(payload))
    with atomic_path(out_dir / "row_costs.png") as tmp:
        plot_row_costs(curves, tmp)
    print(render_markdown(payload))
    return 0


@torch.inference_mode()
def _draft_step_cost(drafter, vocab: int, repeats: int = 5) -> float:
    """Median seconds of one draft step (the drafter's base over one token plus its head), after a short prefill."""
    gen = torch.Generator().manual_seed(1)
    ctx = torch.randint(0, vocab, (1, 64), generator=gen)
    drafter.reset()
    drafter.prefill(ctx[:, :-1])
    times = []
    for _ in range(repeats + 2):
        s = time.perf_counter()
        drafter.propose(ctx, 1, _greedy(), None)
        times.append(time.perf_counter() - s)
        drafter.rollback(63)
    return sorted(times[2:])[len(times[2:]) // 2]


def _greedy():
    from frspec.decode.sampling import SamplingParams

    return SamplingParams()


def _fmt(x, spec, suffix=""):
    return "-" if x is None else format(x, spec) + suffix


def render_markdown(payload: dict[str, Any]) -> str:
    meta = payload["meta"]
    lines = [
        f"Commit `{meta['commit']}`, {meta['machine'].get('cpu', '?')}, {meta['threads']} threads; "
        f"{len(meta['prompt_ids'])} MT-Bench prompts x {meta['max_new_tokens']} tokens, greedy; "
        f"target {meta['target']}, draft {meta['draft']}, FR-Spec map {meta['token_map']['size']}; load average "
        f"after the run {meta['load_average_after_run'][0]:.1f} (1 min) / {meta['load_average_after_run'][1]:.1f} (5 min).",
        "",
        "| Method | Decoding tok/s | vs llama.cpp | vs frspec int4 vanilla | vs same draft w/o map | "
        "Acceptance length | Forward ratio | Draft LM-head share | Greedy identical | Tokens agreeing with int4 vanilla |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["rows"]:
        lines.append(
            f"| {r['method']} | {_fmt(r['tokens_per_s'], '.2f')} | {_fmt(r['vs_llamacpp'], '.2f', 'x')} | "
            f"{_fmt(r['vs_int4_vanilla'], '.2f', 'x')} | {_fmt(r['vs_same_draft_without_map'], '.2f', 'x')} | "
            f"{_fmt(r['acceptance_length'], '.2f')} | {_fmt(r['forward_ratio'], '.3f')} | "
            f"{_fmt(r['lm_head_share'], '.1%')} | {r['greedy_identical_to_int4_vanilla'] or '-'} | "
            f"{r['tokens_agreeing_with_int4_vanilla']}/{r['tokens']} |"
        )
    lines += ["", "Target forward cost against rows (ms):", "",
              "| rows | " + " | ".join(payload["row_costs_s"]) + " |",
              "|---|" + "---|" * len(payload["row_costs_s"])]
    curves = payload["row_costs_s"]
    for n in next(iter(curves.values())):
        lines.append(f"| {n} | " + " | ".join(f"{c[n] * 1e3:.1f}" for c in curves.values()) + " |")
    for d in payload["divergences"]:
        lines.append(f"\n- {d['method']} differs from int4 vanilla on {d['prompt_id']} at token {d['position']} "
                     f"(top-2 margin {d['top2_margin']:.4f})")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
