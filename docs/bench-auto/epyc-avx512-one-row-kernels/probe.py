"""One-row and four-row forward costs of the bf16 target under kernel settings (run under each env in turn)."""
import os, sys, time, json
import torch
import torch.nn.functional as F
from frspec.models.loading import load_model, set_threads
set_threads(2)
if os.environ.get("PROBE_NO_MKLDNN") == "1":
    torch.backends.mkldnn.enabled = False
W = torch.randn(8960, 1536).bfloat16()
def med(fn, n=20):
    fn(); fn()
    ts = []
    for _ in range(n):
        s = time.perf_counter(); fn(); ts.append(time.perf_counter() - s)
    return sorted(ts)[n // 2] * 1e3
out = {}
with torch.inference_mode():
    for r in (1, 2, 4, 8):
        x = torch.randn(r, 1536).bfloat16()
        out[f"linear_{r}"] = round(med(lambda: F.linear(x, W)), 2)
    target = load_model("qwen2.5-coder-1.5b-instruct")
    from transformers import DynamicCache
    ids = torch.randint(100, 5000, (1, 128))
    for r in (1, 2, 4):
        def fwd():
            cache = DynamicCache()
            target(input_ids=ids, past_key_values=cache, use_cache=True)
            return cache
        cache = fwd()
        step = torch.randint(100, 5000, (1, r))
        def one():
            target(input_ids=step, past_key_values=cache, use_cache=True)
            cache.crop(-r)
        out[f"target_{r}row_ms"] = round(med(one, 10), 1)
    if os.environ.get("PROBE_PROFILE") == "1":
        step = torch.randint(100, 5000, (1, 1))
        with torch.profiler.profile() as prof:
            for _ in range(3):
                target(input_ids=step, past_key_values=cache, use_cache=True); cache.crop(-1)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
print(os.environ.get("PROBE_LABEL"), json.dumps(out), flush=True)
