"""Where a half-precision linear layer gains from going through fp32 (models/wide_linear.py, WIDE_ROWS): ms for one
8960x1536 weight against the number of rows, bf16 F.linear against the same call widened to fp32 (the weight's
fp32 copy made in the call), and the int8 layer's dequantized prefill both ways; with `--model`, one prefill of a
random prompt through the whole model, bf16 and int8, each way.

    flock /tmp/frspec-bench.lock python scripts/wide_linear_rows.py --model qwen2.5-coder-1.5b-instruct

Prints what `fp32_is_faster` measured on this machine first.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from frspec.models import wide_linear as W
from frspec.models.quant import quantize_linear


def median_ms(fn, repeats: int) -> float:
    return W.median_s(fn, repeats) * 1e3  # the timer fp32_is_faster uses (models/kernel_timing.py)


def widened(on: bool) -> None:
    os.environ[W.ENV] = "1" if on else "0"
    W.fp32_is_faster.cache_clear()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,2,4,8,16,32,64,128,512")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", help="also prefill this model (name or directory), bf16 and int8, both ways")
    p.add_argument("--prompt-tokens", type=int, default=512)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.pop(W.ENV, None)
    print(f"fp32_is_faster(bf16) measured here: {W.fp32_is_faster(torch.bfloat16)}")
    torch.manual_seed(0)
    linear = torch.nn.Linear(1536, 8960, bias=False).to(torch.bfloat16)
    int8 = quantize_linear(linear, "int8")
    w = linear.weight.detach()
    print("rows | bf16 | bf16 via fp32 | int8 layer, bf16 | int8 layer, via fp32  (ms, median)")
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, 1536, dtype=torch.bfloat16)
        repeats = 10 if rows <= 128 else 3
        with torch.inference_mode():
            cells = [median_ms(lambda: F.linear(x, w), repeats),
                     median_ms(lambda: F.linear(x.float(), w.float()).to(x.dtype), repeats)]
            for on in (False, True):
                widened(on)
                cells.append(median_ms(lambda: int8(x), repeats))
        print(rows, "|", " | ".join(f"{c:.1f}" for c in cells), flush=True)
    if args.model:
        from frspec.models.loading import load_model

        for quant in (None, "int8"):
            model = load_model(args.model, dtype=torch.bfloat16, quant=quant)
            ids = torch.randint(0, int(model.config.vocab_size) - 1000, (1, args.prompt_tokens))
            for on in (False, True):
                widened(on)
                with torch.inference_mode():
                    model(input_ids=ids[:, :64], logits_to_keep=1)  # warm-up
                    start = time.perf_counter()
                    model(input_ids=ids, logits_to_keep=1)
                    s = time.perf_counter() - start
                print(f"{quant or 'bf16'} {args.model}: prefill of {args.prompt_tokens} tokens, "
                      f"{'via fp32' if on else 'half'}: {s:.1f} s ({args.prompt_tokens / s:.1f} tokens/s)",
                      flush=True)
            del model
    os.environ.pop(W.ENV, None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
