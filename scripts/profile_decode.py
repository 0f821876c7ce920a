"""Where one decode step of the quantized target spends its time: matmuls, attention, norms, RoPE, other ops and
Python, from torch.profiler; optionally the same steps with torch.compile'd forward.

    flock /tmp/frspec-bench.lock python scripts/profile_decode.py --quant int4 --steps 16 [--compile]

A decode step here is what the engine's vanilla loop does: one target forward of `--rows` new tokens against a
KV cache of `--context` tokens, then the cache cut back. "Python and framework" is the step's wall time minus the
self time of every ATen op, i.e. what the interpreter, the module calls and dispatch cost.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

CATEGORIES = [  # (category, substrings of ATen op names), first match wins
    ("matmul (int4/int8/linear)", ("int4pack", "int8pack", "aten::mm", "aten::addmm", "aten::linear", "aten::matmul",
                                   "aten::bmm")),
    ("attention (sdpa)", ("scaled_dot_product", "flash_attention", "_efficient_attention", "aten::softmax")),
    ("norms (RMSNorm)", ("aten::pow", "aten::mean", "aten::rsqrt")),
    ("RoPE (cat/neg/slice)", ("aten::cat", "aten::neg", "aten::cos", "aten::sin")),
    ("elementwise (mul/add/silu)", ("aten::mul", "aten::add", "aten::silu", "aten::sub", "aten::div")),
    ("copies/views/cache", ("aten::copy_", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone",
                            "aten::view", "aten::reshape", "aten::transpose", "aten::slice", "aten::select",
                            "aten::expand", "aten::index", "aten::narrow", "aten::empty", "aten::unsqueeze",
                            "aten::as_strided", "aten::t", "aten::permute", "aten::_unsafe_view", "aten::split",
                            "aten::embedding", "aten::arange", "aten::zeros", "aten::ones", "aten::fill_",
                            "aten::detach", "aten::alias", "aten::resize_", "aten::set_")),
]


def categorize(name: str) -> str:
    for category, keys in CATEGORIES:
        if any(k in name for k in keys):
            return category
    return "other ops"


@torch.inference_mode()
def decode_steps(model, cache, context: int, rows: int, steps: int, vocab: int):
    from frspec.decode.kv_cache import truncate_cache

    gen = torch.Generator().manual_seed(1)
    times = []
    for _ in range(steps):
        ids = torch.randint(0, vocab, (1, rows), generator=gen)
        start = time.perf_counter()
        model(input_ids=ids, cache=cache, use_cache=True)
        times.append(time.perf_counter() - start)
        truncate_cache(cache, context)
    return times


def main() -> int:
    from frspec.models.loading import load_model, set_threads
    from frspec.decode.kv_cache import enable_rollback, new_cache

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--quant", default="int4")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--compile", action="store_true", help="also time torch.compile'd forward")
    p.add_argument("--static", action="store_true",
                   help="compile for the one shape timed (dynamic=False): a ceiling, since real decoding grows the "
                        "cache every step")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    set_threads(args.threads)
    model = load_model(args.target, quant=None if args.quant == "none" else args.quant)
    vocab = int(model.config.vocab_size)
    cache = new_cache(model)
    with torch.inference_mode():
        model(input_ids=torch.randint(0, vocab, (1, args.context)), cache=cache, use_cache=True)
    enable_rollback(cache)
    decode_steps(model, cache, args.context, args.rows, 3, vocab)  # warm-up
    plain = decode_steps(model, cache, args.context, args.rows, args.steps, vocab)

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        profiled = decode_steps(model, cache, args.context, args.rows, args.steps, vocab)
    by_category: dict[str, float] = {}
    for event in prof.key_averages():
        by_category[categorize(event.key)] = by_category.get(categorize(event.key), 0.0) + event.self_cpu_time_total
    wall_us = sum(profiled) * 1e6
    ops_us = sum(by_category.values())
    by_category["Python and framework (wall - op self time)"] = max(wall_us - ops_us, 0.0)
    step_ms = {k: v / 1e3 / args.steps for k, v in sorted(by_category.items(), key=lambda kv: -kv[1])}
    median = sorted(plain)[len(plain) // 2]
    report = {"quant": args.quant, "context": args.context, "rows": args.rows, "threads": args.threads,
              "median_step_ms_unprofiled": median * 1e3, "profiled_step_ms": wall_us / 1e3 / args.steps,
              "breakdown_ms_per_step": step_ms,
              "top_ops": [(e.key, e.self_cpu_time_total / 1e3 / args.steps, e.count // args.steps)
                          for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:15]]}
    if args.compile:
        compiled = torch.compile(model.forward, dynamic=not args.static)
        report["compile_dynamic"] = not args.static
        eager_forward = model.forward
        model.forward = compiled
        start = time.perf_counter()
        try:
            decode_steps(model, cache, args.context, args.rows, 3, vocab)
            report["compile_warmup_s"] = time.perf_counter() - start
            times = decode_steps(model, cache, args.context, args.rows, args.steps, vocab)
            report["compiled_median_step_ms"] = sorted(times)[len(times) // 2] * 1e3
        except Exception as e:  # report why it did not compile rather than fail the profile
            report["compile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        finally:
            model.forward = eager_forward
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        from frspec.io import atomic_path

        with atomic_path(args.out) as tmp:
            tmp.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
