"""How much does a draft model lose by reading a window of a long prompt? Per prompt of bench runs: the share of the
vanilla row's greedy answer whose next token the draft model's argmax predicts (teacher-forced), reading the whole
prompt or a window of W tokens made of its first H and its last W - H.

    python scripts/window_agreement.py bench-out/results.json [more results.json ...]

The evidence for DraftModelDrafter's window halves (decode/draft_model.py, docs/auto.md "A window of a long
prompt"). The prompts are rebuilt from the runs' datasets (code, multilingual, MT-Bench, long-input QA) and matched by
id; the draft model runs in its default dtype.
"""

import argparse
import json

import torch

from frspec.bench.datasets import encode_prompt, load_prompts
from frspec.models.loading import load_model, resolve_model_dir, set_threads
from frspec.models.tokenizer import load_tokenizer

DATASETS = ("code", "multilingual", "mtbench", "long-qa")
CONFIGS = [("whole", None, 0)] + [(f"W{w} H{h}", w, h) for w in (256, 512) for h in (32, w // 4, w // 2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="frspec bench results.json files with a vanilla row")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    set_threads(args.threads)
    draft = load_model(args.draft)
    tokenizer = load_tokenizer(resolve_model_dir(args.draft))
    prompts = {}
    for name in DATASETS:  # a mix prefixes ids with the dataset's name where they lack it
        for p in load_prompts(name):
            prompts.setdefault(p.id, p)
            prompts.setdefault(f"{name}-{p.id}", p)
    totals: dict[tuple[str, str], list[float]] = {}
    for path in args.results:
        for g in json.load(open(path, encoding="utf-8"))["generations"]:
            if g["method"] != "vanilla" or g["prompt_id"] not in prompts:
                continue
            ids = encode_prompt(tokenizer, prompts[g["prompt_id"]])
            answer = json.loads(g["token_ids"]) if isinstance(g["token_ids"], str) else g["token_ids"]
            line = f"{g['prompt_id'][:28]:28s} {len(ids):5d}"
            for label, w, h in CONFIGS:
                context = ids if w is None or len(ids) <= w else ids[:h] + ids[len(ids) - (w - h):]
                with torch.inference_mode():
                    logits = draft(torch.tensor([context + answer])).logits[0, len(context) - 1: -1]
                agreement = (logits.argmax(-1) == torch.tensor(answer)).float().mean().item()
                line += f" | {label} {agreement:.2f}"
                total = totals.setdefault((g["prompt_id"].split("-")[0], label), [0.0, 0])
                total[0] += agreement
                total[1] += 1
            print(line, flush=True)
    for (kind, label), (agreement, n) in sorted(totals.items()):
        print(f"{kind:14s} {label:12s} {agreement / n:.3f} ({n} prompts)")


if __name__ == "__main__":
    main()
