"""`frspec bench`: vanilla, draft-model, EAGLE and FR-Spec decoding side by side on real models and prompts.

    frspec bench --quick --out bench-out                  # a few minutes on a 2-core CPU, every method kind, the
                                                          # int4 rows and llama.cpp (when installed)
    frspec bench --quick --eagle default --out bench-out  # plus EAGLE rows on the head's own target
    frspec bench --quick --target DIR --draft none --mtp  # rows drafted by DIR's own MTP layers (mtp, mtp+fr-spec)
    frspec bench --out bench-out                          # the full grid, for a GPU or a long CPU run

The options are in commands/bench_options.py; what they ask for is a BenchPlan (bench/plan.py), run by
bench/session.py (frspec's engine) or bench/vllm_runner.py (--engine vllm).
"""

from __future__ import annotations

import argparse
import sys

from frspec.commands.bench_options import PLAN_OPTIONS, add_bench_options
from frspec.commands.config_option import apply_models, load_config


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark vanilla, draft-model and FR-Spec decoding side by side",
        description="Run vanilla decoding, a draft model at each --num-spec-tokens, and the same draft model with "
        "FR-Spec token maps of each --token-map-sizes, interleaved on the same prompts; with --eagle also an EAGLE "
        "head drafting each --tree-shapes, without and with maps of each --eagle-token-map-sizes, on the head's "
        "own target. Print the tables and save JSON, CSV, Markdown and plots in --out.",
    )
    add_bench_options(p)
    p.set_defaults(func=run_bench)


def say(message: str) -> None:
    print(f"frspec bench: {message}", file=sys.stderr, flush=True)


def plan_from_args(args: argparse.Namespace):
    """The BenchPlan these options ask for (a --config's models and dtype fill what the command line left)."""
    from frspec.bench.plan import plan_bench
    from frspec.decode.sampling import SamplingParams

    config = load_config(args)
    apply_models(args, config)
    if config is not None and config.mtp and args.mtp and args.draft is None:
        args.draft = "none"  # the config drafts with the target's MTP layers: no draft-model rows by default
    return plan_bench(
        **{name: getattr(args, name) for name in PLAN_OPTIONS}, config=config, config_path=args.config,
        sampling=SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed),
        progress=not args.no_progress, command="frspec " + " ".join(sys.argv[1:]), say=say,
    )


def run_bench(args: argparse.Namespace) -> int:
    plan = plan_from_args(args)
    if plan.engine == "vllm":
        from frspec.bench.vllm_runner import run_vllm_plan

        text, written, time_s = run_vllm_plan(plan, say)
        print(text)
    else:
        from frspec.bench.report import render_table
        from frspec.bench.session import run_plan

        run = run_plan(plan, say)
        for title, rows in run.tables:
            render_table(rows, title=title)
        written, time_s = run.written, run.time_s
    say(f"wrote {', '.join(str(p) for p in written)} ({time_s:.0f}s in all)")
    return 0
