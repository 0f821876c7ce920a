"""Mean acceptance length of an EAGLE head on MT-Bench first turns: greedy, a depth-D chain, the engine's own stats.

    python scripts/eagle_acceptance.py [HEAD] [--prompts 16] [--max-new-tokens 128] [--depth 4] [--check 2]

HEAD defaults to the default head (`frspec models prepare --only eagle-head`). Runs in fp32 so that greedy
speculative decoding must equal vanilla exactly; `--check N` also decodes the first N prompts without drafting
and reports whether the tokens are identical.
"""

import argparse
import json
import time

import torch

from frspec.bench.datasets import encode_prompt, load_mtbench
from frspec.bench.eagle_heads import DEFAULT_EAGLE_TARGET, resolve_eagle_head
from frspec.models.loading import load_model, resolve_model_dir
from frspec.models.tokenizer import load_tokenizer
from frspec import build_generator
from frspec.decode.stats import GenerationStats
from frspec import TreeShape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("head", nargs="?", default="default")
    parser.add_argument("--target", default=DEFAULT_EAGLE_TARGET)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--check", type=int, default=0, help="prompts also decoded without drafting, to compare")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    target = load_model(args.target, dtype="fp32")
    tokenizer = load_tokenizer(resolve_model_dir(args.target))
    head = resolve_eagle_head(args.head)
    generator = build_generator(target, eagle=head, tree=TreeShape.chain(args.depth), tokenizer=tokenizer)
    vanilla = build_generator(target, tokenizer=tokenizer)
    stats, same, start = [], 0, time.time()
    for i, prompt in enumerate(load_mtbench(args.prompts)):
        ids = encode_prompt(tokenizer, prompt.text)
        out = generator.generate(input_ids=ids, max_new_tokens=args.max_new_tokens)
        stats.append(out.stats)
        line = (f"{prompt.id} {prompt.category}: acceptance length {out.stats.acceptance_length:.2f} "
                f"({len(out.token_ids)} tokens)")
        if i < args.check:
            reference = vanilla.generate(input_ids=ids, max_new_tokens=args.max_new_tokens)
            same += reference.token_ids == out.token_ids
            line += f", identical to vanilla: {reference.token_ids == out.token_ids}"
        print(line, flush=True)
    total = GenerationStats.aggregate(stats)
    print(json.dumps({"head": str(head), "prompts": len(stats), "depth": args.depth,
                      "acceptance_length": round(total.acceptance_length, 4),
                      "per_position": [round(x, 4) for x in total.acceptance_rate_per_position],
                      "identical_to_vanilla": f"{same}/{args.check}", "seconds": round(time.time() - start, 1)}))


if __name__ == "__main__":
    main()
