"""Are a target's plain forwards slower in a request whose drafter was prefilled (the controlled path choosing
depth 0 every step) than in vanilla, or in a request that decodes plainly from the start, or in one that drafted
its first steps (one draft each, `DRAFTED_STEPS` of them) and then decoded plainly, as a kind's first request that
finds out does? The four run interleaved on one MT-Bench question, greedy (the same tokens where rows round alike);
medians of the mean one-row forward (each target call timed by hooks; "drafted" counts only its one-row calls).

    PYTHONPATH=src .venv/bin/python scripts/plain_forward_ab.py [int4|int8|bf16] [new tokens, 128] [rounds, 5]

Measured on the 2-core AVX-512 EPYC, int4 pair, 128 tokens, 5 rounds (docs/benchmarks.md, "Costs rescaled within a
request"): vanilla 66.6 ms, plain from the start 1.024x, prefilled then plain 1.012x. On the 2-core AVX2-only
EPYC, int4 pair, 96 tokens, 4 rounds (5015c21; each request's forwards 154-187 ms): vanilla 179.8 ms, plain 0.991x,
prefilled 1.015x, drafted 1.016x (its verified two-row forwards round apart, so its greedy text may differ).
"""
import statistics
import sys
import time

import frspec.decode.engine as engine
from frspec.decode.controller import Plan
from frspec.models.loading import load_model, set_threads, resolve_model_dir, vocab_size_of
from frspec.models.tokenizer import load_tokenizer
from frspec.bench.token_maps import resolve_token_maps
from frspec.decode.factory import build_generator, build_drafter
from frspec.decode.sampling import SamplingParams

set_threads(2)
quant = sys.argv[1] if len(sys.argv) > 1 else "int4"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 128
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 5
weights = None if quant == "bf16" else quant
QUESTION = ("Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
            "and must-see attractions.")  # MT-Bench question 81

tok = load_tokenizer(resolve_model_dir("qwen2.5-coder-1.5b-instruct"))
target = load_model("qwen2.5-coder-1.5b-instruct", quant=weights)
draft = load_model("qwen2.5-coder-0.5b-instruct", quant=weights, quantize_head=False)
maps, _ = resolve_token_maps(tok, vocab_size_of(target), [65536], progress=False)
drafter = build_drafter(target, draft=draft, token_map=maps[65536], tokenizer=tok, token_map_size="auto",
                        head_quant=weights)
van = build_generator(target, tokenizer=tok)
auto = build_generator(target, draft=drafter, token_map_size="auto", tokenizer=tok)
ids = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True)
if not isinstance(ids, list):
    ids = ids["input_ids"]

# "plain": the drafter is never prefilled (the request decodes plainly from the start, as `_plain_step`);
# "prefilled": the drafter reads the whole prompt, and the controlled step is taken with depth 0 every time.
# "drafted": as "prefilled", but its first DRAFTED_STEPS controlled steps draft one token each.
DRAFTED_STEPS = 8
MODE = {"m": None, "steps": 0}
real_choose = engine.choose


def choose(state, costs, *a, **k):
    plan = real_choose(state, costs, *a, **k)
    MODE["steps"] += 1
    if MODE["m"] == "drafted" and MODE["steps"] <= DRAFTED_STEPS:
        return Plan(1, plan.size)
    return Plan(0, plan.size) if MODE["m"] in ("prefilled", "drafted") else plan


def drafter_prompt(self, control, prompt_tokens, *a, **k):
    return prompt_tokens if MODE["m"] in ("prefilled", "drafted") else 0


# Every target call timed: (rows, seconds).
CALLS = []
CLOCK = {}
target.register_forward_pre_hook(lambda mod, args, kw: CLOCK.__setitem__("t", time.perf_counter()), with_kwargs=True)
target.register_forward_hook(
    lambda mod, args, kw, out: CALLS.append(((kw.get("input_ids") if "input_ids" in kw else args[0]).shape[-1],
                                             time.perf_counter() - CLOCK["t"])), with_kwargs=True)


engine.choose = choose
engine.SpeculativeGenerator._drafter_prompt = drafter_prompt
greedy = SamplingParams()


def run(name):
    MODE["m"], MODE["steps"] = name, 0
    CALLS.clear()
    g = van if name == "vanilla" else auto
    out = g.generate(input_ids=ids, max_new_tokens=N, eos_token_ids=[], sampling=greedy)
    one_row = [t for rows, t in CALLS if rows == 1]
    return statistics.mean(one_row), out.stats, out.token_ids


names = ["vanilla", "plain", "prefilled", "drafted"]
for n in names:  # warm-up
    run(n)
res = {n: [] for n in names}
toks = {}
for r in range(ROUNDS):
    for n in names[r % len(names):] + names[:r % len(names)]:  # the starting mode rotates
        f, s, t = run(n)
        res[n].append(f)
        toks[n] = t
        print(r, n, "%.1f ms" % (1000 * f), s.target_forwards, s.draft_prompt_tokens, s.chosen_depth_histogram,
              flush=True)
for n in names:
    ratio = statistics.median(a / b for a, b in zip(res[n], res["vanilla"]))
    print(n, "median %.1f ms" % (1000 * statistics.median(res[n])), "ratio to vanilla %.3f" % ratio)
print("tokens other than vanilla's:", [n for n in names if toks[n] != toks["vanilla"]] or "none")
