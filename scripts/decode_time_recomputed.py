"""Decode throughput of a `frspec bench` results.json taken before the drafter's prefill was timed apart (before
`b58a03c`), recomputed with that prefill counted as decoding time, as `GenerationStats.decode_tokens_per_s` counts it
now, and `auto`'s ratio to the best other row per dataset and over the run, before and after.

Those runs recorded each request's prefill as one number, the target's and the drafter's together. The target's
share is the same work as the vanilla row's prefill on the same prompt, so decode time with the drafter's prefill
counted is taken as wall time minus the vanilla row's prefill on that prompt. On the `b58a03c` int4 mix, which
measured both, this stand-in reads the rows 1-3% faster than the measured split over the run (up to
6% on one dataset's two prompts).

    python scripts/decode_time_recomputed.py docs/bench-auto/epyc-avx512-int4mix6r3-cdc8fd7/results.json
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

DATASETS = {"mtbench": "MT-Bench", "code": "code", "multilingual": "multilingual", "hotpotqa": "long-input QA",
            "squad": "long-input QA"}


def dataset(prompt_id: str) -> str:
    return next((name for prefix, name in DATASETS.items() if prompt_id.startswith(prefix)), prompt_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="results.json files of frspec bench runs")
    args = parser.parse_args()
    for path in args.results:
        generations = json.loads(path.read_text())["generations"]
        vanilla_prefill = {g["prompt_id"]: g["stats"]["prefill_time_s"]
                           for g in generations if g["method"] == "vanilla"}
        if not vanilla_prefill:
            raise SystemExit(f"{path}: no vanilla row to take the target's prefill from")
        # (dataset, method) -> [decode tokens, decode seconds as published, decode seconds with the drafter's prefill]
        sums: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
        for g in generations:
            s = g["stats"]
            for key in (dataset(g["prompt_id"]), "over the run"):
                row = sums[(key, g["method"])]
                row[0] += s["decode_tokens"]
                row[1] += s["wall_time_s"] - s["prefill_time_s"]
                row[2] += s["wall_time_s"] - vanilla_prefill[g["prompt_id"]]
        print(path)
        for key in dict.fromkeys(k for k, _ in sums):
            rows = {m: v for (k, m), v in sums.items() if k == key}
            autos = [m for m in rows if "auto" in m]
            if not autos:
                continue
            line = []
            for column, label in ((1, "published"), (2, "recomputed")):
                rate = {m: v[0] / v[column] for m, v in rows.items()}
                best, best_rate = max(((m, r) for m, r in rate.items() if m not in autos), key=lambda mr: mr[1])
                line.append(f"{label} {rate[autos[0]] / best_rate:.2f}x (best: {best} {best_rate:.2f} tokens/s)")
            print(f"  {key}: auto / best static, decode: " + "; ".join(line))


if __name__ == "__main__":
    main()
