"""Side-by-side check: frspec's vanilla loop vs transformers' greedy `generate` on the same model, prompts and dtype.

Runs both in one process, interleaved per prompt, warm-up excluded, and prints per-prompt tokens/s and the median
ratio. Usage: python scripts/compare_hf_generate.py [--model NAME] [--prompts N] [--max-new-tokens N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from frspec.bench.datasets import encode_prompt, load_prompts
from frspec.models.loading import load_model, set_threads
from frspec.models.tokenizer import load_tokenizer
from frspec import build_generator


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    set_threads(args.threads)
    tok = load_tokenizer(args.model)
    model = load_model(args.model)
    gen = build_generator(model, tokenizer=tok)
    prompts = load_prompts(num_prompts=args.prompts)
    ratios = []
    for p in prompts:
        ids = encode_prompt(tok, p.text)
        x = torch.tensor([ids])
        # Both stop at the model's EOS or max_new_tokens (min_new_tokens would make HF mask EOS and diverge).
        kw = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
        model.generate(x, max_new_tokens=4, do_sample=False)  # warm-up
        gen.generate(input_ids=ids, max_new_tokens=4)
        hf_t, fr_t = [], []
        for _ in range(args.rounds):
            t = time.perf_counter()
            hf = model.generate(x, **kw)[0, len(ids):].tolist()
            hf_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            fr = gen.generate(input_ids=ids, max_new_tokens=args.max_new_tokens).token_ids
            fr_t.append(time.perf_counter() - t)
        same = hf == fr
        hf_s, fr_s = len(hf) / statistics.median(hf_t), len(fr) / statistics.median(fr_t)
        ratios.append(fr_s / hf_s)
        print(f"prompt {len(ratios)}: hf generate {hf_s:.2f} tok/s, frspec vanilla {fr_s:.2f} tok/s, "
              f"ratio {fr_s / hf_s:.3f}, {len(fr)} tokens, identical tokens: {same}")
    print(f"median ratio frspec/hf: {statistics.median(ratios):.3f} over {len(ratios)} prompts")


if __name__ == "__main__":
    main()
