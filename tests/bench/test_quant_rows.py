"""The bench's quantized rows and llama.cpp peer row: the plan, losslessness against the quantized target's own
vanilla row, the summary's references, and `frspec bench --quick` on a CPU with both (tiny models, seconds)."""

import json
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from frspec.bench.methods import DRAFT, FRSPEC, LLAMACPP, VANILLA, Method, plan_methods
from frspec.bench.runner import run_benchmark
from frspec.bench.summary import summarize
from frspec.cli import main
from frspec.decode.stats import GenerationStats
from frspec.decode.tree_shape import TreeShape
from frspec.models.quant import quantize_model
from frspec.models.tokenizer import load_tokenizer
from frspec.vocab.counting import count_tokens
from frspec.vocab.token_map import TokenMap

from tests.bench.conftest import CORPUS, VOCAB


def test_quantized_plan_labels_and_references():
    methods = plan_methods([2], [16], quant="int4") + [Method(LLAMACPP)]
    assert [m.label for m in methods] == ["int4 vanilla", "int4 draft k=2", "int4 fr-spec k=2 map=16",
                                          "llama.cpp vanilla"]
    assert methods[2].same_drafter_without_frspec == Method.drafting(DRAFT, TreeShape.chain(2), quant="int4")
    assert methods[1].reference == Method(VANILLA, quant="int4") == methods[0]
    assert methods[3].reference == Method(VANILLA, quant="int4")  # llama.cpp: compared with frspec int4
    # Unquantized rows keep the plain vanilla.
    assert Method.drafting(FRSPEC, TreeShape.chain(2), 16).reference == Method(VANILLA)
    with pytest.raises(ValueError):
        Method(LLAMACPP, 3)
    with pytest.raises(ValueError):
        Method(LLAMACPP, quant="int4")


def _pairs(tiny_dirs, dtype=torch.float32):
    """The tiny target and draft in fp32, and an int4 copy of each (the draft's head left float, as the bench
    loads it: the drafter quantizes its own full or pruned head)."""
    target_dir, draft_dir = tiny_dirs

    def load(path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()

    q_target, q_draft = load(target_dir), load(draft_dir)
    quantize_model(q_target, "int4")
    quantize_model(q_draft, "int4", head=False)
    return load(target_dir), load(draft_dir), (q_target, q_draft), load_tokenizer(str(target_dir))


class FakePeer:
    """Stands in for LlamaCppGreedy: returns a fixed greedy continuation (what llama.cpp would decode)."""

    def __init__(self, tokens):
        self.tokens, self.calls = tokens, 0

    def generate(self, prompt_ids, max_new_tokens, eos_ids):
        self.calls += 1
        start = time.perf_counter()
        out = self.tokens[:max_new_tokens]
        n = len(out)
        end = time.perf_counter() + 1e-3
        return list(out), GenerationStats(prompt_tokens=len(prompt_ids), tokens=n, decode_tokens=n - 1,
                                          target_forwards=n - 1, prefill_time_s=1e-4, target_time_s=end - start,
                                          wall_time_s=end - start + 1e-4)


def test_quantized_rows_match_their_own_vanilla_and_peer_row_is_reported(tiny_dirs):
    target, draft, quantized, tok = _pairs(tiny_dirs)
    maps = {16: TokenMap.from_counts(count_tokens(tok, CORPUS, vocab_size=VOCAB), top_k=16)}
    from frspec.bench.datasets import encode_prompt

    prompts = [(f"p{i}", encode_prompt(tok, t)) for i, t in enumerate(["Write a travel story.", "Why a fox?"])]
    methods = plan_methods([2], [16]) + plan_methods([2], [16], quant="int4") + [Method(LLAMACPP)]
    peer = FakePeer([5, 6, 7, 8, 9, 10, 11, 12, 13, 14])
    result = run_benchmark(target, draft, tok, prompts, methods, maps, max_new_tokens=10, progress=False,
                           quantized={"int4": quantized}, llamacpp=peer)
    assert peer.calls == 1 + len(prompts)  # warm-up and one per prompt, interleaved with the others
    # fp32 activations: every speculative row, quantized or not, is its own target's vanilla token for token.
    assert result.divergences == []
    outputs = {(g.method.quant, g.prompt_id): g.token_ids for g in result.generations if g.method.kind == VANILLA}
    for g in result.generations:
        if g.method.kind != LLAMACPP:
            assert g.token_ids == outputs[(g.method.quant, g.prompt_id)]
    # The quantized target is another function: the test would be vacuous if int4 and fp32 agreed everywhere.
    q_logits = quantized[0](input_ids=torch.tensor([prompts[0][1]])).logits
    assert not torch.equal(q_logits, target(input_ids=torch.tensor([prompts[0][1]])).logits)

    rows = {r["label"]: r for r in summarize(result)}
    assert rows["int4 fr-spec k=2 map=16"]["greedy_identical"] == "yes"
    assert rows["int4 fr-spec k=2 map=16"]["reference"] == "int4 vanilla"
    assert rows["llama.cpp vanilla"]["greedy_identical"] == "n/a (llama.cpp)"
    assert rows["llama.cpp vanilla"]["reference"] == "int4 vanilla"
    peer_rate = rows["llama.cpp vanilla"]["decode_tokens_per_s"]
    for label, row in rows.items():
        if label != "llama.cpp vanilla":
            assert row["speedup_vs_llamacpp"] == pytest.approx(row["decode_tokens_per_s"] / peer_rate)
    rate = {label: r["decode_tokens_per_s"] for label, r in rows.items()}
    assert rows["int4 draft k=2"]["speedup_vs_vanilla"] == pytest.approx(rate["int4 draft k=2"] / rate["int4 vanilla"])
    assert rows["int4 vanilla"]["speedup_vs_vanilla"] == pytest.approx(rate["int4 vanilla"] / rate["vanilla"])
    assert rows["int4 fr-spec k=2 map=16"]["speedup_vs_drafter"] == pytest.approx(
        rate["int4 fr-spec k=2 map=16"] / rate["int4 draft k=2"])
    agree, total = rows["llama.cpp vanilla"]["reference_agreement"]
    assert total == 2 * 10 and 0 <= agree <= total


def test_the_int4_auto_row_is_lossless_on_costs_measured_for_the_int4_pair(tiny_dirs, tmp_path, monkeypatch):
    """`--quant-rows int4` plans an int4 auto row: the controller's costs are measured for the int4 target and
    int4 draft body (a cache entry of their own, never the float rows'), and its output is int4 vanilla's."""
    monkeypatch.setenv("FRSPEC_CACHE", str(tmp_path))
    target, draft, quantized, tok = _pairs(tiny_dirs)
    maps = {16: TokenMap.from_counts(count_tokens(tok, CORPUS, vocab_size=VOCAB), top_k=16)}
    from frspec.bench.datasets import encode_prompt

    prompts = [(f"p{i}", encode_prompt(tok, t)) for i, t in enumerate(["Write a travel story.", "Why a fox?"])]
    methods = plan_methods([2], [16], auto=True) + plan_methods([2], [16], quant="int4", auto=True)
    assert [m.label for m in methods if m.auto] == ["fr-spec auto (maps <= 16 or none)",
                                                    "int4 fr-spec auto (maps <= 16 or none)"]
    result = run_benchmark(target, draft, tok, prompts, methods, maps, max_new_tokens=10, progress=False,
                           quantized={"int4": quantized})
    assert result.divergences == []
    outputs = {(g.method.quant, g.prompt_id): g.token_ids for g in result.generations if g.method.kind == VANILLA}
    for g in result.generations:
        assert g.token_ids == outputs[(g.method.quant, g.prompt_id)]
    entries = [json.loads(f.read_text())["provenance"] for f in (tmp_path / "step_costs").glob("*.json")]
    formats = sorted("Int4Linear" in e["target"] and "Int4Linear" in e["drafter"] for e in entries)
    assert formats == [False, True]  # one measurement for the float pair, one for the int4 pair


def test_a_quantized_divergence_is_measured_on_the_quantized_target(tiny_dirs):
    """A speculative int4 row that differed from int4 vanilla is listed with the int4 target's margin."""
    from frspec.bench.divergence import Generation, find_divergences, top2_margin
    from frspec.bench.runner import BenchResult, margin_targets

    target, _, quantized, tok = _pairs(tiny_dirs)
    stats = GenerationStats()
    gens = [Generation(Method(VANILLA, quant="int4"), "p", 3, [4, 5, 6], stats),
            Generation(Method.drafting(DRAFT, TreeShape.chain(2), quant="int4"), "p", 3, [4, 9, 6], stats),
            Generation(Method(VANILLA), "p", 3, [4, 9, 6], stats),
            Generation(Method(LLAMACPP), "p", 3, [7, 7, 7], stats)]
    result = BenchResult(methods=[g.method for g in gens], prompt_ids=["p"], generations=gens, divergences=[],
                         greedy=True, max_new_tokens=3)
    found = find_divergences(result.generations, {"p": [1, 2, 3]}, margin_targets(target, {"int4": quantized}))
    assert [(d.method.label, d.position) for d in found] == [("int4 draft k=2", 1)]
    assert found[0].top2_margin == pytest.approx(top2_margin(quantized[0], [1, 2, 3, 4]))


def test_cli_quick_on_cpu_has_int4_rows_cost_curve_and_notes_missing_llamacpp(tiny_dirs, tmp_path, capsys,
                                                                               monkeypatch):
    from frspec.bench import llamacpp

    monkeypatch.setattr(llamacpp, "available", lambda: False)
    target_dir, draft_dir = tiny_dirs
    counts = tmp_path / "counts.safetensors"
    count_tokens(load_tokenizer(str(target_dir)), CORPUS, vocab_size=VOCAB).save(counts)
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    code = main(["bench", "--quick", "--target", str(target_dir), "--draft", str(draft_dir), "--dtype", "fp32",
                 "--threads", "1", "--counts", str(counts), "--num-prompts", "1", "--max-new-tokens", "6",
                 "--token-map-sizes", "16", "--quant-token-map-sizes", "64", "--row-costs", "3",
                 "--out", str(out), "--no-progress"])
    torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert code == 0
    assert "no llama.cpp row: llama-cpp-python is not installed" in err
    payload = json.loads((out / "results.json").read_text())
    labels = [r["label"] for r in payload["rows"]]
    k = payload["meta"]["sections"][0]["quant_num_spec_tokens"]["int4"][0]  # chosen from the measured curve
    assert labels == ["vanilla", "draft k=3", "fr-spec k=3 map=16", "fr-spec auto (maps <= 16 or none)",
                      "int4 vanilla", f"int4 draft k={k}", f"int4 fr-spec k={k} map=64",
                      "int4 fr-spec auto (maps <= 64 or none)"]
    assert all(r["greedy_identical"] in ("yes", "reference") for r in payload["rows"])
    curves = payload["row_costs_s"]
    assert list(curves) == ["float32", "int8", "int4"] and all(list(c) == ["1", "2", "3"] for c in curves.values())
    assert (out / "row_costs.png").stat().st_size > 0
    md = (out / "results.md").read_text()
    assert "int4 vanilla" in md and "## Target forward cost against rows" in md


def test_cli_llamacpp_row_joins_the_quick_bench_when_available(tiny_dirs, tmp_path, monkeypatch):
    """The peer row as the CLI wires it, llama.cpp itself faked (a tiny HF model has no GGUF to run)."""
    from frspec.bench import llamacpp

    monkeypatch.setattr(llamacpp, "available", lambda: True)
    monkeypatch.setattr(llamacpp, "gguf_file", lambda spec: tmp_path / "tiny.gguf")
    monkeypatch.setattr(llamacpp, "LlamaCppGreedy", lambda path, threads: FakePeer([5, 6, 7, 8]))
    target_dir, draft_dir = tiny_dirs
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    assert main(["bench", "--quick", "--target", str(target_dir), "--draft", "none", "--dtype", "fp32",
                 "--threads", "1", "--num-prompts", "1", "--max-new-tokens", "4", "--row-costs", "0",
                 "--out", str(out), "--no-progress"]) == 0
    torch.set_num_threads(threads)
    payload = json.loads((out / "results.json").read_text())
    assert [r["label"] for r in payload["rows"]] == ["vanilla", "int4 vanilla", "llama.cpp vanilla"]
    assert payload["rows"][0]["speedup_vs_llamacpp"] is not None
    assert "Speedup vs llama.cpp" in (out / "results.md").read_text()


@pytest.mark.parametrize("extra, message", [
    (["--quant", "int4", "--quant-rows", "int4"], "--quant already quantizes every row"),
    (["--quant-rows", "int3"], "unknown quantization 'int3'"),
    (["--row-costs", "-1"], "--row-costs must be >= 0"),
    (["--quant-num-spec-tokens", "0"], "--num-spec-tokens values must be >= 1"),
])
def test_cli_bad_quant_options_are_one_line_errors(tiny_dirs, tmp_path, capsys, extra, message):
    target_dir, draft_dir = tiny_dirs
    code = main(["bench", "--target", str(target_dir), "--draft", str(draft_dir), "--num-prompts", "1",
                 "--out", str(tmp_path / "o"), "--no-progress", *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


# The tiny models' hidden size 48 is no multiple of the int4 group (32): their int4 layers take int8 instead.
@pytest.mark.parametrize("head, expected", [({}, ("Int4Linear", "Int8Linear")), ({"int4": None}, ("Linear",)),
                                            ({"int4": "int8"}, ("Int8Linear",))])
def test_quantized_rows_drafter_head_follows_the_row_or_the_option(tiny_dirs, head, expected):
    from frspec.bench.runner import _build_generators

    target, draft, quantized, tok = _pairs(tiny_dirs)
    maps = {64: TokenMap.from_counts(count_tokens(tok, CORPUS, vocab_size=VOCAB), top_k=64)}
    methods = plan_methods([2], [64], quant="int4")
    generators = _build_generators(methods, target, draft, None, tok, maps, quantized={"int4": quantized},
                                   quant_draft_heads=head)
    for m in methods[1:]:  # the full head and the pruned one
        assert type(generators[m].drafter.vocab.head).__name__ in expected


def test_quick_preset_adds_quantized_rows_on_a_cpu_only():
    """On CUDA the quantized rows (int4 faster than bf16 at one row only, int8 slower at every batch on an H200) and
    llama.cpp are only run when asked for."""
    from frspec.bench.plan import plan_bench

    cpu = plan_bench(quick=True)
    assert cpu.quant_rows == ("int4",) and cpu.llamacpp and cpu.row_costs == 16
    assert cpu.row_cost_quants == ("int8", "int4")
    cuda = plan_bench(quick=True, device="cuda")
    assert cuda.quant_rows == () and not cuda.llamacpp and cuda.row_cost_quants == ()
    assert plan_bench(quick=True, device="cuda", quant_rows="int4").quant_rows == ("int4",)
    assert plan_bench(quick=True, quant="int4").quant_rows == ()  # every row is int4 already
    off = plan_bench(quick=True, quant_rows="none", no_llamacpp=True)
    assert off.quant_rows == () and not off.llamacpp
    full = plan_bench()
    assert full.quant_rows == () and not full.llamacpp and full.row_costs == 0


def test_a_quantized_auto_row_packs_its_ranked_head_and_shares_it_with_the_static_rows(tiny_dirs):
    """The int4 rows' auto row ranks its head and packs it once like the static rows' heads (here int8: the tiny
    models' width is no multiple of the int4 group); the static int4 rows whose maps prefix its ranking are served
    by the same packed head at their size, as the float rows are by the float one."""
    from frspec.bench.runner import _build_generators
    from frspec.vocab.ranked_vocab import RankedVocab

    target, draft, quantized, tok = _pairs(tiny_dirs)
    counts = count_tokens(tok, CORPUS, vocab_size=VOCAB)
    maps = {k: TokenMap.from_counts(counts, top_k=k) for k in (32, 64)}
    methods = plan_methods([2], [32, 64], quant="int4", auto=True)
    generators = _build_generators(methods, target, draft, None, tok, maps, quantized={"int4": quantized})
    auto = next(m for m in methods if m.auto)
    ranked = generators[auto].drafter
    assert isinstance(ranked.vocab, RankedVocab) and ranked.vocab.packed_all is not None
    assert type(ranked.vocab.head).__name__ == "Int8Linear" and ranked.vocab.weight_all is None
    shared = [m for m in methods if m.token_map_size is not None and not m.auto]
    assert shared and all(generators[m].drafter is ranked for m in shared)
