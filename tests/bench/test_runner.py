import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from frspec.bench.datasets import encode_prompt
from frspec.bench.methods import DRAFT, VANILLA, Method, plan_methods
from frspec.bench.divergence import Generation, find_divergences, first_difference, top2_margin
from frspec.bench.runner import BenchResult, margin_targets, run_benchmark
from frspec.bench.summary import summarize
from frspec.cli import main
from frspec.models.tokenizer import load_tokenizer
from frspec.decode.sampling import SamplingParams
from frspec.decode.stats import GenerationStats
from frspec.decode.tree_shape import TreeShape
from frspec.vocab.counting import count_tokens
from frspec.vocab.token_map import TokenMap

from tests.bench.conftest import CORPUS, VOCAB

DRAFT_2 = Method.drafting(DRAFT, TreeShape.chain(2))


def _load(tiny_dirs, dtype=torch.float64):
    target_dir, draft_dir = tiny_dirs
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=dtype).eval()
    return target, draft, load_tokenizer(str(target_dir))


def _counts(tok):
    return count_tokens(tok, CORPUS, vocab_size=VOCAB)


def _prompts(tok):
    texts = ["Write a travel story.", "Explain the math of a python list sum.", "Why is the fox quick?"]
    return [(f"p{i}", encode_prompt(tok, text)) for i, text in enumerate(texts)]


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_run_benchmark_interleaves_methods_and_is_lossless_in_fp64(tiny_dirs):
    target, draft, tok = _load(tiny_dirs)
    counts = _counts(tok)
    maps = {k: TokenMap.from_counts(counts, top_k=k) for k in (16, 64)}
    methods = plan_methods([2], [16, 64])
    prompts = _prompts(tok)
    result = run_benchmark(target, draft, tok, prompts, methods, maps, max_new_tokens=20, progress=False)

    assert len(result.generations) == len(prompts) * len(methods)
    for i, (pid, ids) in enumerate(prompts):
        block = result.generations[i * len(methods):(i + 1) * len(methods)]
        assert {g.prompt_id for g in block} == {pid}  # interleaved: all methods on a prompt before the next
        assert {g.method for g in block} == set(methods)
        assert block[0].method == methods[i % len(methods)]  # the starting method rotates
        assert all(g.prompt_tokens == len(ids) for g in block)
        # Greedy fp64: every method emits exactly vanilla's tokens.
        outputs = {tuple(g.token_ids) for g in block}
        assert len(outputs) == 1 and len(next(iter(outputs))) > 0
    assert result.divergences == []

    rows = {r["label"]: r for r in summarize(result)}
    # Decoding throughput: decode-step tokens over wall time after the prefill, from totals over prompts.
    van = [g.stats for g in result.generations if g.method.kind == VANILLA]
    expected = sum(s.decode_tokens for s in van) / sum(s.wall_time_s - s.prefill_time_s for s in van)
    assert rows["vanilla"]["decode_tokens_per_s"] == pytest.approx(expected)
    assert rows["vanilla"]["tokens"] == sum(len(g.token_ids) for g in result.generations_of(Method(VANILLA)))
    assert rows["vanilla"]["acceptance_length"] == pytest.approx(1.0)
    assert rows["vanilla"]["forward_ratio"] is None and rows["vanilla"]["greedy_identical"] == "reference"
    full = rows["draft k=2"]
    assert 1.0 < full["acceptance_length"] <= 3.0
    for label in ("draft k=2", "fr-spec k=2 map=16", "fr-spec k=2 map=64"):
        row = rows[label]
        assert row["greedy_identical"] == "yes"
        assert row["forward_ratio"] > 0 and 0 < row["lm_head_share"] < 1
        assert row["speedup_vs_vanilla"] == pytest.approx(row["decode_tokens_per_s"] / rows["vanilla"]["decode_tokens_per_s"])
        assert row["tokens"] == rows["vanilla"]["tokens"]
    assert rows["fr-spec k=2 map=16"]["speedup_vs_drafter"] == pytest.approx(
        rows["fr-spec k=2 map=16"]["decode_tokens_per_s"] / full["decode_tokens_per_s"])
    # A 16-id map cannot propose what the models say outside it, so it is accepted less than the full vocabulary.
    assert rows["fr-spec k=2 map=16"]["acceptance_length"] < full["acceptance_length"]


@pytest.mark.parametrize("repeats,kept_s", [(3, 2.0), (2, 1.0)])  # of two rounds, the faster
def test_repeats_run_rounds_of_all_methods_and_keep_each_methods_median_run(tiny_dirs, monkeypatch, repeats, kept_s):
    import frspec.bench.runner as runner

    target, draft, tok = _load(tiny_dirs)
    methods = [Method(VANILLA), DRAFT_2]
    prompts = _prompts(tok)[:2]
    real_generate = runner._generate
    order, runs = [], {}
    decode_s = [3.0, 1.0, 2.0]  # each method's rounds on a prompt: of three the median is the third round's

    def scripted(generator, prompt_ids, max_new_tokens, sampling, device, eos_ids=None):
        out = real_generate(generator, prompt_ids, max_new_tokens, sampling, device, eos_ids)
        if max_new_tokens == 20:  # not a warm-up
            method = next(m for m, g in generators.items() if g is generator)
            key = (tuple(prompt_ids), method)
            runs[key] = runs.get(key, 0) + 1
            order.append((tuple(prompt_ids), method))
            out.stats.prefill_time_s = 0.5
            out.stats.wall_time_s = 0.5 + decode_s[runs[key] - 1]
            if method == DRAFT_2 and prompt_ids == prompts[1][1] and runs[key] == 2:
                out.token_ids = list(out.token_ids)[:-1]  # a round that emitted other tokens is named
        return out

    real_build = runner._build_generators
    generators = {}

    def build(*args, **kwargs):
        generators.update(real_build(*args, **kwargs))
        return generators

    monkeypatch.setattr(runner, "_generate", scripted)
    monkeypatch.setattr(runner, "_build_generators", build)
    result = run_benchmark(target, draft, tok, prompts, methods, {}, max_new_tokens=20, progress=False,
                           repeats=repeats)

    assert len(order) == repeats * len(methods) * len(prompts)
    for i, (_, ids) in enumerate(prompts):
        mine = [m for p, m in order if p == tuple(ids)]
        # Round r of prompt i starts at method (i + r): each method is first in some round.
        assert [mine[r * len(methods)] for r in range(repeats)] == [methods[(i + r) % len(methods)]
                                                                    for r in range(repeats)]
    assert len(result.generations) == len(methods) * len(prompts)
    assert all(g.stats.wall_time_s - g.stats.prefill_time_s == kept_s for g in result.generations)
    assert result.notes == [f"{DRAFT_2.label} on {prompts[1][0]}: its {repeats} rounds emitted different tokens"]
    with pytest.raises(ValueError, match="repeats"):
        run_benchmark(target, draft, tok, prompts, methods, {}, max_new_tokens=4, progress=False, repeats=0)


def test_every_round_of_a_prompt_starts_from_what_the_prompts_before_it_left_the_generator(tiny_dirs, monkeypatch):
    """What a controller carries between requests (confidence bins, worth) is restored before each round: a later
    round must not start from what the same prompt's earlier round taught it."""
    import frspec.bench.runner as runner
    from frspec.decode.controller import CarriedWorth

    target, draft, tok = _load(tiny_dirs)
    methods = [Method(VANILLA), DRAFT_2]
    prompts = _prompts(tok)[:2]
    real_generate = runner._generate
    started = []  # (prompt, generator, what it carried at the start of the run)

    def leaving_a_mark(generator, prompt_ids, max_new_tokens, sampling, device, eos_ids=None):
        started.append((tuple(prompt_ids), id(generator), generator.carried()))
        out = real_generate(generator, prompt_ids, max_new_tokens, sampling, device, eos_ids)
        marks = generator.worth.get("runs", CarriedWorth()).weight
        generator.worth = {**generator.worth, "runs": CarriedWorth(0.0, marks + 1)}  # this run was here
        return out

    monkeypatch.setattr(runner, "_generate", leaving_a_mark)
    run_benchmark(target, draft, tok, prompts, methods, {}, max_new_tokens=6, progress=False, repeats=3)

    for g in {g for _, g, _ in started}:
        runs = [(p, carried[1]["runs"].weight if "runs" in carried[1] else 0) for p, gid, carried in started
                if gid == g]
        # The warm-up, then three rounds of each prompt: every round of a prompt starts where its first did.
        assert [n for _, n in runs] == [0, 1, 1, 1, 2, 2, 2]


def test_divergence_records_position_and_target_margin(tiny_dirs):
    target, _, tok = _load(tiny_dirs)
    (pid, ids), = _prompts(tok)[:1]
    vanilla_out = [5, 6, 7, 8]
    other_out = [5, 6, 9, 8]
    stats = GenerationStats(tokens=4, wall_time_s=1.0)
    result = BenchResult(
        methods=[Method(VANILLA), DRAFT_2], prompt_ids=[pid],
        generations=[Generation(Method(VANILLA), pid, len(ids), vanilla_out, stats),
                     Generation(DRAFT_2, pid, len(ids), other_out, stats)],
        divergences=[], greedy=True, max_new_tokens=4,
    )
    (d,) = find_divergences(result.generations, {pid: ids}, margin_targets(target))
    assert (d.prompt_id, d.position, d.vanilla_token, d.method_token) == (pid, 2, 7, 9)
    with torch.no_grad():
        top = target(torch.tensor([ids + [5, 6]])).logits[0, -1].topk(2).values
    assert d.top2_margin == pytest.approx(float(top[0] - top[1]))
    assert d.top2_margin == pytest.approx(top2_margin(target, ids + [5, 6]))
    result.divergences = [d]
    assert summarize(result)[1]["greedy_identical"] == "1 differ"


def test_ignore_eos_runs_every_answer_to_max_new_tokens(tiny_dirs):
    target, draft, tok = _load(tiny_dirs)
    prompts = _prompts(tok)[:2]
    methods = [Method(VANILLA), DRAFT_2]
    # Make the token the target emits third on the first prompt an EOS: without ignore_eos that answer ends there.
    first = run_benchmark(target, draft, tok, prompts, methods, {}, 12, progress=False, ignore_eos=True)
    assert all(len(g.token_ids) == 12 for g in first.generations)
    eos = first.generations[0].token_ids[2]
    target.generation_config.eos_token_id = eos
    stopped = run_benchmark(target, draft, tok, prompts, methods, {}, 12, progress=False)
    assert all(len(g.token_ids) <= 3 for g in stopped.generations if g.prompt_id == "p0")
    ignored = run_benchmark(target, draft, tok, prompts, methods, {}, 12, progress=False, ignore_eos=True)
    assert all(len(g.token_ids) == 12 for g in ignored.generations)
    assert [g.token_ids for g in ignored.generations] == [g.token_ids for g in first.generations]


def test_sampling_gives_prompt_i_the_seed_plus_i(tiny_dirs):
    from frspec.decode.factory import build_generator

    target, _, tok = _load(tiny_dirs)
    prompts = _prompts(tok)[:2]
    sampling = SamplingParams(temperature=1.0, seed=7)
    result = run_benchmark(target, None, tok, prompts, [Method(VANILLA)], {}, 12, sampling, progress=False)
    for i, ((_, ids), g) in enumerate(zip(prompts, result.generations)):
        direct = build_generator(target, tokenizer=tok).generate(
            input_ids=ids, max_new_tokens=12, sampling=SamplingParams(temperature=1.0, seed=7 + i))
        assert g.token_ids == direct.token_ids
    assert not result.greedy and result.divergences == []
    assert summarize(result)[0]["greedy_identical"] == "reference"


def test_cli_bench_end_to_end(tiny_dirs, tmp_path, capsys):
    target_dir, draft_dir = tiny_dirs
    tok = load_tokenizer(str(target_dir))
    counts_path = tmp_path / "counts.safetensors"
    _counts(tok).save(counts_path)
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    code = main([
        "bench", "--target", str(target_dir), "--draft", str(draft_dir), "--dtype", "fp64", "--threads", "1",
        "--num-prompts", "2", "--max-new-tokens", "12", "--num-spec-tokens", "1,3", "--token-map-sizes", "16,64",
        "--counts", str(counts_path), "--out", str(out), "--no-progress",
    ])
    torch.set_num_threads(threads)
    assert code == 0
    payload = json.loads((out / "results.json").read_text())
    labels = [r["label"] for r in payload["rows"]]
    assert labels == ["vanilla", "draft k=1", "fr-spec k=1 map=16", "fr-spec k=1 map=64",
                      "draft k=3", "fr-spec k=3 map=16", "fr-spec k=3 map=64", "fr-spec auto (maps <= 64 or none)"]
    assert all(r["greedy_identical"] in ("yes", "reference") for r in payload["rows"])
    auto = payload["rows"][-1]
    assert auto["auto_vs_best_static"] > 0 and auto["best_static"] in labels[:-1]
    meta = payload["meta"]
    assert meta["dtype"] == "float64" and meta["threads"] == 1 and meta["num_prompts"] == 2
    assert meta["prompt_ids"] == ["mtbench-81", "mtbench-121"]  # MT-Bench writing and coding: spread out
    assert meta["machine"]["cores"] and meta["commit"]
    # The auto row's step costs travel with the results (and the report names them).
    costs = meta["sections"][0]["controller_costs"]["fr-spec auto (maps <= 64 or none)"]
    assert costs["target_costs"]["1"] > 0 and costs["provenance"]
    assert "- `fr-spec auto (maps <= 64 or none)` chose by step costs" in (out / "results.md").read_text()
    assert len(payload["generations"]) == 2 * 8
    for name in ("results.csv", "results.md", "throughput_vs_map_size.png", "acceptance_vs_map_size.png"):
        assert (out / name).stat().st_size > 0
    table = capsys.readouterr().out
    assert "Acceptance" in table and "fr-spec      │ chain-3 │        3 │        64 │" in table
    assert "fr-spec auto │ auto    │" in table


def test_cli_token_map_files_set_the_sizes(tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    tok = load_tokenizer(str(target_dir))
    counts = _counts(tok)
    map_path = tmp_path / "map32.safetensors"
    TokenMap.from_counts(counts, top_k=32).save(map_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"q": "w1 w2 w3"}\n{"q": "w4 w5"}\n')
    out = tmp_path / "out"
    assert main([
        "bench", "--target", str(target_dir), "--draft", str(draft_dir), "--dtype", "fp32", "--quick",
        "--dataset", str(prompts), "--field", "q", "--max-new-tokens", "6", "--token-map", str(map_path),
        "--out", str(out), "--no-progress",
    ]) == 0
    payload = json.loads((out / "results.json").read_text())
    k = payload["meta"]["sections"][0]["quant_num_spec_tokens"]["int4"][0]
    # --quick on a CPU adds the int4 rows; the file's map serves them too.
    assert [r["label"] for r in payload["rows"]] == ["vanilla", "draft k=3", "fr-spec k=3 map=32",
                                                     "fr-spec auto (maps <= 32 or none)", "int4 vanilla",
                                                     f"int4 draft k={k}", f"int4 fr-spec k={k} map=32",
                                                     "int4 fr-spec auto (maps <= 32 or none)"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--token-map-sizes", "16,500"], "token-map size 500 exceeds the model's vocabulary of 320"),
        (["--num-prompts", "81"], "only 80"),
        (["--dataset", "missing.jsonl"], "prompt file not found"),
        (["--num-spec-tokens", "0"], "must be >= 1"),
        (["--max-new-tokens", "0"], "must be >= 1"),
        (["--dtype", "int8"], "unknown dtype"),
        # long runs and context-aware rows (issue 14)
        (["--max-new-tokens", "1024"], "exceeds the target's context of 512 positions; lower --max-new-tokens"),
        (["--context-rows", "8", "--engine", "vllm"], "frspec's own engine"),
        (["--context-rows", "8", "--context-budgets", "fixed,more"], "context budget must be one of"),
        (["--token-map-source", "code"], "drop it with --token-map or --counts"),
        # issue 21: a mixed workload
        (["--dataset", "x.jsonl", "--mix", "mtbench,code"], "give --dataset or --mix"),
        (["--mix", "mtbench"], "two or more different datasets"),
        (["--repeats", "0"], "--repeats must be an integer >= 1, got 0"),
    ],
)
def test_cli_bad_input_is_one_line_error(tiny_dirs, tmp_path, capsys, extra, message):
    target_dir, draft_dir = tiny_dirs
    counts_path = tmp_path / "counts.safetensors"
    _counts(load_tokenizer(str(target_dir))).save(counts_path)
    code = main(["bench", "--target", str(target_dir), "--draft", str(draft_dir), "--counts", str(counts_path),
                 "--num-prompts", "1", "--max-new-tokens", "4", "--out", str(tmp_path / "o"), "--no-progress",
                 "--token-map-sizes", "16", *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "o" / "results.json").exists()


def test_auto_rows_share_one_ranked_head_with_the_static_rows_and_stay_lossless(tiny_dirs, tmp_path, monkeypatch):
    from frspec.bench.runner import _build_generators

    monkeypatch.setenv("FRSPEC_CACHE", str(tmp_path / "cache"))
    target, draft, tok = _load(tiny_dirs)
    counts = _counts(tok)
    maps = {k: TokenMap.from_counts(counts, top_k=k) for k in (16, 64)}
    methods = plan_methods([2], [16, 64], auto=True)
    auto = methods[-1]
    assert auto.auto and auto.label == "fr-spec auto (maps <= 64 or none)" and auto.token_map_size == 64
    generators = _build_generators(methods, target, draft, None, tok, maps)
    head = generators[auto].drafter
    assert hasattr(head.vocab, "set_size") and generators[auto].controller is not None
    for m in methods[1:-1]:  # draft k=2 (no map) and both static maps: the same ranked head, at their size
        assert generators[m].drafter is head and generators[m].controller is None
    assert [generators[m].map_size for m in methods[1:-1]] == [head.vocab.full_size, 16, 64]
    result = run_benchmark(target, draft, tok, _prompts(tok), methods, maps, max_new_tokens=16, progress=False)
    assert result.divergences == []
    rows = {r["label"]: r for r in summarize(result)}
    row = rows[auto.label]
    assert row["greedy_identical"] == "yes" and sum(row["chosen_depth_histogram"]) == row["target_forwards"]
    best = max((r for r in rows.values() if not r["auto"]), key=lambda r: r["decode_tokens_per_s"])
    assert row["best_static"] == best["label"]
    assert row["auto_vs_best_static"] == pytest.approx(row["decode_tokens_per_s"] / best["decode_tokens_per_s"])
    best = max((r for r in rows.values() if not r["auto"]), key=lambda r: r["end_to_end_tokens_per_s"])
    assert row["best_static_end_to_end"] == best["label"]
    assert row["auto_vs_best_static_end_to_end"] == pytest.approx(
        row["end_to_end_tokens_per_s"] / best["end_to_end_tokens_per_s"])
    assert all(r["auto_vs_best_static_end_to_end"] is None for r in rows.values() if not r["auto"])
    # What each auto request's drafter prefill read (whole prompt, a window, none), counted per request.
    assert sum(row["drafter_prefills"].values()) == row["prompts"]
    assert all(r["drafter_prefills"] is None for r in rows.values() if not r["auto"])
    # The static rows drafted at their own size even though the auto row changed it in between.
    assert rows["fr-spec k=2 map=16"]["acceptance_length"] <= rows["draft k=2"]["acceptance_length"]


def test_cli_bench_mix_reports_each_dataset_with_auto_against_its_best_static(tiny_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("FRSPEC_CACHE", str(tmp_path / "cache"))
    target_dir, draft_dir = tiny_dirs
    counts_path = tmp_path / "counts.safetensors"
    _counts(load_tokenizer(str(target_dir))).save(counts_path)
    a, b = tmp_path / "words.jsonl", tmp_path / "math.jsonl"
    a.write_text('{"prompt": "the quick brown fox"}\n{"prompt": "a lazy dog sleeps"}\n')
    b.write_text('{"prompt": "sum of a python list"}\n{"prompt": "the math of 2 and 3"}\n')
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    code = main(["bench", "--target", str(target_dir), "--draft", str(draft_dir), "--dtype", "fp64", "--threads",
                 "1", "--mix", f"{a},{b}", "--num-prompts", "4", "--max-new-tokens", "8", "--num-spec-tokens", "2",
                 "--token-map-sizes", "16,64", "--counts", str(counts_path), "--out", str(out), "--no-progress"])
    torch.set_num_threads(threads)
    assert code == 0
    payload = json.loads((out / "results.json").read_text())
    assert payload["meta"]["dataset"] == f"mix:{a},{b}" and len(payload["meta"]["prompt_ids"]) == 4
    by = payload["per_dataset"]
    assert [r["dataset"] for r in by if r["auto"]] == [str(a), str(b)]
    labels = {r["label"] for r in payload["rows"]}
    for r in by:
        assert r["prompts"] == 2 and r["label"] in labels
        if r["auto"]:
            same = [x for x in by if x["dataset"] == r["dataset"] and not x["auto"]]
            best = max(same, key=lambda x: x["decode_tokens_per_s"])
            assert r["best_static"] == best["label"]
            assert r["auto_vs_best_static"] == pytest.approx(r["decode_tokens_per_s"] / best["decode_tokens_per_s"])
            best = max(same, key=lambda x: x["end_to_end_tokens_per_s"])
            assert r["best_static_end_to_end"] == best["label"]
            assert r["auto_vs_best_static_end_to_end"] == pytest.approx(
                r["end_to_end_tokens_per_s"] / best["end_to_end_tokens_per_s"])
    report = (out / "results.md").read_text()
    assert "## Per dataset (mixed run)" in report and "Auto vs Best Static, End to End (best)" in report


def test_auto_is_compared_with_the_best_static_row_in_decode_and_end_to_end_each_its_own():
    """A draft model's prefill over a long prompt: the static row wins in decode, vanilla end to end, and the auto
    row (plain here) is measured against each."""
    from frspec.bench.summary import auto_vs_best_static

    methods = plan_methods([2], [16], auto=True)
    vanilla, draft, static, auto = methods
    decode = {vanilla: 4.0, draft: 4.4, static: 4.6, auto: 4.0}
    end_to_end = {vanilla: 2.2, draft: 2.0, static: 2.05, auto: 2.2}
    got = auto_vs_best_static(methods, auto, decode, end_to_end)
    assert got["best_static"] == static.label and got["auto_vs_best_static"] == pytest.approx(4.0 / 4.6)
    assert got["best_static_end_to_end"] == vanilla.label and got["auto_vs_best_static_end_to_end"] == 1.0
    assert set(auto_vs_best_static(methods, static, decode, end_to_end).values()) == {None}
