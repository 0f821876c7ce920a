"""Draft-target top-1 agreement on reference text: the static FR-Spec map vs context-aware rows at equal row count.

    flock /tmp/frspec-bench.lock python scripts/context_agreement.py [--per-set 8] [--window 128] [--k 32768]

For each prompt with a reference continuation, one teacher-forced forward of the target and one of the draft over
prompt + the first `window` reference tokens. At each continuation position the target's greedy next token is
compared with the draft's greedy token over: its full vocabulary, the static map's k rows, the context-aware rows
(`ContextVocab`, fixed budget: the same k rows, up to `--extra-rows` of them the prompt's tokens), and the same
with the reference tokens before the position added (`add_tokens`, as a drafter adding its accepted tokens).

This is the acceptance rate of the first draft token of a chain given a correct prefix, a proxy for acceptance
length that needs no drafter wiring; it is measured on reference text, not on the target's own output. Greedy
only. Writes JSON with the commit and machine and prints a markdown table.
"""

import argparse
import json
import time

import torch

from frspec.bench.code_prompts import load_code_completion
from frspec.bench.datasets import encode_prompt, load_mtbench_with_references
from frspec.bench.environment import git_commit, machine_info
from frspec.bench.long_context import load_sharegpt_multiturn, load_squad_continuations
from frspec.bench.token_maps import sharegpt_counts
from frspec.io import atomic_path
from frspec.models.loading import load_model, resolve_model_dir, vocab_size_of
from frspec.models.tokenizer import load_tokenizer
from frspec.vocab.context_vocab import ContextVocab
from frspec.vocab.draft_vocab import DraftVocab
from frspec.vocab.token_map import TokenMap

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"


def hidden_at(model, ids: torch.Tensor, start: int) -> torch.Tensor:
    """Final hidden states [n, hidden] at positions start-1 .. len-2 (those that predict ids[start:])."""
    out = model.base_model(input_ids=ids.view(1, -1), use_cache=False)
    return out.last_hidden_state[0, start - 1: ids.numel() - 1]


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/context-agreement-results.json")
    parser.add_argument("--per-set", type=int, default=8)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--k", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--extra-rows", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tok = load_tokenizer(TARGET)
    target, draft = load_model(TARGET, dtype="bf16"), load_model(DRAFT, dtype="bf16")
    vocab_size = vocab_size_of(target)
    counts, _ = sharegpt_counts(tok, vocab_size)
    head = draft.get_output_embeddings()
    vocabs = {}
    for k in args.k:
        tm = TokenMap.from_counts(counts, top_k=k)
        vocabs[k] = (DraftVocab.build(head.weight, token_map=tm),
                     ContextVocab.build(head.weight, token_map=tm, extra_rows=args.extra_rows, budget="fixed"))
    n = args.per_set
    sets = {
        "MT-Bench (reference answers)": load_mtbench_with_references()[:: max(1, 60 // n)][:n],
        "long QA (SQuAD): held-out paragraph": load_squad_continuations(n),
        "ShareGPT multi-turn: next reply": load_sharegpt_multiturn(n),
        "code: rest of the file": load_code_completion(n),
    }
    result = {"commit": git_commit(), "machine": machine_info(), "window": args.window,
              "extra_rows": args.extra_rows, "rows": []}
    start_time = time.perf_counter()
    for name, prompts in sets.items():
        tally = {"positions": 0, "full": 0}
        for k in args.k:
            tally.update({f"static{k}": 0, f"context{k}": 0, f"context{k}+gen": 0})
        for p in prompts:
            prompt_ids = encode_prompt(tok, p)
            cont = tok.encode(p.reference, add_special_tokens=False)[: args.window]
            ids = torch.tensor(prompt_ids + cont)
            want = target.get_output_embeddings()(hidden_at(target, ids, len(prompt_ids))).argmax(-1)
            h = hidden_at(draft, ids, len(prompt_ids))
            tally["positions"] += len(cont)
            tally["full"] += int((head(h).argmax(-1) == want).sum())
            for k, (static, context) in vocabs.items():
                tally[f"static{k}"] += int((static.to_target(static.logits(h).argmax(-1)) == want).sum())
                context.begin_request(prompt_ids)
                tally[f"context{k}"] += int((context.to_target(context.logits(h).argmax(-1)) == want).sum())
                for j in range(len(cont)):  # the rows as a drafter adding its accepted tokens would hold them
                    if j:
                        context.add_tokens(cont[j - 1: j])
                    tally[f"context{k}+gen"] += int(context.to_target(context.logits(h[j]).argmax(-1)) == want[j])
        result["rows"].append({"set": name, "examples": len(prompts), **tally})
        print(f"{name}: done at {time.perf_counter() - start_time:.0f} s", flush=True)
    result["seconds"] = time.perf_counter() - start_time
    with atomic_path(args.out) as tmp:
        tmp.write_text(json.dumps(result, indent=1) + "\n")
    print(f"commit {result['commit']}, {result['machine']['cpu']}, window {args.window}, "
          f"extra rows {args.extra_rows}\n")
    ks = args.k
    head_cells = " | ".join(f"static {k // 1024}k | context {k // 1024}k | + generated" for k in ks)
    print(f"| set | positions | full vocabulary | {head_cells} |\n|---|---|---|" + "---|" * (3 * len(ks)))
    for r in result["rows"]:
        cells = " | ".join(f"{100 * r[f'static{k}'] / r['positions']:.1f}% | {100 * r[f'context{k}'] / r['positions']:.1f}% | "
                           f"{100 * r[f'context{k}+gen'] / r['positions']:.1f}%" for k in ks)
        print(f"| {r['set']} | {r['positions']} | {100 * r['full'] / r['positions']:.1f}% | {cells} |")


if __name__ == "__main__":
    main()
