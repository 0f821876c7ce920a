"""Context-aware rows in `frspec bench`, per-dataset map sources, and maps counted from the target's own output."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from frspec.bench import token_maps
from frspec.bench.datasets import encode_prompt
from frspec.bench.methods import FRSPEC, Method, add_context_methods, plan_methods
from frspec.bench.generation_counts import count_generations
from frspec.bench.token_maps import pick_map_source, resolve_token_maps
from frspec.cli import main
from frspec.decode.factory import build_generator
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError
from frspec.models.tokenizer import load_tokenizer
from frspec.vocab.counting import count_tokens
from frspec.vocab.counts import TokenCounts

from tests.bench.conftest import CORPUS, VOCAB


def test_context_methods_follow_each_map_row_and_are_judged_against_it():
    methods = add_context_methods(plan_methods([3], [16, 64]), [8, 32], ["fixed", "additive"])
    labels = [m.label for m in methods]
    assert labels[:3] == ["vanilla", "draft k=3", "fr-spec k=3 map=16"]
    assert labels[3:7] == ["fr-spec k=3 map=16 +ctx=8 fixed", "fr-spec k=3 map=16 +ctx=8 additive",
                           "fr-spec k=3 map=16 +ctx=32 fixed", "fr-spec k=3 map=16 +ctx=32 additive"]
    assert labels[7] == "fr-spec k=3 map=64" and len(methods) == 12
    ctx = methods[3]
    assert ctx.same_map_static == Method.drafting(FRSPEC, TreeShape.chain(3), 16)
    assert ctx.same_drafter_without_frspec == methods[1]
    assert add_context_methods(methods[:3], []) == methods[:3]


@pytest.mark.parametrize("rows, budgets, message", [
    ([0], ["fixed"], "must be >= 1"), ([8, 8], ["fixed"], "duplicates"), ([8], ["both"], "must be one of"),
    ([8], ["fixed", "fixed"], "each budget once"),
])
def test_bad_context_options_are_refused(rows, budgets, message):
    with pytest.raises(FrspecError, match=message):
        add_context_methods(plan_methods([3], [16]), rows, budgets)


def test_context_fields_are_validated():
    with pytest.raises(ValueError, match="together"):
        Method(FRSPEC, 3, 16, TreeShape.chain(3), context_rows=8)
    with pytest.raises(ValueError, match="only fr-spec"):
        Method("draft", 3, tree=TreeShape.chain(3), context_rows=8, context_budget="fixed")


def test_cli_bench_context_rows_end_to_end_in_fp64(tiny_dirs, tmp_path, capsys):
    target_dir, draft_dir = tiny_dirs
    tok = load_tokenizer(str(target_dir))
    counts_path = tmp_path / "counts.safetensors"
    count_tokens(tok, CORPUS, vocab_size=VOCAB).save(counts_path)
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    code = main([
        "bench", "--target", str(target_dir), "--draft", str(draft_dir), "--dtype", "fp64", "--threads", "1",
        "--num-prompts", "2", "--max-new-tokens", "12", "--num-spec-tokens", "3", "--token-map-sizes", "64",
        "--counts", str(counts_path), "--context-rows", "8", "--context-budgets", "fixed,additive",
        "--out", str(out), "--no-progress",
    ])
    torch.set_num_threads(threads)
    assert code == 0
    payload = json.loads((out / "results.json").read_text())
    rows = {r["label"]: r for r in payload["rows"]}
    assert list(rows) == ["vanilla", "draft k=3", "fr-spec k=3 map=64", "fr-spec k=3 map=64 +ctx=8 fixed",
                          "fr-spec k=3 map=64 +ctx=8 additive", "fr-spec auto (maps <= 64 or none)"]
    assert all(r["greedy_identical"] in ("yes", "reference") for r in rows.values())
    ctx = rows["fr-spec k=3 map=64 +ctx=8 fixed"]
    assert ctx["context_rows"] == 8 and ctx["context_budget"] == "fixed" and ctx["speedup_vs_static_map"] > 0
    assert rows["fr-spec k=3 map=64"]["speedup_vs_static_map"] is None
    prompt_tokens = payload["meta"]["sections"][0]["prompt_tokens"]
    assert ctx["input_tokens"] == pytest.approx(sum(prompt_tokens) / len(prompt_tokens))
    md = (out / "results.md").read_text()
    assert "Context Rows" in md and "Input Tokens" in md and "+ctx=8 additive" in md
    assert "+ctx=8 fixed" in capsys.readouterr().out


def test_map_source_auto_picks_code_counts_for_the_code_dataset():
    assert pick_map_source("auto", "code") == "code"
    assert pick_map_source("auto", "long-qa") == pick_map_source("auto", None) == "sharegpt"
    assert pick_map_source("mix", "code") == "mix"
    with pytest.raises(FrspecError, match="must be one of"):
        pick_map_source("web", None)


def test_code_and_mixed_sources_rank_by_their_counts(tiny_dirs, tmp_path, monkeypatch):
    tok = load_tokenizer(str(tiny_dirs[0]))
    chat = count_tokens(tok, CORPUS[:1] * 5, vocab_size=VOCAB)  # travel prose
    code = count_tokens(tok, CORPUS[1:2] * 5, vocab_size=VOCAB)  # "python function"
    monkeypatch.setattr(token_maps, "sharegpt_counts", lambda *a, **k: (chat, tmp_path / "chat.counts.safetensors"))
    monkeypatch.setattr(token_maps, "code_counts", lambda *a, **k: (code, tmp_path / "code.counts.safetensors"))
    maps = {}
    for source in ("sharegpt", "code", "mix"):
        maps[source], described = resolve_token_maps(tok, VOCAB, [64], cache_dir=tmp_path, source=source)
        assert {"sharegpt": "ShareGPT", "code": "code corpus", "mix": "50/50 mixture"}[source] in described
    top = {s: set(m[64].ids.tolist()) for s, m in maps.items()}
    python = set(tok.encode(" python function", add_special_tokens=False))
    travel = set(tok.encode(" travel blog", add_special_tokens=False))
    assert python <= top["code"] and not python <= top["sharegpt"]
    assert travel <= top["sharegpt"] and not travel <= top["code"]
    assert top["mix"] != top["code"] and top["mix"] != top["sharegpt"]
    assert sorted((tmp_path).glob("mix50-chat-code-top64.safetensors"))  # mixed maps are cached too


def test_count_generations_counts_exactly_what_the_target_writes(tiny_dirs):
    target = AutoModelForCausalLM.from_pretrained(tiny_dirs[0], dtype=torch.float32).eval()
    tok = load_tokenizer(str(tiny_dirs[0]))
    generator = build_generator(target, tokenizer=tok)
    prompts = ["Write a travel story.", "Why is the fox quick?"]
    counts = count_generations(generator, tok, prompts, 10, VOCAB, progress=False)
    outputs = [generator.generate(input_ids=encode_prompt(tok, p), max_new_tokens=10).token_ids for p in prompts]
    expected = torch.bincount(torch.tensor(sum(outputs, [])), minlength=VOCAB)
    assert torch.equal(counts.counts, expected) and counts.metadata["tokens"] == sum(map(len, outputs))
    assert counts.metadata["tokenizer"]["vocab_hash"]


def test_cli_count_generations_writes_counts_the_bench_accepts(tiny_dirs, tmp_path, capsys):
    prompts = tmp_path / "calib.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in CORPUS))
    out = tmp_path / "gen.counts.safetensors"
    threads = torch.get_num_threads()
    code = main(["vocab", "count-generations", "--model", str(tiny_dirs[0]), "--dataset", str(prompts),
                 "--skip", "1", "--num-prompts", "2", "--max-new-tokens", "6", "--dtype", "fp32", "--threads", "1",
                 "--out", str(out), "--no-progress"])
    torch.set_num_threads(threads)
    assert code == 0, capsys.readouterr().err
    counts = TokenCounts.load(out)
    assert counts.metadata["documents"] == 2 and counts.metadata["skip"] == 1 and 0 < counts.total <= 12
    code = main(["vocab", "count-generations", "--model", str(tiny_dirs[0]), "--dataset", str(prompts),
                 "--skip", "2", "--num-prompts", "2", "--out", str(tmp_path / "x.safetensors")])
    err = capsys.readouterr().err
    assert code == 2 and "has only 3" in err.splitlines()[-1] and not (tmp_path / "x.safetensors").exists()
