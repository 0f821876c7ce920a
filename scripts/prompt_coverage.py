"""Does a prompt tell where its answer's tokens lie in the ranking? Per prompt of a bench run: the share of its last
200 tokens (special tokens left out) and of vanilla's output inside the first k ids of the ShareGPT ranking.

    python scripts/prompt_coverage.py bench-out/results.json

The evidence for the controller's prompt prior (decode/controller.py `observe_prompt`, docs/auto.md): no model is
run; the prompts are rebuilt from the run's dataset (its `meta.dataset`, e.g. mix:mtbench,code) and matched by id.
"""

import argparse
import json

import torch

from frspec.bench.datasets import encode_prompt, load_prompts
from frspec.bench.token_maps import sharegpt_counts
from frspec.models.loading import resolve_model_dir
from frspec.models.tokenizer import load_tokenizer
from frspec.vocab.token_map import position_of, rank_by_count

SIZES = (8192, 16384, 32768, 65536)
WINDOW = 200  # the prompt's last tokens: about the controller's TOKEN_DECAY horizon


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a frspec bench results.json with a vanilla row")
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    args = parser.parse_args()
    run = json.load(open(args.results, encoding="utf-8"))
    tok = load_tokenizer(resolve_model_dir(args.target))
    counts, _ = sharegpt_counts(tok, int(run["meta"]["vocab_size"]), progress=False)
    order = rank_by_count(counts.counts)
    rank = position_of(order, order.numel())
    special = set(tok.all_special_ids)
    outputs = {g["prompt_id"]: g["token_ids"] for g in run["generations"] if g["method"] == "vanilla"}
    header = " ".join(f"{k // 1024}k" for k in SIZES)
    print(f"| prompt | tokens | last {WINDOW} prompt tokens ({header}) | output ({header}) |")
    print("|---|---:|---|---|")
    for prompt in load_prompts(run["meta"]["dataset"]):
        if prompt.id not in outputs:
            continue
        ids = [i for i in encode_prompt(tok, prompt) if i not in special]
        tail, out = rank[torch.tensor(ids[-WINDOW:])], rank[torch.tensor(outputs[prompt.id])]
        share = lambda r: " ".join(f"{(r < k).float().mean():.2f}" for k in SIZES)  # noqa: E731
        print(f"| {prompt.id} | {len(ids)} | {share(tail)} | {share(out)} |")
    total = counts.counts.double().sum()
    print("\ncorpus: " + " ".join(f"{counts.counts[order[:k]].double().sum() / total:.3f}" for k in SIZES))


if __name__ == "__main__":
    main()
