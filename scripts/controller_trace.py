"""Run `frspec bench` and write every decision of its `auto` rows' controllers to a JSONL file, one line per event:

    python scripts/controller_trace.py TRACE.jsonl bench --quant int4 --mix mtbench,code,multilingual ...

    request  a request starts: prompt tokens, how many of them the drafter's prefill reads (0: it never drafts),
             the saving a token expected before its first step and the carried worth that scaled it
    choose   a step's plan (depth, map size, longest chain, rate, probe, timing) and what it was chosen from: each
             position's estimated agreement and the (decayed) drafts it rests on, each map size's coverage, the
             confidence bins' rates and drafts, every option's expected tokens per second, the step times read
    pick     a drafted token's draft probability and whether `chain_rule` drafted on after it
    observe  what the step drafted and how many of its drafts were accepted

Static rows run as usual and log nothing. Wrapping costs each controlled step a second pass over the options (well
under a millisecond against steps of 60-400 ms on a CPU), so `auto` runs a little slower than it does untraced.
How the controller's trap at an unvisited draft position was found (docs/benchmarks.md, `8e74999`): the trace of a
Spanish prompt showed the second position's estimate stuck at 0.80 over 130 steps of single drafts.
"""

from __future__ import annotations

import json
import sys

import frspec.decode.controller as controller
import frspec.decode.engine as engine


def traced(log):
    """Wrap the engine's controller calls to write each decision to `log`."""
    choose, chain_rule, observe = engine.choose, engine.chain_rule, engine.observe
    drafter_prompt = engine.SpeculativeGenerator._drafter_prompt

    def write(event: dict) -> None:
        log.write(json.dumps(event) + "\n")

    def traced_choose(state, costs, remaining=None, context=None):
        rounded = controller._rounded(context)
        options = controller.rates(state, costs, remaining, context=rounded)
        plan = choose(state, costs, remaining, context)
        write({"event": "choose", "context": context, "depth": plan.depth, "size": plan.size,
               "longest": plan.longest, "rate": plan.rate, "probe": plan.probe, "timing": plan.timing,
               "agreement": [state.agreement(i) for i in range(state.settings.max_depth)],
               "tried": list(state.tried),
               "coverage": {k: state.coverage(k) for k in state.settings.sizes},
               "bins": [state.bin_acceptance(b) for b in range(len(state.confident_drafts))],
               "bin_drafts": list(state.confident_drafts),
               "rates": {f"{d},{k}": r for (d, k), r in sorted(options.items())},
               "step_times": [controller._step_time(state, costs, d, plan.size, rounded)
                              for d in range(state.settings.max_depth + 1)]})
        return plan

    def traced_chain_rule(state, costs, plan, context=None):
        keep = chain_rule(state, costs, plan, context)

        def keep_drafting(probability: float) -> bool:
            go = keep(probability)
            write({"event": "pick", "probability": probability, "go": go})
            return go
        return keep_drafting

    def traced_observe(state, plan, accepted, ranks, expected=None, drawn=None):
        write({"event": "observe", "drafted": plan.depth, "accepted": accepted})
        log.flush()
        return observe(state, plan, accepted, ranks, expected, drawn)

    def traced_drafter_prompt(self, control, prompt_tokens, max_new_tokens, lengths):
        tokens = drafter_prompt(self, control, prompt_tokens, max_new_tokens, lengths)
        if control is not None:
            write({"event": "request", "prompt_tokens": prompt_tokens, "drafter_prompt": tokens,
                   "expected_saving": control.expected_saving, "worth": control.worth})
        return tokens

    engine.choose, engine.chain_rule, engine.observe = traced_choose, traced_chain_rule, traced_observe
    engine.SpeculativeGenerator._drafter_prompt = traced_drafter_prompt


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] != "bench":
        print("usage: python scripts/controller_trace.py TRACE.jsonl bench [frspec bench options]", file=sys.stderr)
        return 2
    from frspec.cli import main as frspec_main

    with open(argv[0], "w") as log:
        traced(log)
        return frspec_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
