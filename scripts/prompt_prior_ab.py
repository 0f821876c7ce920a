"""The controller with and without the prompt's coverage evidence (decode/controller.py `observe_prompt`), and the
drafter without a map at k=3, interleaved per prompt (the starting row rotating), on the real bf16 pair.

    flock /tmp/frspec-bench.lock python scripts/prompt_prior_ab.py --datasets multilingual,mtbench,code --prompts 12

Both `auto` rows share one ranked head (the 64k ShareGPT map as the ranking); the row without the prompt's evidence
sets its weight (PROMPT_TOKEN_WEIGHT) to 0 for its requests. Prints each request's decode tokens/s and choices, then
per dataset the decode tokens/s from totals. Timings on a 2-core VM drift: compare the choices first.
"""

import argparse
import collections

import frspec.decode.controller as controller
from frspec.bench.datasets import encode_prompt, load_mix
from frspec.bench.token_maps import sharegpt_counts
from frspec.decode.factory import build_drafter, build_generator
from frspec.decode.tree_shape import TreeShape
from frspec.models.loading import load_model, resolve_model_dir, set_threads
from frspec.models.tokenizer import load_tokenizer
from frspec.vocab.token_map import TokenMap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="multilingual,mtbench,code")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    set_threads(args.threads)
    target = load_model("qwen2.5-coder-1.5b-instruct")
    draft = load_model("qwen2.5-coder-0.5b-instruct")
    tok = load_tokenizer(resolve_model_dir("qwen2.5-coder-1.5b-instruct"))
    counts, _ = sharegpt_counts(tok, int(target.config.vocab_size), progress=False)
    drafter = build_drafter(target, draft=draft, token_map=TokenMap.from_counts(counts, top_k=65536), tokenizer=tok,
                            token_map_size="auto")
    weight = controller.PROMPT_TOKEN_WEIGHT
    rows = {  # label: (generator, the prompt's weight during its requests)
        "auto": (build_generator(target, draft=drafter, token_map_size="auto", tokenizer=tok), weight),
        "auto, no prompt": (build_generator(target, draft=drafter, token_map_size="auto", tokenizer=tok), 0.0),
        "no map k=3": (build_generator(target, draft=drafter, tree=TreeShape.chain(3),
                                       token_map_size=drafter.vocab.full_size, tokenizer=tok), weight),
    }
    prompts = load_mix(args.datasets.split(","), num_prompts=args.prompts)
    for generator, w in rows.values():  # warm-up, and the step costs (measured once, cached)
        controller.PROMPT_TOKEN_WEIGHT = w
        generator.generate(input_ids=encode_prompt(tok, prompts[0])[-256:], max_new_tokens=8, eos_token_ids=[])
    totals = collections.defaultdict(lambda: [0, 0.0, collections.Counter()])
    labels = list(rows)
    try:
        for i, prompt in enumerate(prompts):
            ids = encode_prompt(tok, prompt)
            for label in labels[i % len(labels):] + labels[:i % len(labels)]:
                generator, controller.PROMPT_TOKEN_WEIGHT = rows[label]
                stats = generator.generate(input_ids=ids, max_new_tokens=args.max_new_tokens).stats
                decode_s = stats.wall_time_s - stats.prefill_time_s
                total = totals[(prompt.category, label)]
                total[0] += stats.decode_tokens
                total[1] += decode_s
                total[2].update(stats.chosen_map_sizes)
                print(f"{prompt.id:40s} {label:16s} {stats.decode_tokens / decode_s:6.2f} tokens/s  sizes "
                      f"{dict(stats.chosen_map_sizes)}  lengths {stats.chosen_depth_histogram}", flush=True)
    finally:
        controller.PROMPT_TOKEN_WEIGHT = weight
    print("\n| dataset | row | decode tokens/s | steps per map size |\n|---|---|---:|---|")
    for (category, label), (tokens, seconds, sizes) in sorted(totals.items()):
        print(f"| {category} | {label} | {tokens / seconds:.2f} | {dict(sorted(sizes.items()))} |")


if __name__ == "__main__":
    main()
