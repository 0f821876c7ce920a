"""The int4/int8 prefill measurement (docs/quantization.md, "Prefill"): ms for one weight (8960x1536) against the
number of rows, bf16 F.linear against each quantized layer on its weight-only kernel and on the dequantized float
GEMM the layer switches to from INT4_DEQUANT_ROWS / INT8_DEQUANT_ROWS rows on; with `--model`, one prefill of a
long random prompt through a whole int4 model each way.

    flock /tmp/frspec-bench.lock python scripts/quant_prefill.py --model qwen2.5-coder-1.5b-instruct
"""

from __future__ import annotations

import argparse
import time

import torch

from frspec.models import quant_kernels as K
from frspec.models.quant import quantize_linear

NEVER = 1 << 40  # a threshold no call reaches: the kernel always
ALWAYS = 1  # every call dequantizes


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def with_thresholds(rows: int, fn):
    saved = K.INT4_DEQUANT_ROWS, K.INT4_DEQUANT_ROWS_WIDENED, K.INT8_DEQUANT_ROWS
    K.INT4_DEQUANT_ROWS = K.INT4_DEQUANT_ROWS_WIDENED = K.INT8_DEQUANT_ROWS = rows
    try:
        return fn()
    finally:
        K.INT4_DEQUANT_ROWS, K.INT4_DEQUANT_ROWS_WIDENED, K.INT8_DEQUANT_ROWS = saved


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="64,128,256,512,1024,4096")
    p.add_argument("--shape", default="8960x1536", help="the weight's out x in features (the 0.5B drafter's MLP: "
                   "4864x896)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", help="also prefill this model (name or directory) in int4, both ways")
    p.add_argument("--prompt-tokens", type=int, default=4096)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out_features, in_features = (int(n) for n in args.shape.lower().split("x"))
    linear = torch.nn.Linear(in_features, out_features, bias=False).to(torch.bfloat16)
    layers = {"int4": quantize_linear(linear, "int4"), "int8": quantize_linear(linear, "int8")}
    print("rows | bf16 | int4 kernel | int4 dequantized | int8 kernel | int8 dequantized  (ms, median)")
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, in_features, dtype=torch.bfloat16)
        repeats = 10 if rows <= 256 else 3
        cells = [median_ms(lambda: linear(x), repeats)]
        for name in ("int4", "int8"):
            for threshold in (NEVER, ALWAYS):
                cells.append(with_thresholds(threshold, lambda: median_ms(lambda: layers[name](x), repeats)))
        print(rows, "|", " | ".join(f"{c:.1f}" for c in cells), flush=True)
    if args.model:
        from frspec.models.loading import load_model

        model = load_model(args.model, dtype=torch.bfloat16, quant="int4")
        ids = torch.randint(0, int(model.config.vocab_size) - 1000, (1, args.prompt_tokens))
        with torch.inference_mode():
            model(input_ids=ids[:, :300])  # warm-up
            for name, threshold in (("dequantized", K.INT4_DEQUANT_ROWS), ("kernel", NEVER)):
                start = time.perf_counter()
                with_thresholds(threshold, lambda: model(input_ids=ids))
                print(f"int4 {args.model}: prefill of {args.prompt_tokens} tokens, {name}: "
                      f"{time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
