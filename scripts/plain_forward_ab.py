"""Are a target's plain forwards slower in a request whose drafter was prefilled (the controlled path choosing
depth 0 every step) than in vanilla, or in a request that decodes plainly from the start? The three run
interleaved on one MT-Bench question, greedy (so all three emit the same tokens); medians of the mean forward.

    PYTHONPATH=src .venv/bin/python scripts/plain_forward_ab.py [int4|int8|bf16] [new tokens, 128] [rounds, 5]

Measured on the 2-core AVX-512 EPYC, int4 pair, 128 tokens, 5 rounds (docs/benchmarks.md, "Costs rescaled within a
request"): vanilla 66.6 ms, plain from the start 1.024x, prefilled then plain 1.012x.
"""
import statistics
import sys

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
MODE = {"m": None}
real_choose = engine.choose


def choose(state, costs, *a, **k):
    plan = real_choose(state, costs, *a, **k)
    return Plan(0, plan.size) if MODE["m"] == "prefilled" else plan


def drafter_prompt(self, control, prompt_tokens, *a, **k):
    return prompt_tokens if MODE["m"] == "prefilled" else 0


engine.choose = choose
engine.SpeculativeGenerator._drafter_prompt = drafter_prompt
greedy = SamplingParams()


def run(name):
    MODE["m"] = name
    g = van if name == "vanilla" else auto
    out = g.generate(input_ids=ids, max_new_tokens=N, eos_token_ids=[], sampling=greedy)
    s = out.stats
    return s.target_time_s / s.target_forwards, s, out.token_ids


names = ["vanilla", "plain", "prefilled"]
for n in names:  # warm-up
    run(n)
res = {n: [] for n in names}
toks = {}
for r in range(ROUNDS):
    for n in names[r % 3:] + names[:r % 3]:  # the starting mode rotates
        f, s, t = run(n)
        res[n].append(f)
        toks[n] = t
        print(r, n, "%.1f ms" % (1000 * f), s.target_forwards, s.draft_prompt_tokens, s.chosen_depth_histogram,
              flush=True)
for n in names:
    ratio = statistics.median(a / b for a, b in zip(res[n], res["vanilla"]))
    print(n, "median %.1f ms" % (1000 * statistics.median(res[n])), "ratio to vanilla %.3f" % ratio)
print("same tokens", toks["plain"] == toks["vanilla"] == toks["prefilled"])
