"""What a drafter's step costs with its full LM head and with FR-Spec's 16k/32k/64k rows, on random weights of the
real shapes (no checkpoint of these families can be fetched here), and the speedup `tune`'s cost model predicts.

    flock /tmp/frspec-bench.lock python scripts/head_costs.py --out docs/head-costs     # CPU, bf16/int8/int4
    python scripts/head_costs.py --device cuda --rows 1,4,16,64 --out $OUT/head-costs  # scripts/gpu_checks.sh

Drafters timed (one step = the drafter's body over n rows after a 128-token cache, then its LM head and the argmax):

    qwen3.5-27b-mtp   Qwen3.5/3.6-27B's MTP block: the two RMSNorms and `fc` (2x5120 -> 5120), one full-attention
                      decoder layer (24 query heads with the output gate, 4 KV heads, head_dim 256; MLP 17,408),
                      the final norm, and the shared 248,320 x 5,120 head.
    deepseek-v3-mtp   DeepSeek-V3's MTP block: enorm/hnorm, `eh_proj` (2x7168 -> 7168), one MLA layer (q_lora 1536,
                      kv_lora 512, 128 heads of 128+64 / 128) and its MoE: the router, the shared expert and 8 routed
                      experts (2048 wide) per row, every row's 8 experts assumed distinct (the worst case, up to 256),
                      cycled through a pool of 32 allocated experts (2.8 GB in bf16, 0.7 GB in int4: more than the
                      last-level cache, so each expert streams from DRAM as a distinct one would); then the
                      129,280 x 7,168 head.
    gemma-3-1b        Gemma-3-1B as a draft model: 26 layers (4 query heads, 1 KV head, head_dim 256, gated GELU MLP
                      6,912) and the tied 262,144 x 1,152 head.

Formats: bf16 (F.linear), and int8 / int4 (group 32) through the project's own weight-only kernels
(models/quant.py, models/quant_kernels.py), body and head alike. RoPE, embedding lookups and the sampler are left
out (small next to these matmuls). The pruned heads are the first k rows of the full head, as a gathered copy is.

Predicted speedup (MTP drafters only; --no-predict skips it): the chain model of tune/cost_model.py (and tune/predict.py),
a step of k drafts costing target(k + 1) + k * (body(1) + head(1)) and yielding (1 - a^(k+1)) / (1 - a) tokens at
per-draft acceptance a, the best k in 1..4. The target is not timed whole (a 27B or 671B model does not fit here):
target(n) = layers x the timed decoder layer at n rows + the full head at n rows (64 layers for Qwen3.5-27B, 61 for
DeepSeek-V3), which ignores the linear-attention/dense-layer differences, made non-decreasing in n. Acceptance rates: llama.cpp issue 25187
(see ACCEPTANCE).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# llama.cpp issue 25187 ("Research: FR-Spec-style draft-vocab trimming for native MTP speculative decoding"),
# comment of 2026-08-15 by PierpaoloPernici: Qwen3.8-27B, --spec-draft-n-max 4, temp 1.0, draft acceptance
# (accepted / drafted) with the model's own MTP head over all 248k rows vs a 32k FR-Spec trim.
ACCEPTANCE = {
    "full head, long context": 0.681,
    "32k trim, long context": 0.608,
    "full head, short prompts": 0.494,
}
MAP_SIZES = (65536, 32768, 16384)
CONTEXT = 128
INT4_GROUP = 32


@dataclass(frozen=True)
class Shape:
    name: str
    vocab: int
    hidden: int
    target_layers: int | None  # for the predicted speedup; None: no target estimate (a separate draft model)


SHAPES = {
    "qwen3.5-27b-mtp": Shape("qwen3.5-27b-mtp", 248_320, 5120, 64),
    "deepseek-v3-mtp": Shape("deepseek-v3-mtp", 129_280, 7168, 61),
    "gemma-3-1b": Shape("gemma-3-1b", 262_144, 1152, None),
    "tiny-mtp": Shape("tiny-mtp", 70_000, 256, 4),  # for tests/bench/test_head_costs.py: seconds, not minutes
}


def linear(i: int, o: int, device) -> nn.Linear:
    layer = nn.Linear(i, o, bias=False, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        layer.weight.normal_(0, 0.02)
    return layer


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w)


class GQALayer(nn.Module):
    """A pre-norm decoder layer: grouped-query attention over CONTEXT cached positions plus the new rows (Qwen3.5's
    with its sigmoid output gate), then a gated MLP."""

    def __init__(self, hidden, heads, kv_heads, head_dim, inter, device, out_gate=False, act=F.silu):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.out_gate, self.act = heads, kv_heads, head_dim, out_gate, act
        self.q = linear(hidden, heads * head_dim * (2 if out_gate else 1), device)
        self.k, self.v = linear(hidden, kv_heads * head_dim, device), linear(hidden, kv_heads * head_dim, device)
        self.o = linear(heads * head_dim, hidden, device)
        self.gate, self.up, self.down = linear(hidden, inter, device), linear(hidden, inter, device), linear(inter, hidden, device)
        self.norms = nn.Parameter(torch.ones(2, hidden, device=device, dtype=torch.bfloat16), requires_grad=False)
        self.qk_norm = nn.Parameter(torch.ones(2, head_dim, device=device, dtype=torch.bfloat16), requires_grad=False)
        cache = torch.randn(2, 1, kv_heads, CONTEXT, head_dim, device=device).to(torch.bfloat16)
        self.register_buffer("cache", cache, persistent=False)

    def forward(self, x):  # x [n, hidden]
        n = x.shape[0]
        h = rms(x, self.norms[0])
        q = self.q(h)
        if self.out_gate:
            q, g = q.view(n, self.heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = rms(q.reshape(n, self.heads, self.head_dim), self.qk_norm[0]).transpose(0, 1)[None]
        k = rms(self.k(h).view(n, self.kv_heads, self.head_dim), self.qk_norm[1]).transpose(0, 1)[None]
        v = self.v(h).view(n, self.kv_heads, self.head_dim).transpose(0, 1)[None]
        k, v = torch.cat([self.cache[0], k], 2), torch.cat([self.cache[1], v], 2)
        mask = torch.ones(n, CONTEXT + n, dtype=torch.bool, device=x.device).tril(CONTEXT)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)[0].transpose(0, 1)
        if self.out_gate:
            a = a * torch.sigmoid(g)
        x = x + self.o(a.reshape(n, -1))
        h = rms(x, self.norms[1])
        return x + self.down(self.act(self.gate(h)) * self.up(h))


class MLALayer(nn.Module):
    """DeepSeek-V3's layer: multi-head latent attention (expanded K/V cached for CONTEXT positions) and its MoE."""

    def __init__(self, device, hidden=7168, heads=128, q_lora=1536, kv_lora=512, nope=128, rope=64, v_dim=128,
                 expert_inter=2048, experts=256, top_k=8, pool=32):
        super().__init__()
        self.heads, self.kv_lora, self.nope, self.rope, self.v_dim = heads, kv_lora, nope, rope, v_dim
        self.top_k, self.experts = top_k, experts
        self.q_a, self.q_b = linear(hidden, q_lora, device), linear(q_lora, heads * (nope + rope), device)
        self.kv_a = linear(hidden, kv_lora + rope, device)
        self.kv_b = linear(kv_lora, heads * (nope + v_dim), device)
        self.o = linear(heads * v_dim, hidden, device)
        self.router = linear(hidden, experts, device)
        self.shared = nn.ModuleList([linear(hidden, expert_inter, device), linear(hidden, expert_inter, device),
                                     linear(expert_inter, hidden, device)])
        self.pool = nn.ModuleList(nn.ModuleList([linear(hidden, expert_inter, device), linear(hidden, expert_inter, device),
                                                 linear(expert_inter, hidden, device)]) for _ in range(pool))
        self.norms = nn.Parameter(torch.ones(2, hidden, device=device, dtype=torch.bfloat16), requires_grad=False)
        self.q_norm = nn.Parameter(torch.ones(q_lora, device=device, dtype=torch.bfloat16), requires_grad=False)
        self.kv_norm = nn.Parameter(torch.ones(kv_lora, device=device, dtype=torch.bfloat16), requires_grad=False)
        self.register_buffer("k_cache", torch.randn(1, heads, CONTEXT, nope + rope, device=device).to(torch.bfloat16),
                             persistent=False)
        self.register_buffer("v_cache", torch.randn(1, heads, CONTEXT, v_dim, device=device).to(torch.bfloat16),
                             persistent=False)

    @staticmethod
    def mlp(layers, x):
        return layers[2](F.silu(layers[0](x)) * layers[1](x))

    def forward(self, x):
        n = x.shape[0]
        h = rms(x, self.norms[0])
        q = self.q_b(rms(self.q_a(h), self.q_norm)).view(n, self.heads, -1).transpose(0, 1)[None]
        kv = self.kv_a(h)
        latent, k_rope = kv[:, : self.kv_lora], kv[:, self.kv_lora:]
        kv = self.kv_b(rms(latent, self.kv_norm)).view(n, self.heads, self.nope + self.v_dim)
        k = torch.cat([kv[..., : self.nope], k_rope[:, None].expand(n, self.heads, self.rope)], -1)
        k = torch.cat([self.k_cache, k.transpose(0, 1)[None]], 2)
        v = torch.cat([self.v_cache, kv[..., self.nope:].transpose(0, 1)[None]], 2)
        mask = torch.ones(n, CONTEXT + n, dtype=torch.bool, device=x.device).tril(CONTEXT)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[0].transpose(0, 1).reshape(n, -1)
        x = x + self.o(a)
        h = rms(x, self.norms[1])
        weights = torch.softmax(self.router(h).float(), -1).topk(self.top_k, -1).values.to(h.dtype)
        out = self.mlp(self.shared, h)
        routed = torch.zeros_like(h)
        # Every row's top-k experts taken as distinct from every other row's: min(n * top_k, experts) expert calls.
        calls = min(n * self.top_k, self.experts)
        for c in range(calls):
            row = c % n
            expert = self.pool[c % len(self.pool)]
            routed[row] += weights[row, c // n % self.top_k] * self.mlp(expert, h[row: row + 1])[0]
        return x + out + routed


class MTPBlock(nn.Module):
    """An MTP module around a decoder layer: norms of the token embedding and the previous hidden state, their
    concatenation projected back to the hidden size, the layer, the final norm."""

    def __init__(self, hidden, layer, device):
        super().__init__()
        self.fc = linear(2 * hidden, hidden, device)
        self.layer = layer
        self.norms = nn.Parameter(torch.ones(3, hidden, device=device, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, x):
        e, h = rms(x, self.norms[0]), rms(x, self.norms[1])
        return rms(self.layer(self.fc(torch.cat([e, h], -1))), self.norms[2])


class DraftModel(nn.Module):
    def __init__(self, layers, hidden, device):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = nn.Parameter(torch.ones(hidden, device=device, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return rms(x, self.norm)


def build_body(name: str, device) -> tuple[nn.Module, nn.Module]:
    """(the drafter's body, the one decoder layer a target's layer is estimated by)."""
    if name == "qwen3.5-27b-mtp":
        layer = GQALayer(5120, 24, 4, 256, 17408, device, out_gate=True)
        return MTPBlock(5120, layer, device), layer
    if name == "deepseek-v3-mtp":
        layer = MLALayer(device)
        return MTPBlock(7168, layer, device), layer
    if name == "tiny-mtp":
        layer = GQALayer(256, 4, 2, 64, 512, device, out_gate=True)
        return MTPBlock(256, layer, device), layer
    if name == "gemma-3-1b":
        gelu = lambda t: F.gelu(t, approximate="tanh")  # noqa: E731
        layers = [GQALayer(1152, 4, 1, 256, 6912, device, act=gelu) for _ in range(26)]
        return DraftModel(layers, 1152, device), layers[0]
    raise SystemExit(f"unknown shape {name}")


def quantize_body(body: nn.Module, fmt: str) -> nn.Module:
    from frspec.models.quant import quantize_model

    return body if fmt == "bf16" else quantize_model(body, fmt, group_size=INT4_GROUP, head=False)


class Head(nn.Module):
    """An LM head over `rows` rows of a vocab x hidden matrix in one format, and the argmax over its logits."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x).argmax(-1)


def build_heads(shape: Shape, fmt: str, sizes: list[int], device, chunk_above: int = 1 << 28) -> dict[int, Head]:
    """size -> head over that many rows (the full vocabulary first). Built without a float32 copy of the full
    matrix (2.5 GB in bf16 for Qwen3.5), sharing storage between sizes where the layout allows."""
    from frspec.models import quant_kernels as K
    from frspec.models.quant import Int4Linear, Int4Weight, Int8Linear, Int8Weight

    n, k = shape.vocab, shape.hidden
    gen = torch.Generator(device="cpu").manual_seed(0)
    heads: dict[int, Head] = {}
    if fmt == "bf16":
        weight = torch.empty(n, k, dtype=torch.bfloat16, device=device)
        for i in range(0, n, 16384):
            weight[i: i + 16384].normal_(0, 0.02)
        for size in sizes:
            lin = nn.Linear(k, size, bias=False, device="meta")
            lin.weight = nn.Parameter(weight[:size], requires_grad=False)  # the first rows: a view, contiguous
            heads[size] = Head(lin)
        return heads
    if fmt == "int8":
        values = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen).to(device)
        scale = torch.rand(n, generator=gen) * 1e-3
        for size in sizes:
            heads[size] = Head(Int8Linear(Int8Weight(values[:size], scale[:size]), None, torch.bfloat16, device))
        return heads
    # int4: the CPU packed layout is row-separable (blocks of 16 rows), so pack 16k-row chunks (the packer
    # widens codes to int32: the whole head at once would need 5 GB) and slice; CUDA gets each size packed whole.
    groups = k // INT4_GROUP
    scale = torch.rand(n, groups, generator=gen) * 1e-3
    minimum = -8 * scale
    chunk = 16384
    if torch.device(device).type == "cpu" and n * k > chunk_above:
        first = Int4Linear(Int4Weight(torch.zeros(16, k, dtype=torch.uint8), scale[:16], minimum[:16], INT4_GROUP),
                           None, torch.bfloat16, device)
        packed = torch.cat([K.pack_int4_cpu(torch.randint(0, 16, (min(chunk, n - i), k), dtype=torch.uint8,
                                                          generator=gen)) for i in range(0, n, chunk)])
        sz = K.scales_and_zeros(scale, minimum, torch.bfloat16)
        for size in sizes:
            head = Int4Linear.__new__(Int4Linear)
            nn.Module.__init__(head)
            head.out_features, head.in_features, head.group_size, head.kernel = size, k, INT4_GROUP, first.kernel
            head.register_buffer("bias", None, persistent=False)
            head.register_buffer("packed", packed[:size], persistent=False)
            head.register_buffer("scales_and_zeros", sz[:, :size].contiguous(), persistent=False)
            heads[size] = Head(head)
        return heads
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen)
    for size in sizes:
        heads[size] = Head(Int4Linear(Int4Weight(codes[:size], scale[:size], minimum[:size], INT4_GROUP), None,
                                      torch.bfloat16, device))
    return heads


def timed(fn, x, device) -> float:
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    fn(x)
    sync()
    return time.perf_counter() - start


@torch.inference_mode()
def measure(shape: Shape, fmt: str, rows: list[int], predict_rows: list[int], repeats: int, warmup: int,
            device) -> dict:
    """Median seconds of the body, each head and (for predictions) the decoder layer at each row count. Every round
    times every (module, rows) once, in the same order, so a load change on the machine hits all of them alike
    rather than whichever was being timed at the time."""
    body, layer = build_body(shape.name, device)
    body = quantize_body(body, fmt)
    sizes = [shape.vocab, *[s for s in MAP_SIZES if s < shape.vocab]]
    heads = build_heads(shape, fmt, sizes, device)
    gen = torch.Generator(device="cpu").manual_seed(1)
    tasks = []  # (kind, key, rows, module, input)
    for n in sorted(set(rows) | set(predict_rows) | {1}):
        x = (torch.randn(n, shape.hidden, generator=gen) * 0.1).to(device, torch.bfloat16)
        if n in rows or n == 1:
            tasks.append(("body", None, n, body, x))
        for size, head in heads.items():
            if n in rows or n == 1 or (size == shape.vocab and n in predict_rows):
                tasks.append(("head", str(size), n, head, x))
        if shape.target_layers and n in predict_rows:
            tasks.append(("layer", None, n, layer, x))
    samples: dict[tuple, list[float]] = {}
    for r in range(warmup + repeats):
        for kind, key, n, module, x in tasks:
            t = timed(module, x, device)
            if r >= warmup:
                samples.setdefault((kind, key, n), []).append(t)
    out: dict = {"body": {}, "head": {str(s): {} for s in sizes}, "layer": {}}
    for (kind, key, n), ts in samples.items():
        median = sorted(ts)[len(ts) // 2]
        (out[kind] if key is None else out[kind][key])[n] = median
    for n in sorted({t[2] for t in tasks}):
        timed_ = [f"body {1e3 * out['body'][n]:.2f} ms"] if n in out["body"] else []
        timed_ += [f"head[{s}] {1e3 * out['head'][str(s)][n]:.2f}" for s in sizes if n in out["head"][str(s)]]
        timed_ += [f"layer {1e3 * out['layer'][n]:.2f}"] if n in out["layer"] else []
        print(f"  {shape.name} {fmt} rows={n}: " + ", ".join(timed_), flush=True)
    del body, heads
    return out


def predictions(shape: Shape, m: dict) -> dict:
    """Best chain length and speedup over plain decoding for each head and acceptance rate (module docstring)."""
    from frspec.tune.cost_model import expected_tokens

    full = str(shape.vocab)
    target: dict[int, float] = {}
    for n in sorted(m["layer"]):
        estimate = shape.target_layers * m["layer"][n] + m["head"][full][n]
        # A forward over more rows reads the same weights and does more work: never cheaper than one over fewer.
        # (Timing noise on a shared machine otherwise makes 1 row dearer than 3 and the speedup exceed k + 1.)
        target[n] = max(estimate, target.get(n - 1, 0.0))
    out = {}
    for size, head in m["head"].items():
        draft = m["body"][1] + head[1]
        for label, a in ACCEPTANCE.items():
            rates = {k: expected_tokens(k, a) / (target[k + 1] + k * draft) for k in range(1, 5) if k + 1 in target}
            best = max(rates, key=rates.get)
            out[f"{size}|{label}"] = {"k": best, "speedup": rates[best] * target[1], "draft_s": draft,
                                      "target1_s": target[1]}
    return out


def machine() -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    except OSError:
        info["cpu"] = platform.processor()
    info["load_average_before"] = os.getloadavg()
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                        cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        info["commit"] = "?"
    return info


def table(results: dict, rows: list[int]) -> str:
    """Markdown: per drafter and format, the step (body + head) in ms per row count with each head, and the head's
    share of the full-head step."""
    lines = ["| drafter | format | rows | body ms | full head ms (share) | step full | 64k | 32k | 16k | step 32k vs full |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, per_fmt in results.items():
        vocab = str(SHAPES[name].vocab)
        for fmt, m in per_fmt.items():
            for n in rows:
                body = m["body"].get(n) or m["body"].get(str(n))
                if body is None:
                    continue
                head = {s: (h.get(n) or h.get(str(n))) for s, h in m["head"].items()}
                step = {s: body + h for s, h in head.items() if h is not None}
                cells = [f"{1e3 * step[str(s)]:.1f}" if str(s) in step else "-" for s in MAP_SIZES]
                lines.append(f"| {name} | {fmt} | {n} | {1e3 * body:.1f} | {1e3 * head[vocab]:.1f} "
                             f"({100 * head[vocab] / step[vocab]:.0f}%) | {1e3 * step[vocab]:.1f} | "
                             + " | ".join(cells) + f" | {step[vocab] / step['32768']:.2f}x |")
    return "\n".join(lines)


def prediction_table(preds: dict) -> str:
    """Markdown: predicted speedup over decoding without drafts (best chain length k in brackets) per drafter and
    format, for each head at each acceptance rate of ACCEPTANCE."""
    labels = list(ACCEPTANCE)
    lines = []
    for label in labels:
        a = ACCEPTANCE[label]
        if not lines:
            lines = ["| drafter | format | acceptance a | full head | 64k | 32k | 16k |", "|---|---|---|---|---|---|---|"]
        for name, per_fmt in preds.items():
            vocab = SHAPES[name].vocab
            for fmt, p in per_fmt.items():
                cells = []
                for size in (vocab, *MAP_SIZES):
                    v = p.get(f"{size}|{label}")
                    cells.append(f"{v['speedup']:.2f}x (k={v['k']})" if v else "-")
                lines.append(f"| {name} | {fmt} | {a:.3f} ({label}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="qwen3.5-27b-mtp,deepseek-v3-mtp,gemma-3-1b")
    p.add_argument("--formats", default="bf16,int8,int4")
    p.add_argument("--rows", default="1,4,16")
    p.add_argument("--no-predict", action="store_true", help="skip the target-layer timings and predictions")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", required=True, help="directory for head_costs.json and head_costs.md")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    predict_rows = [] if args.no_predict else [1, 2, 3, 4, 5]
    info = machine()
    print(json.dumps(info), flush=True)
    results: dict = {}
    preds: dict = {}
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        for fmt in args.formats.split(","):
            start = time.perf_counter()
            m = measure(shape, fmt, rows, predict_rows if shape.target_layers else [], args.repeats, args.warmup,
                        args.device)
            results.setdefault(name, {})[fmt] = m
            if shape.target_layers and predict_rows:
                preds.setdefault(name, {})[fmt] = predictions(shape, m)
            print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)
    info["load_average_after"] = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "head_costs.json").write_text(json.dumps({"machine": info, "args": vars(args), "acceptance": ACCEPTANCE,
                                                     "seconds": results, "predictions": preds}, indent=1))
    text = f"{table(results, rows)}\n\n{prediction_table(preds)}\n" if preds else table(results, rows) + "\n"
    (out / "head_costs.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
