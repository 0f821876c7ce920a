"""The full-vocabulary row against V1's compact path, end to end in ONE vLLM engine (not CI; docs/vllm.md).

    flock /tmp/frspec-bench.lock .venv-vllm/bin/python scripts/vllm_full_row_ab.py --out docs/vllm/full-row-ab

`frspec bench --engine vllm --vllm-full-row` starts one engine per path, so engine-to-engine variation (start-up,
compilation, memory placement; about +-10% on the 2-core CPU) sits inside every ratio it reports. Here a single
engine (the real pair, draft k=3, one map, compiled unless --eager) serves both paths: between requests one RPC to
the worker switches its drafter between the compact path (compact_path.py's instance methods) and vLLM's own
`_greedy_sample`, which calls the model's pruned `compute_logits`, the full row V2's speculators see. Paths
alternate per prompt in ABBA order, each round every prompt once per path, batch 1, greedy; every measurement checks
that the model's pruned `compute_logits` ran on the full-row path and not on the compact one. Printed and written:
throughput per path, the median over (round, prompt) pairs of full-row/compact time ratios with a bootstrap 95%
interval, and whether both paths emitted the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

PATHS = ("compact", "full-row")
SWAPPED = ("_greedy_sample", "_sample_draft_tokens")  # what compact_path.use_compact_path puts on the proposer


def set_path(worker, path: str) -> str:
    """Run in the vLLM worker: make its drafter use `path` (the compact methods are stashed on first call)."""
    from frspec.bench.vllm_runner import _worker_drafter

    drafter = _worker_drafter(worker)
    if not hasattr(drafter, "_frspec_ab_compact"):
        stash = {n: drafter.__dict__[n] for n in SWAPPED if n in drafter.__dict__}
        if len(stash) != len(SWAPPED) or getattr(drafter, "frspec_path", None) != "compact":
            raise RuntimeError(f"the drafter {type(drafter).__name__} is not on the compact path")
        drafter._frspec_ab_compact = stash
    if path == "compact":
        drafter.__dict__.update(drafter._frspec_ab_compact)
    else:
        for n in SWAPPED:
            drafter.__dict__.pop(n, None)
    drafter.frspec_path = path
    return path


def pruned_calls(worker) -> int:
    """Run in the vLLM worker: calls so far of the drafter's pruned compute_logits (the full-row path makes them,
    the compact path does not), so each measurement proves which path it ran."""
    from frspec.vllm_plugin.pruned_logits import pruned_logits_of
    from frspec.bench.vllm_runner import _worker_drafter
    from frspec.vllm_plugin.worker_check import drafter_model

    return sum(p.calls for p in pruned_logits_of(drafter_model(_worker_drafter(worker))))


def bootstrap_median(values: list[float], rng: random.Random, n: int = 2000) -> tuple[float, float]:
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--map-size", type=int, default=32768)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-spec-tokens", type=int, default=3)
    ap.add_argument("--eager", action="store_true", help="enforce_eager=True (default: vLLM's compilation)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from frspec.bench.datasets import encode_prompt, load_mtbench
    from frspec.bench.environment import git_commit, machine_info
    from frspec.bench.token_maps import maps_from_counts, sharegpt_counts
    from frspec.bench.vllm_runner import TOKEN_MAP_ENV, V1_COMPACT_ENV

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc with set_path
    os.environ[V1_COMPACT_ENV] = "1"
    from frspec.models.loading import resolve_model_dir
    from frspec.models.tokenizer import load_tokenizer

    commit = git_commit()
    target_dir = resolve_model_dir("qwen2.5-coder-1.5b-instruct")
    draft_dir = resolve_model_dir("qwen2.5-coder-0.5b-instruct")
    tokenizer = load_tokenizer(target_dir)
    from transformers import AutoConfig

    vocab_size = int(AutoConfig.from_pretrained(target_dir).vocab_size)
    counts, _ = sharegpt_counts(tokenizer, vocab_size, progress=False)
    token_map = maps_from_counts(counts, [args.map_size], vocab_size)[args.map_size]
    args.out.mkdir(parents=True, exist_ok=True)
    map_file = Path(tempfile.mkdtemp()) / f"map-{args.map_size}.safetensors"  # read by the plugin at start-up
    token_map.save(map_file, format="frspec")
    os.environ[TOKEN_MAP_ENV] = str(map_file)
    prompts = [(p.id, encode_prompt(tokenizer, p)) for p in load_mtbench(args.num_prompts)]

    from vllm import LLM, SamplingParams

    llm = LLM(model=target_dir, dtype="bfloat16", enforce_eager=args.eager, seed=0, disable_log_stats=False,
              max_model_len=max(len(ids) for _, ids in prompts) + args.max_new_tokens + 16, max_num_seqs=1,
              speculative_config={"method": "draft_model", "model": draft_dir,
                                   "num_speculative_tokens": args.num_spec_tokens})
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens)
    records = []
    try:
        for path in PATHS:  # warm-up on both paths, unmeasured
            llm.collective_rpc(set_path, args=(path,))
            llm.generate([{"prompt_token_ids": prompts[0][1]}], SamplingParams(temperature=0.0, max_tokens=16),
                         use_tqdm=False)
        load_start = list(os.getloadavg())
        for r in range(args.rounds):
            for i, (pid, ids) in enumerate(prompts):
                order = PATHS if (r + i) % 2 == 0 else PATHS[::-1]
                for path in order:
                    llm.collective_rpc(set_path, args=(path,))
                    calls = sum(llm.collective_rpc(pruned_calls))
                    t0 = time.perf_counter()
                    out = llm.generate([{"prompt_token_ids": ids}], greedy, use_tqdm=False)[0]
                    wall = time.perf_counter() - t0
                    calls = sum(llm.collective_rpc(pruned_calls)) - calls
                    if (calls > 0) != (path == "full-row"):
                        raise RuntimeError(f"{path}: the pruned compute_logits ran {calls} times")
                    tokens = list(out.outputs[0].token_ids)
                    records.append({"round": r, "prompt": pid, "path": path, "wall_s": wall, "tokens": tokens,
                                    "pruned_compute_logits_calls": calls})
                    print(f"round {r + 1} {pid} {path}: {len(tokens)} tokens in {wall:.2f}s", flush=True)
        load_end = list(os.getloadavg())
    finally:
        llm.llm_engine.engine_core.shutdown()

    by = {(x["round"], x["prompt"], x["path"]): x for x in records}
    pairs = [(by[(r, pid, "full-row")], by[(r, pid, "compact")]) for r in range(args.rounds) for pid, _ in prompts]
    ratios = [c["wall_s"] / len(c["tokens"]) / (f["wall_s"] / len(f["tokens"])) for f, c in pairs]  # full/compact speed
    throughput = {p: sum(len(x["tokens"]) for x in records if x["path"] == p)
                  / sum(x["wall_s"] for x in records if x["path"] == p) for p in PATHS}
    lo, hi = bootstrap_median(ratios, random.Random(0))
    same = sum(f["tokens"] == c["tokens"] for f, c in pairs)
    summary = {
        "commit": commit, "machine": machine_info(), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "map_size": args.map_size,
        "num_spec_tokens": args.num_spec_tokens, "compiled": not args.eager, "rounds": args.rounds,
        "prompts": [pid for pid, _ in prompts], "max_new_tokens": args.max_new_tokens,
        "load_average_start": load_start, "load_average_end": load_end,
        "tokens_per_s": throughput, "full_row_vs_compact_aggregate": throughput["full-row"] / throughput["compact"],
        "full_row_vs_compact_median": statistics.median(ratios), "median_95ci": [lo, hi],
        "identical_outputs": f"{same} of {len(pairs)}", "records": records,
    }
    (args.out / "results.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"tokens/s: compact {throughput['compact']:.3f}, full row {throughput['full-row']:.3f}; full row vs "
          f"compact: aggregate {summary['full_row_vs_compact_aggregate']:.3f}x, median over {len(ratios)} "
          f"(round, prompt) pairs {summary['full_row_vs_compact_median']:.3f}x (95% CI {lo:.3f}-{hi:.3f}); "
          f"identical outputs {same} of {len(pairs)}")


if __name__ == "__main__":
    main()
