"""Coverage of the target's own bench outputs by the static map and by the context-aware rows around it.

    RAYON_NUM_THREADS=1 python scripts/context_bench_coverage.py docs/bench-context/long-qa/results.json \
        --dataset long-qa-8k.jsonl --token-map MAP [--token-map MAP2] [--context-rows 1024] [--out FILE]

A benchmark's vanilla row holds what the target wrote for each prompt (greedy). This re-encodes the same prompts
and measures the share of those tokens inside each map's rows (`static`) and inside the rows a context-aware
drafter holds (`context`, the same `ContextSlots` selection, adding each generated token after it is measured, as
the drafter does with its accepted tokens), for each budget. It is the coverage behind the acceptance the bench
measured on those prompts; no model is run.
"""

import argparse
import json
from pathlib import Path

from frspec.bench.datasets import encode_prompt, load_prompts
from frspec.io import atomic_path
from frspec.models.loading import resolve_model_dir
from frspec.models.tokenizer import load_tokenizer
from frspec.vocab.coverage import context_coverage
from frspec.vocab.token_map import TokenMap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a `frspec bench` results.json with a vanilla row")
    parser.add_argument("--dataset", default=None, help="the bench's --dataset (default: MT-Bench)")
    parser.add_argument("--token-map", action="append", required=True, help="a map (repeatable)")
    parser.add_argument("--context-rows", type=int, default=1024)
    parser.add_argument("--budgets", default="fixed,additive")
    parser.add_argument("--out", help="write the numbers as JSON here")
    args = parser.parse_args()

    payload = json.loads(Path(args.results).read_text())
    meta = payload["meta"]
    tokenizer = load_tokenizer(resolve_model_dir(meta["target"]))
    prompts = {p.id: p for p in load_prompts(args.dataset)}
    outputs = {g["prompt_id"]: g["token_ids"] for g in payload["generations"] if g["method"] == "vanilla"}
    examples = [(encode_prompt(tokenizer, prompts[pid]), outputs[pid]) for pid in meta["prompt_ids"]]
    results = {"results": str(args.results), "commit": meta.get("commit"), "prompt_ids": meta["prompt_ids"],
               "prompt_tokens": [len(p) for p, _ in examples], "output_tokens": sum(len(c) for _, c in examples),
               "maps": {}}
    for path in args.token_map:
        token_map = TokenMap.load(path)
        rows = {}
        for budget in args.budgets.split(","):
            rows[budget] = context_coverage(examples, token_map, args.context_rows, budget, follow=True)
        results["maps"][Path(path).name] = rows
        fixed = next(iter(rows.values()))
        print(f"{Path(path).name} (k={token_map.k}): static {100 * fixed['static']:.1f}%, "
              + ", ".join(f"+ctx={args.context_rows} {b} {100 * r['context']:.1f}% ({r['rows']:.0f} rows, "
                          f"{r['context_rows']:.0f} request rows)" for b, r in rows.items()))
    if args.out:
        with atomic_path(args.out) as tmp:
            tmp.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
