"""Whole prefills side by side at two checkouts (docs/quantization.md, "A prefill's weight dequantized straight to
fp32"): each round runs each checkout's `src` in a fresh process, in alternating order, over the same random
prompt lengths; per length, the faster of two prefills per process, then the median over rounds.

    flock /tmp/frspec-bench.lock python scripts/prefill_ab.py --old ../before --new . \
        --model qwen2.5-coder-0.5b-instruct --lengths 64,128,256,612,1024 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time, torch
from frspec.decode.kv_cache import new_cache
from frspec.models.loading import load_model, set_threads
model_name, quant, threads = sys.argv[1], sys.argv[2], int(sys.argv[4])
lengths = [int(n) for n in sys.argv[3].split(",")]
set_threads(threads)
model = load_model(model_name, quant=None if quant == "none" else quant)
gen = torch.Generator().manual_seed(0)
ids = torch.randint(0, int(model.config.vocab_size) - 1000, (1, max(lengths)), generator=gen)
def prefill(n):
    cache = new_cache(model)
    start = time.perf_counter()
    with torch.inference_mode():
        model.base_model(input_ids=ids[:, :n], cache=cache, use_cache=True)
    return time.perf_counter() - start
prefill(min(200, max(lengths)))  # warm-up, past the dequantizing thresholds
print("RESULT " + json.dumps({n: min(prefill(n), prefill(n)) for n in lengths}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="a checkout (its src/ is imported)")
    p.add_argument("--new", required=True)
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--quant", default="int4")
    p.add_argument("--lengths", default="64,128,256,612,1024")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    trees = {"old": Path(args.old).resolve(), "new": Path(args.new).resolve()}
    results: dict[str, list[dict]] = {name: [] for name in trees}
    for round_ in range(args.rounds):
        for name in ("old", "new") if round_ % 2 == 0 else ("new", "old"):
            env = {**os.environ, "PYTHONPATH": str(trees[name] / "src")}
            run = subprocess.run([sys.executable, "-c", CHILD, args.model, args.quant, args.lengths,
                                  str(args.threads)], capture_output=True, text=True, env=env)
            lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
            if run.returncode or not lines:
                print(f"{name} ({trees[name]}) failed:\n{run.stderr[-2000:]}", file=sys.stderr)
                return 1
            results[name].append(json.loads(lines[-1][len("RESULT "):]))
    print(f"{args.model} ({args.quant}), s, median of {args.rounds} rounds | old | new | new/old")
    for n in results["old"][0]:
        old = statistics.median(r[n] for r in results["old"])
        new = statistics.median(r[n] for r in results["new"])
        print(f"{n} tokens | {old:.2f} | {new:.2f} | {new / old:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
