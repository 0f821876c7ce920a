"""The controller's costs on this machine: measured once per machine and model pair, then read from the cache.

A short measurement (decode/step_costs.py's model): the target's forward over 1..max_rows rows after contexts of
128, 512 and 2048 tokens (`CONTEXTS`, those the models' positions allow; one growing random prefix, so 2048
tokens are prefilled once in all), a draft model's one-row forward at the same contexts and its forward over
`CATCH_UP_ROWS` rows (what catching up after plain steps costs it; on both sides of the row count where its calls
start going through fp32, models/wide_linear.py, too) and over `PREFILL_ROWS` rows (prefilling a prompt, whose
cost per row grows with its length), the drafter's LM head at
each map size the controller may choose, and two short engine runs (plain and speculative, after a warm-up, at the
shortest context) for the draft forward and the per-step overheads as the engine really spends them. The
controller then reads the costs at each request's current context (prompt + generated tokens). A few seconds for
a tiny model; see docs/auto.md for a 1.5B bf16 pair on a 2-core CPU.

The result is cached as JSON under <frspec cache>/step_costs/, keyed by the machine (CPU or GPU name, torch
version and threads), both models (name or path, class, dtype, parameter count, weight format: float or each
int4/int8 kind with its kernel and group size) and the drafter's head (its rows and weight format: a draft
model's head is quantized apart from the model), and what was measured; the file names the machine it was
measured on. Models without a name or path (built in memory) are measured every time, never cached: nothing would
tell two of them apart.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Sequence

import torch

from frspec.decode.cost_calibration import STALE_LEVEL, StepTimings, load_timings, timings_path
from frspec.decode.drafter import Drafter
from frspec.decode.engine import SpeculativeGenerator
from frspec.decode.sampling import SamplingParams
from frspec.decode.step_costs import StepCosts, draft_forward_widths, measure_row_costs_by_context
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError
from frspec.io import atomic_path
from frspec.models import one_row_linear
from frspec.models.loading import max_positions_of
from frspec.models.quant import QuantizedLinear
from frspec.models.wide_linear import wide_rows as wide_linear_rows
from frspec.vocab.ranked_vocab import RankedVocab
from frspec.paths import cache_dir

log = logging.getLogger(__name__)  # the `frspec` command prints its records on stderr (cli.py)

CACHE_VERSION = 9  # 2: per-context target and draft costs; the drafter head's weight format in the key; 3: a draft
# model's forward over CATCH_UP_ROWS rows; 4: wide half-precision calls through fp32 (models/wide_linear.py);
# 5: a draft model's forward over PREFILL_ROWS rows; 6: one-row half-precision calls on the faster kernel
# (models/one_row_linear.py); 7: int4 prefills dequantize from 256 rows (models/quant_kernels.py), and a draft model's
# forward is timed over 256 rows too, and every width twice, the faster kept (a stall only adds time); 8: one entry
# per pair and drafted shape, serving every map size and row count it was measured for (named in its provenance);
# 9: int4 prefills dequantize straight to fp32 into a reused buffer, from 128 rows where calls widen
# (models/call_weight.py), and a draft model's forward is timed over 128 rows too
# A draft model is also timed over this many rows at once: what it pays to catch up after plain steps or to prefill
# a prompt (StepCosts.catch_up_s), which the controller weighs before drafting (decode/controller.py).
CATCH_UP_ROWS = 64
# ... and, twice each, over these many (a long prompt's prefill; beyond the longest the curve goes on linearly). 128
# and 256: where an int4 drafter's calls start dequantizing (quant_kernels.INT4_DEQUANT_ROWS_WIDENED on a machine
# whose wide calls go through fp32, INT4_DEQUANT_ROWS elsewhere), a step a line from 64 rows to 512 would miss; 256
# is also the shortest prompt window (decode/draft_model.py).
PREFILL_ROWS = (128, 256, 512, 1024)
# Context lengths the target's (and a draft model's) forwards are timed after: a short prompt, a long one, a long
# document (the controller interpolates in between and extrapolates beyond, decode/step_costs.py).
CONTEXTS = (128, 512, 2048)

# A forward over one row read at this many times the one over two is a stall, not the curve: measured while
# `scripts/setup_vllm.sh` installed, an AVX2 EPYC's bf16 table read 1 row at 1,701 ms and 2 at 511 ms (interleaved
# rounds, lower median), and the quick bench's first request drafted on it where every draft loses (0.90x vanilla).
# In the tables and kernel timings of docs/benchmarks.md one row costs less than two (the AVX2 EPYC's int4 tables:
# 150 and 234 ms against 172 and 272), so a false alarm costs one more measurement, nothing else.
ONE_ROW_STALL = 1.5


def cpu_model() -> str:
    """The CPU's marketing name (from /proc/cpuinfo on Linux), falling back to platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def kernel_isa() -> str:
    """The instruction set torch's CPU kernels use: ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA can lower it (an
    AVX-512 machine told to use AVX2 has another cost curve), e.g. "AVX512" or "AVX2, oneDNN <= AVX2"."""
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA")
    return torch.backends.cpu.get_cpu_capability() + (f", oneDNN <= {onednn}" if onednn else "")


def machine_name(device: torch.device) -> str:
    """What the costs depend on besides the models: the processor that runs them, the instruction set its kernels
    use (`kernel_isa`) and torch's threads."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (torch {torch.__version__})"
    return f"{cpu_model()} [{kernel_isa()}], {torch.get_num_threads()} threads (torch {torch.__version__})"


def weight_format(module: torch.nn.Module) -> str:
    """How a module's linear layers are stored, which changes what a forward costs: "float" (in the parameters'
    dtype) or each quantized kind with its kernel and group size (models/quant.py), e.g. "Int4Linear/cpu_int4/g32"."""
    kinds = sorted({f"{type(m).__name__}/{getattr(m, 'kernel', '')}/g{getattr(m, 'group_size', '-')}"
                    for m in module.modules() if isinstance(m, QuantizedLinear)})
    return ",".join(kinds) or "float"


def model_identity(model: torch.nn.Module) -> str | None:
    """A model's name or path with what changes its speed (class, dtype, size, weight format, from how many rows
    its calls go through fp32, whether its one-row calls run without oneDNN); None for a model without a name or
    path."""
    config = getattr(model, "config", None)
    name = getattr(config, "_name_or_path", None) or getattr(config, "name_or_path", None)
    if not name:
        return None
    param = next(model.parameters())
    count = sum(p.numel() for p in model.parameters())
    wide = wide_linear_rows(param.dtype, param.device)
    one_row = one_row_linear.on_this_machine(param.dtype, param.device)
    return (f"{name}|{type(model).__name__}|{param.dtype}|{count}|{weight_format(model)}"
            + (f"|fp32 from {wide} rows" if wide else "") + ("|one row native" if one_row else ""))


def drafter_identity(drafter: Drafter) -> str | None:
    """The drafting model's identity and its drafter head's: the head is the drafter's own copy of the kept rows,
    quantized apart from the model (`--draft-quant` on a draft model's head), so a float and an int4 head of one
    draft model cost differently."""
    model = model_identity(drafter.weights)
    if model is None:
        return None
    vocab = drafter.vocab
    rows = vocab.full_size if isinstance(vocab, RankedVocab) else vocab.size  # a ranked head's size moves
    return f"{model}|head:{type(vocab).__name__}/{rows}/{weight_format(vocab.head)}"


def step_costs_path(target: torch.nn.Module, drafter: Drafter, shape: TreeShape | None = None,
                    contexts: Sequence[int] = CONTEXTS) -> Path | None:
    """Where this machine's costs for the pair are cached (None for models without a name or path): one entry
    whatever map sizes and draft lengths are asked of it (`cached_step_costs`). The forwards timed since
    (decode/cost_calibration.py) are kept beside it, in `timings_path(path)`."""
    device = next(target.parameters()).device
    ids = (model_identity(target), drafter_identity(drafter))
    if None in ids:
        return None
    what = json.dumps([CACHE_VERSION, machine_name(device), str(device), *ids, str(shape), sorted(contexts)])
    return cache_dir() / "step_costs" / f"{hashlib.sha256(what.encode()).hexdigest()[:16]}.json"


def cached_step_costs(target: torch.nn.Module, drafter: Drafter, sizes: Sequence[int], max_rows: int,
                      shape: TreeShape | None = None, refresh: bool = False,
                      contexts: Sequence[int] = CONTEXTS) -> tuple[StepCosts, StepTimings]:
    """This machine's costs for the pair, from the cache when it has them, else measured (and cached), and the
    forwards timed against them since (decode/cost_calibration.py; kept beside them, empty for new costs). A
    cached table the forwards timed since ran far off (cost_calibration.STALE_LEVEL) is measured again.

    One entry serves every request of the pair whose map `sizes` and `max_rows` it was measured for (its provenance
    names them): the quick bench's maps up to 32k and a later `generate --draft` with every size read one table,
    not two measurements of minutes each. Asked for a size or row count it lacks, it is measured again for those
    and its own together, so the entry only grows."""
    device = next(target.parameters()).device
    machine = machine_name(device)
    ids = (model_identity(target), drafter_identity(drafter))
    path = step_costs_path(target, drafter, shape, contexts)
    kept = None if path is None else timings_path(path)
    sizes, max_rows = sorted({int(k) for k in sizes}), int(max_rows)
    if path is not None and path.is_file() and not refresh:
        try:
            cached = StepCosts.from_dict(json.loads(path.read_text(encoding="utf-8")), f"cached costs {path}")
        except (FrspecError, json.JSONDecodeError, OSError):
            cached = None  # a damaged cache entry is measured again and overwritten
        if cached is not None:
            provenance = cached.provenance
            had = (sorted(int(k) for k in provenance.get("sizes") or ()), int(provenance.get("max_rows") or 0))
            # Whatever is measured again covers the entry's own sizes and rows too: it only grows.
            sizes, max_rows = sorted(set(sizes) | set(had[0])), max(max_rows, had[1])
            if (sizes, max_rows) != had:
                log.info("the cached step costs (%s) were measured for map sizes %s and up to %d rows: measuring "
                         "them again for %s and up to %d", path.name, *had, sizes, max_rows)
            else:
                timings = load_timings(kept, cached)
                level = timings.level()
                if level is None or abs(level - 1.0) <= STALE_LEVEL:
                    return cached, timings
                # The forwards timed since ran far off it (decode/cost_calibration.py): measured again, and the
                # timings, kept against the old table, start over.
                log.info("the cached step costs (%s) are %.0f%% off what the forwards timed since took: measuring "
                         "them again", path.name, abs(level - 1.0) * 100)
    # Up to minutes on a CPU for a 1.5B pair: say so, or a first `generate --draft` looks hung.
    log.info("measuring this machine's step costs for the controller (once per machine and model pair; %s)",
             f"cached in {path.parent}" if path is not None else "models without a path are not cached")
    start = time.perf_counter()
    costs = measure_step_costs(target, drafter, sizes, max_rows, shape, contexts)
    wall = time.perf_counter() - start
    log.info("step costs measured in %.0f s", wall)
    costs.provenance.update({"machine": machine, "device": str(device), "target": ids[0], "drafter": ids[1],
                             "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                             "measure_wall_s": round(wall, 2), "sizes": sizes, "max_rows": max_rows})
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(costs.to_dict(), indent=2) + "\n", encoding="utf-8")
    return costs, StepTimings(costs, path=kept)  # timings kept against an older table do not apply: start over


@torch.inference_mode()
def measure_step_costs(target: torch.nn.Module, drafter: Drafter, sizes: Sequence[int], max_rows: int,
                       shape: TreeShape | None = None, contexts: Sequence[int] = CONTEXTS,
                       new_tokens: int = 16) -> StepCosts:
    """Measure the cost model's terms (module docstring). `sizes`: the map sizes to time the head at;
    `max_rows`: the most rows a step's target forward may have; `shape`: a tree the drafter drafts (its level
    widths are timed too); `contexts`: the context lengths the target's (and a draft model's) forwards are timed
    after (those the models' positions allow)."""
    contexts = usable_contexts(contexts, [target, drafter.weights], max_rows + new_tokens + 8)
    rows = sorted({n for n in (1, 2, 3, 4, 5, 7, 9, 12, 16) if n < max_rows} | {max_rows})
    # Every row count at the shortest context; at the longer ones 1, 2, the middle and the most (in between, the
    # shortest context's shape: step_costs.interpolate_like), which keeps the one-time measurement short.
    later = sorted({1, min(2, max_rows), (max_rows + 1) // 2, max_rows})

    def measure_target() -> dict[int, dict[int, float]]:
        return measure_row_costs_by_context(target, rows, contexts, repeats=3, warmup=1, later_rows=later)

    target_by_context = measure_target()
    if stalled_one_row(target_by_context):
        # A stall only adds time: measured again, each entry the faster of the two readings.
        log.info("the target's one-row forward read at %.1fx or more its two-row one (another process's load): "
                 "measuring it again", ONE_ROW_STALL)
        again = measure_target()
        target_by_context = {c: {n: min(t, again[c][n]) for n, t in by_rows.items()}
                             for c, by_rows in target_by_context.items()}
    vocab = drafter.vocab
    widths = sorted({1, *(draft_forward_widths(shape) if shape is not None else [])})
    # Hidden states like the drafter's own (its embeddings stay float when its head is int4/int8).
    like = next(drafter.weights.parameters())
    heads = {int(k): head_costs(vocab, int(k), widths, like) for k in sizes}

    base = contexts[0]
    vocab_size = int(target.config.vocab_size)
    prompt = torch.randint(0, vocab_size, (base,), generator=torch.Generator().manual_seed(0)).tolist()
    full = vocab.full_size if isinstance(vocab, RankedVocab) else None
    before = vocab.map_size if full is not None else vocab.size
    if full is not None:
        vocab.set_size(max(sizes))
    try:
        plain = _engine_run(SpeculativeGenerator(target), prompt, new_tokens)
        spec = _engine_run(SpeculativeGenerator(target, drafter, tree=TreeShape.chain(2)), prompt, new_tokens)
    finally:
        if isinstance(vocab, RankedVocab):
            vocab.set_size(before)

    def beyond_forwards(stats) -> float:
        return max(stats.overhead_time_s / max(stats.target_forwards, 1), 0.0)

    per_forward = max((spec.draft_time_s - spec.draft_lm_head_time_s) / max(spec.draft_steps, 1), 0.0)
    draft_by_context = {}
    body = getattr(drafter.weights, "base_model", drafter.weights)  # a draft model's body, without its head
    if drafter.kind == "draft" and len(contexts) > 1:
        # A draft model attends over the whole context too: its forward at context L costs the engine's measured
        # forward (at the shortest context) plus what one row of its body costs more at L than there (never less:
        # a longer context adds work, and a noisy difference must not make long-context drafts look free). EAGLE
        # and MTP heads are one layer over the target's states: their forward is taken as the same at every
        # context. One body row is cheap next to the target's forwards: more repeats for a steadier difference.
        by_context = measure_row_costs_by_context(body, [1], contexts, repeats=5, warmup=2)
        draft_by_context = {c: {1: per_forward + max(by_context[c][1] - by_context[base][1], 0.0)}
                            for c in contexts}
    draft_base = {1: per_forward}
    limit = max_positions_of(drafter.weights)
    wide_rows = CATCH_UP_ROWS if limit is None else min(CATCH_UP_ROWS, limit - base - 1)
    if drafter.kind == "draft" and wide_rows >= 2:
        # Its forward over many rows, once (the extra rows' cost is taken as the same at every context). Where its
        # calls go through fp32 from some rows on (models/wide_linear.py), the curve bends there: timed on both
        # sides of the bend too, so a catch-up just short of it is not read off the cheaper side's line.
        knee = wide_linear_rows(like.dtype, like.device)
        widths = sorted({1, wide_rows, *((knee - 1, knee) if knee and 2 < knee < wide_rows else ())})
        wide = measure_row_costs_by_context(body, widths, [base], repeats=2, warmup=1)[base]
        # A prompt's prefill costs more per row the longer it is (each row attends over the rows before it): a
        # line through 1 and 64 rows put a 0.5B drafter's prefill over a 3,754-token prompt at 8.7 s where it took
        # 19.8 s (AVX512 EPYC, bf16). Longer widths, twice each (the kernels are warm by now; the faster time is
        # kept: measure_row_costs_by_context), extend the curve.
        longer = [n for n in PREFILL_ROWS if n > wide_rows and (limit is None or n <= limit - base - 1)]
        if longer:
            wide.update(measure_row_costs_by_context(body, longer, [base], repeats=2, warmup=0)[base])
            widths += longer
        extras = {n: max(wide[n] - wide[1], 0.0) for n in widths[1:]}
        # The prefill widths lie beyond any fp32 bend, on the widest short width's side: never cheaper than it or
        # than each other (a noisy pair must not bend the curve down). Across the bend more rows may cost less.
        for shorter, n in zip([wide_rows, *longer], longer):
            extras[n] = max(extras[n], extras[shorter])
        for n, extra in extras.items():
            draft_base[n] = per_forward + extra
            for per_width in draft_by_context.values():
                per_width[n] = per_width[1] + extra
    return StepCosts(target_by_context[base], draft_base, heads,
                     step_overhead_s=beyond_forwards(spec), vanilla_overhead_s=beyond_forwards(plain),
                     full_size=vocab.full_size if isinstance(vocab, RankedVocab) else int(vocab.size),
                     context=base, target_by_context=target_by_context if len(contexts) > 1 else {},
                     draft_base_by_context=draft_by_context)


def usable_contexts(contexts: Sequence[int], models: Sequence[torch.nn.Module], room: int) -> list[int]:
    """The context lengths (ascending) that leave `room` positions in every model; a model too short for any
    gets one context of a quarter of its positions."""
    limits = [n for n in (max_positions_of(m) for m in models) if n is not None]
    limit = min(limits) if limits else None
    wanted = sorted({int(c) for c in contexts})
    if not wanted or wanted[0] < 1:
        raise FrspecError(f"context lengths must be >= 1, got {list(contexts)}")
    if limit is None:
        return wanted
    fitting = [c for c in wanted if c + room <= limit]
    return fitting or [max(1, min(wanted[0], limit // 4))]


def _engine_run(generator: SpeculativeGenerator, prompt: list[int], new_tokens: int):
    generator.generate(input_ids=prompt, max_new_tokens=4, eos_token_ids=[], sampling=SamplingParams())  # warm-up
    return generator.generate(input_ids=prompt, max_new_tokens=new_tokens, eos_token_ids=[],
                              sampling=SamplingParams()).stats


def head_costs(vocab, k: int, widths: Sequence[int], like: torch.Tensor, repeats: int = 5, warmup: int = 2
               ) -> dict[int, float]:
    """Median seconds of the drafter's head over its first k rows and picking its choices, per width; hidden states
    in `like`'s dtype and device. The head may be quantized (int4/int8 keep no float `weight`): only its input size
    is read."""
    ranked = isinstance(vocab, RankedVocab)
    gen = torch.Generator().manual_seed(0)
    out = {}
    for n in widths:
        hidden = torch.randn(n, vocab.head.in_features, generator=gen).to(like.device, like.dtype)
        times = []
        for i in range(warmup + repeats):
            start = time.perf_counter()
            with one_row_linear.kernel_for(hidden):  # as the drafters call their heads
                logits = vocab.logits(hidden, k) if ranked else vocab.logits(hidden)
            picked = logits.argmax(-1) if n == 1 else torch.topk(logits.float(), min(3, k), dim=-1).indices
            vocab.to_target(picked).tolist()  # the drafter reads its choices back: that syncs a GPU too
            if i >= warmup:
                times.append(time.perf_counter() - start)
        out[n] = statistics.median(times)
    return out


def stalled_one_row(by_context: dict[int, dict[int, float]]) -> bool:
    """Whether a target's measured forwards ({context: {rows: seconds}}) read one row at ONE_ROW_STALL times or
    more two rows' at some context: a stall of another process, to be measured again."""
    return any(1 in by_rows and 2 in by_rows and by_rows[1] >= ONE_ROW_STALL * by_rows[2]
               for by_rows in by_context.values())
