"""The issue-12 microbenchmark: ms for one pass over 56 random matrices of 8960x1536 (weights stream from DRAM)
against the number of rows, for bf16 F.linear, int8 `_weight_int8pack_mm` and int4 `_weight_int4pack_mm_for_cpu`.

    flock /tmp/frspec-bench.lock python scripts/kernel_rows.py --rows 1,2,3,4,5,8,16 --groups 32,64

It separates the kernels' own cost curve from a model's (tune/cost_model.py measures whole forwards).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F


def time_pass(fn, weights, x, repeats: int) -> float:
    for w in weights[:4]:
        fn(x, w)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for w in weights:
            fn(x, w)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,2,3,4,5,8,16")
    p.add_argument("--groups", default="32,64", help="int4 group sizes")
    p.add_argument("--matrices", type=int, default=56)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    n, k, count = 8960, 1536, args.matrices
    rows = [int(r) for r in args.rows.split(",")]
    results: dict[str, dict[int, float]] = {}
    gen = torch.Generator().manual_seed(0)

    bf16 = [torch.randn(n, k, generator=gen).bfloat16() for _ in range(count)]
    results["bf16 F.linear"] = {m: time_pass(F.linear, bf16, torch.randn(m, k).bfloat16(), args.repeats) for m in rows}
    del bf16
    int8 = [(torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen), torch.rand(n).bfloat16())
            for _ in range(count)]
    results["int8"] = {m: time_pass(lambda x, w: torch._weight_int8pack_mm(x, *w), int8,
                                    torch.randn(m, k).bfloat16(), args.repeats) for m in rows}
    del int8
    for group in (int(g) for g in args.groups.split(",")):
        int4 = [(torch._convert_weight_to_int4pack_for_cpu(
                    torch.randint(0, 16, (n, k), dtype=torch.int32, generator=gen), 1),
                 torch.randn(k // group, n, 2, generator=gen).bfloat16()) for _ in range(count)]
        results[f"int4 g{group}"] = {
            m: time_pass(lambda x, w: torch._weight_int4pack_mm_for_cpu(x, w[0], group, w[1]), int4,
                         torch.randn(m, k).bfloat16(), args.repeats) for m in rows}
        del int4
    for name, curve in results.items():
        print(f"{name:14s} " + "  ".join(f"{m}:{ms:7.1f}" for m, ms in curve.items()))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
