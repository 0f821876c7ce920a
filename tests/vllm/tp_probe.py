"""Run by test_tensor_parallel.py in its own process (vLLM's tensor parallelism needs its worker processes):
greedy outputs of a TP=2 engine with the configured map, and each rank's gathered FR-Spec logits for fixed hidden
states, written as JSON to argv[4]."""

import json
import sys

import torch


def probe(worker, hidden):
    """In each worker: this rank's FR-Spec head (its own shard's rows) and the all-gathered logits."""
    (head,) = worker.model_runner.drafter.frspec_heads
    return {"rank_rows": head.vocab.size, "target_ids": head.target_ids.tolist(),
            "gathered": head.kept_logits(torch.tensor(hidden, dtype=torch.float32)).tolist()}


def main():
    from vllm import LLM, SamplingParams

    target, draft, prompts_json, out = sys.argv[1:5]
    prompts = json.loads(prompts_json)
    llm = LLM(model=target, dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=8, seed=0,
              tensor_parallel_size=2,
              speculative_config={"method": "draft_model", "model": draft, "num_speculative_tokens": 3,
                                  "draft_tensor_parallel_size": 2})
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
    hidden = torch.randn(3, 64, generator=torch.Generator().manual_seed(0)).tolist()
    ranks = llm.collective_rpc(probe, args=(hidden,))
    with open(out, "w") as f:
        json.dump({"outputs": [list(o.outputs[0].token_ids) for o in outs], "hidden": hidden, "ranks": ranks}, f)


if __name__ == "__main__":
    main()
