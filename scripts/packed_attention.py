"""Grouped-query attention over a few query rows, transformers' SDPA path against the packed one
(models/packed_attention.py): ms per layer against cached tokens and query rows, bf16 and fp32, at the 1.5B target's
shape (12 query heads on 2 key/value heads, head dim 128) unless told otherwise; the two timed alternately
(models/kernel_timing.py). One row has no mask (a decode step); more rows have a causal mask after the cache (a
verification), as the engine passes them. Also prints the largest difference of the two outputs.

With `--model`, whole decode steps of that model instead (`--quant`, default int4): after a prefill of each `--cached`
length, forwards of each `--rows` count against that cache (cut back after each), in rounds that alternate the two
implementations on the one loaded model; the median step of each.

    flock /tmp/frspec-bench.lock python scripts/packed_attention.py [--heads 12 --kv-heads 2 --head-dim 128]
    flock /tmp/frspec-bench.lock python scripts/packed_attention.py --model qwen2.5-coder-1.5b-instruct \
        --cached 64,512,1300 --rows 1,2,4
"""

from __future__ import annotations

import argparse
import types

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from frspec.models.attention import causal_mask
from frspec.models.kernel_timing import alternated_medians
from frspec.models.packed_attention import PACKED_SDPA, packed_sdpa_forward


def model_steps(args) -> None:
    """Whole decode steps of `args.model`, transformers' sdpa against the packed path, alternated (module doc)."""
    from frspec.decode.kv_cache import new_cache, truncate_cache
    from frspec.models.loading import load_model

    model = load_model(args.model, quant=None if args.quant == "none" else args.quant)
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    print(f"| cached tokens | rows | sdpa step (ms) | packed step (ms) | gain |  ({args.model}, {args.quant})")
    print("|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        for cached in map(int, args.cached.split(",")):
            cache = new_cache(model)
            model(input_ids=torch.randint(0, vocab, (1, cached), generator=gen), cache=cache, use_cache=True)
            for rows in map(int, args.rows.split(",")):
                ids = torch.randint(0, vocab, (1, rows), generator=gen)

                def step(name):
                    def run():
                        model.set_attn_implementation(name)
                        model(input_ids=ids, cache=cache, use_cache=True)
                        truncate_cache(cache, cached)
                    return run

                a, b = alternated_medians(step("sdpa"), step(PACKED_SDPA), rounds=args.rounds)
                print(f"| {cached} | {rows} | {a * 1e3:.1f} | {b * 1e3:.1f} | {a / b:.2f}x |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--cached", default="64,512,1300,4000")
    p.add_argument("--rows", default="1,2,4,8,32,64")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", default=None, help="time whole decode steps of this model instead")
    p.add_argument("--quant", default="int4")
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.model:
        return model_steps(args)
    module = types.SimpleNamespace(num_key_value_groups=args.heads // args.kv_heads, is_causal=True, training=False)
    scale = args.head_dim ** -0.5
    print("| dtype | cached tokens | query rows | transformers' sdpa (ms) | packed (ms) | gain | max |difference| |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for dtype in (torch.bfloat16, torch.float32):
        for cached in map(int, args.cached.split(",")):
            for rows in map(int, args.rows.split(",")):
                gen = torch.Generator().manual_seed(0)
                q = torch.randn(1, args.heads, rows, args.head_dim, generator=gen).to(dtype)
                k, v = (torch.randn(1, args.kv_heads, cached + rows, args.head_dim, generator=gen).to(dtype)
                        for _ in range(2))
                mask = None if rows == 1 else causal_mask(rows, cached, dtype=dtype)
                plain, packed = (lambda: sdpa_attention_forward(module, q, k, v, mask, scaling=scale)[0],
                                 lambda: packed_sdpa_forward(module, q, k, v, mask, scaling=scale)[0])
                diff = (plain().float() - packed().float()).abs().max().item()
                a, b = alternated_medians(plain, packed)
                print(f"| {str(dtype)[6:]} | {cached} | {rows} | {a * 1e3:.3f} | {b * 1e3:.3f} | {a / b:.2f}x "
                      f"| {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
