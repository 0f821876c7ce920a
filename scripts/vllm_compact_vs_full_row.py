"""V1's compact path vs the full-vocabulary row, per draft step (not CI; docs/vllm.md "V1's compact path").

    flock /tmp/frspec-bench.lock .venv-vllm/bin/python scripts/vllm_compact_vs_full_row.py

compact: vLLM's GEMM over the K kept rows, argmax over K, index -> target id. full row: the same GEMM, fill a
preallocated [B, V] row with -inf, index_copy the K scores in, argmax over V (what every runner's sampler sees with
FR-Spec's logits). One thread, vLLM's prepacked CPU GEMM; rounds interleaved A/B, min and median printed.
"""

import statistics
import time

import torch
from torch import nn

HIDDEN, VOCAB = 896, 151936  # Qwen2.5-0.5B's drafter head
ROUNDS, CALLS = 15, 30


def main() -> None:
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm, dispatch_unquantized_gemm

    torch.set_num_threads(1)
    for k in (32768, 8192):
        linear = nn.Linear(HIDDEN, k, bias=False).float()
        dispatch_cpu_unquantized_gemm(linear, remove_weight=False)
        gemm = dispatch_unquantized_gemm()
        target_ids = torch.randperm(VOCAB)[:k]
        for batch in (1, 4, 16):
            x = torch.randn(batch, HIDDEN)
            row = torch.empty(batch, VOCAB)

            def compact():
                return target_ids[gemm(linear, x, linear.weight, None).argmax(-1)]

            def full_row():
                row.fill_(float("-inf"))
                row.index_copy_(1, target_ids, gemm(linear, x, linear.weight, None))
                return row.argmax(-1)

            assert torch.equal(compact(), full_row())
            times = {"compact": [], "full": []}
            for r in range(ROUNDS):
                order = (("compact", compact), ("full", full_row))
                for name, fn in order if r % 2 else order[::-1]:
                    start = time.perf_counter()
                    for _ in range(CALLS):
                        fn()
                    times[name].append((time.perf_counter() - start) / CALLS * 1e6)
            c, f = times["compact"], times["full"]
            print(f"K={k} B={batch}: compact median {statistics.median(c):.0f} us, full row median "
                  f"{statistics.median(f):.0f} us, full/compact median "
                  f"{statistics.median(f) / statistics.median(c):.3f} "
                  f"(min {min(f) / min(c):.3f})", flush=True)


if __name__ == "__main__":
    main()
