"""What verifying drafts on a hybrid target costs its Gated DeltaNet layers (decode/hybrid_target.py), per layer.

One Qwen3.5 Gated DeltaNet layer at a real shape (default Qwen3.5-27B's, as its public config states: hidden 5120,
16 key heads and 48 value heads of 128, convolution kernel 4), random weights, after a prefill of --context tokens.
For T verified tokens it times:

    own-chunked   the layer's own forward over T tokens at once (transformers' chunked rule; no per-position
                  states, so it could not restore a rejected suffix)
    per-node      frspec's verification forward over a T-node chain (states after every node kept)

and prints the memory the kept states take per node for this layer and for the model's --linear-layers layers.
Timings taken while other processes run are indicative only; hold the lock:

    HF_HUB_OFFLINE=1 flock /tmp/frspec-bench.lock python scripts/hybrid_verify_cost.py [--dtype bf16] [--threads 1]

(offline: transformers' kernel-hub fallbacks otherwise look for kernels online on every call.)
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch

from frspec.decode.hybrid_target import LinearStates, per_node_linear_attention


def _layer(args):
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    config = Qwen3_5TextConfig(hidden_size=args.hidden, num_hidden_layers=1, layer_types=["linear_attention"],
                               linear_num_key_heads=args.key_heads, linear_num_value_heads=args.value_heads,
                               linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                               vocab_size=16, num_attention_heads=8, num_key_value_heads=2, head_dim=128)
    torch.manual_seed(0)
    return config, Qwen3_5GatedDeltaNet(config, 0).to(args.dtype).eval()


class _OneLayer(torch.nn.Module):
    """The minimal model per_node_linear_attention needs: a decoder whose layer 0 has `linear_attn`."""

    def __init__(self, config, layer):
        super().__init__()
        self.config = config
        block = torch.nn.Module()
        block.linear_attn = layer
        self.layers = torch.nn.ModuleList([block])

    def get_decoder(self):
        return self


def _best(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=5120)
    p.add_argument("--key-heads", type=int, default=16)
    p.add_argument("--value-heads", type=int, default=48)
    p.add_argument("--linear-layers", type=int, default=48, help="linear layers in the model (Qwen3.5-27B: 48)")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--nodes", default="1,4,16")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    args.dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    torch.set_num_threads(args.threads)
    from transformers import DynamicCache

    config, layer = _layer(args)
    model = _OneLayer(config, layer)
    cache = DynamicCache(config=config)
    layer(torch.randn(1, args.context, args.hidden, dtype=args.dtype), cache=cache)
    rows = []
    for t in (int(x) for x in args.nodes.split(",")):
        x = torch.randn(1, t, args.hidden, dtype=args.dtype)
        record = LinearStates()

        def per_node():
            with per_node_linear_attention(model, list(range(-1, t - 1)), record):
                layer(hidden_states=x, cache=cache)

        row = {
            "nodes": t,
            "own_chunked_ms": _best(lambda: layer(x, cache=copy.deepcopy(cache)), args.reps),
            "per_node_ms": _best(per_node, args.reps),
            "deepcopy_ms": _best(lambda: copy.deepcopy(cache), args.reps),  # included in own_chunked_ms
        }
        per_node_bytes = record.states[0][0].numel() * record.states[0].element_size() \
            + record.windows[0][0].numel() * record.windows[0].element_size()
        row["kept_bytes_per_node_layer"] = per_node_bytes
        row["kept_mb_per_node_model"] = round(per_node_bytes * args.linear_layers / 2**20, 1)
        rows.append(row)
    print(json.dumps({"shape": {"hidden": args.hidden, "key_heads": args.key_heads, "value_heads": args.value_heads,
                                "head_dim": 128, "conv_kernel": 4, "linear_layers": args.linear_layers},
                      "dtype": str(args.dtype), "threads": args.threads, "context": args.context, "rows": rows},
                     indent=1))


if __name__ == "__main__":
    main()
