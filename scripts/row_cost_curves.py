"""The target's forward cost against rows for bf16, int8 and int4, measured in rotating rounds and plotted.

    flock /tmp/frspec-bench.lock python scripts/row_cost_curves.py --out docs/bench-quant/row-costs

What `frspec bench --quick` measures once per weight format (tune/cost_model.py), here repeated in --rounds
rounds that rotate the formats, so that a load change on the machine hits every format alike; each point is the
median over the rounds of each round's median of --repeats forwards.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> int:
    from frspec.bench.environment import git_commit, machine_info
    from frspec.bench.plots import plot_row_costs
    from frspec.tune.cost_model import measure_row_costs
    from frspec.io import atomic_path
    from frspec.models.loading import load_model, set_threads

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--formats", default="bf16,int8,int4")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", required=True, help="directory for row_costs.json and row_costs.png")
    args = p.parse_args()
    set_threads(args.threads)
    formats = [f for f in args.formats.split(",") if f]
    models = {f: load_model(args.target, quant=None if f == "bf16" else f) for f in formats}
    rounds: dict[str, list[dict[int, float]]] = {f: [] for f in formats}
    for r in range(args.rounds):
        for f in formats[r % len(formats):] + formats[: r % len(formats)]:
            rounds[f].append(measure_row_costs(models[f], range(1, args.rows + 1), repeats=args.repeats, warmup=1))
            print(f"round {r + 1} {f}: " + " ".join(f"{n}:{c * 1e3:.0f}" for n, c in rounds[f][-1].items()),
                  flush=True)
    curves = {f: {n: sorted(rd[n] for rd in rounds[f])[len(rounds[f]) // 2] for n in range(1, args.rows + 1)}
              for f in formats}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"commit": git_commit(), "machine": machine_info(), "target": args.target, "threads": args.threads,
               "rounds": args.rounds, "repeats": args.repeats, "context": 128, "median_s": curves,
               "per_round_s": rounds}
    with atomic_path(out / "row_costs.json") as tmp:
        tmp.write_text(json.dumps(payload, indent=1))
    plot_row_costs(curves, out / "row_costs.png", title=f"{args.target}: one forward against rows")
    print(json.dumps({f: {n: round(c * 1e3, 1) for n, c in cs.items()} for f, cs in curves.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
