"""`frspec tune` end to end on tiny models, the replay's acceptance against the engine's, and `frspec bench
--config` running the tuned configuration as a row."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from frspec.bench.datasets import encode_prompt
from frspec.tune.measure import draft_ranks, draft_vocabs, reference_outputs
from frspec.tune.predict import acceptance
from frspec.cli import main
from frspec.decode.decode_config import DecodeConfig
from frspec.decode.factory import build_generator
from frspec.decode.sampling import SamplingParams
from frspec.decode.stats import GenerationStats
from frspec.decode.tree_shape import TreeShape
from frspec.models.tokenizer import load_tokenizer
from frspec.vocab.counting import count_tokens
from frspec.vocab.token_map import TokenMap

from tests.bench.conftest import CORPUS, VOCAB


def test_replayed_acceptance_is_the_engines_in_fp64(tiny_dirs):
    """The ranks from one teacher-forced draft forward replay greedy decoding exactly: chains and static trees,
    with and without a map, accept what the engine accepts on the same prompts (fp64: no rounding ties)."""
    target_dir, draft_dir = tiny_dirs
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float64).eval()
    tok = load_tokenizer(str(target_dir))
    prompts = [encode_prompt(tok, t) for t in ("Write a travel story.", "Explain the math of a python list sum.")]
    token_map = TokenMap.from_counts(count_tokens(tok, CORPUS, vocab_size=VOCAB), top_k=48)
    outputs, _ = reference_outputs(target, tok, prompts, 20)
    ranks = draft_ranks(draft, draft_vocabs(draft, {48: token_map}), list(zip(prompts, outputs)))
    for key, tm in ((None, None), (48, token_map)):
        for shape in (TreeShape.chain(1), TreeShape.chain(3), TreeShape.static(2, 2), TreeShape.static(3, 2)):
            gen = build_generator(target, draft, tm, tokenizer=tok, tree=shape)
            runs = [gen.generate(input_ids=torch.tensor([p]), max_new_tokens=20, sampling=SamplingParams())
                    for p in prompts]
            assert [list(r.token_ids) for r in runs] == outputs  # lossless, and the replay's reference
            engine = GenerationStats.aggregate(r.stats for r in runs)
            per_step, _ = acceptance(ranks[key], shape)
            assert per_step == pytest.approx(engine.acceptance_length), (key, str(shape))


def _counts_file(tiny_dirs, tmp_path):
    path = tmp_path / "counts.safetensors"
    count_tokens(load_tokenizer(str(tiny_dirs[0])), CORPUS, vocab_size=VOCAB).save(path)
    return path


def test_cli_tune_writes_the_measured_best_as_a_config(tiny_dirs, tmp_path, capsys):
    target_dir, draft_dir = tiny_dirs
    out, report = tmp_path / "cfg" / "tune.json", tmp_path / "report"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in CORPUS))
    code = main(["tune", "--dataset", str(prompts), "--target", str(target_dir), "--draft", str(draft_dir), "--dtype", "fp32", "--threads",
                 "1", "--counts", str(_counts_file(tiny_dirs, tmp_path)), "--token-map-sizes", "16,64",
                 "--num-prompts", "3", "--max-new-tokens", "12", "--confirm-prompts", "2", "--confirm-tokens", "8",
                 "--top", "2", "--context-rows", "8", "--context-budget", "fixed", "--out", str(out),
                 "--report", str(report), "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "| config | predicted rank |" in captured.out and "(pick)" in captured.out
    config = DecodeConfig.load(out)
    details = json.loads((report / "tune.json").read_text())
    rows = details["comparison"]
    assert rows[0]["predicted_rank"] == 1 or rows[0]["config"] == "vanilla"
    assert any(r["config"] == "vanilla" for r in rows) and any(r["map_size"] is None and r["tree"] for r in rows)
    picked = [r for r in rows if r["picked"]]
    assert len(picked) == 1 and picked[0]["measured_tokens_per_s"] == max(r["measured_tokens_per_s"] for r in rows)
    assert config.measured["tokens_per_s"] == picked[0]["measured_tokens_per_s"]
    assert config.tree == picked[0]["tree"] and config.token_map_size == picked[0]["map_size"]
    assert (config.target, config.dtype, config.context_rows, config.context_budget) == \
        (str(target_dir), "fp32", 8, "fixed")
    if config.token_map_size is not None:
        assert TokenMap.load(config.token_map_path).k == config.token_map_size
    assert details["meta"]["commit"] and details["meta"]["machine"]["cores"]
    assert set(details["measurements"]["ranks"]) == {"full", "16", "64"}
    assert "## Predicted against measured" in (report / "tune.md").read_text()


@pytest.mark.parametrize("extra, message", [
    (["--top", "0"], "--top must be >= 1"),
    (["--confirm-prompts", "2"], "--confirm-prompts cannot exceed --num-prompts"),
    (["--draft", "none"], "needs a --draft model"),
    (["--token-map-sizes", "16,16"], "distinct positive sizes"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
])
def test_cli_tune_bad_input_is_one_line(tiny_dirs, tmp_path, capsys, extra, message):
    target_dir, draft_dir = tiny_dirs
    code = main(["tune", "--target", str(target_dir), "--draft", str(draft_dir), "--num-prompts", "1",
                 "--out", str(tmp_path / "t.json"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "t.json").exists()


def test_cli_bench_runs_the_config_as_a_row(tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    tok = load_tokenizer(str(target_dir))
    TokenMap.from_counts(count_tokens(tok, CORPUS, vocab_size=VOCAB), top_k=32).save(tmp_path / "m32.safetensors")
    config = DecodeConfig(target=str(target_dir), draft=str(draft_dir), dtype="fp32", token_map_size=32,
                          token_map_path="m32.safetensors", tree="static-2x2").save(tmp_path / "tune.json")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in CORPUS))
    base = ["bench", "--config", str(config), "--dataset", str(prompts), "--num-prompts", "2", "--max-new-tokens",
            "6", "--threads", "1",
            "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0
    payload = json.loads((tmp_path / "a" / "results.json").read_text())
    assert [r["label"] for r in payload["rows"]] == ["vanilla", "draft static-2x2", "fr-spec static-2x2 map=32"]
    assert all(r["greedy_identical"] in ("yes", "reference") for r in payload["rows"])
    assert payload["meta"]["config"] == str(config) and payload["meta"]["dtype"] == "float32"
    # with an explicit grid, the config's rows are added to it
    assert main([*base, "--num-spec-tokens", "1", "--token-map-sizes", "16", "--counts",
                 str(_counts_file(tiny_dirs, tmp_path)), "--out", str(tmp_path / "b")]) == 0
    labels = [r["label"] for r in json.loads((tmp_path / "b" / "results.json").read_text())["rows"]]
    assert labels == ["vanilla", "draft k=1", "fr-spec k=1 map=16", "fr-spec auto (maps <= 16 or none)",
                      "draft static-2x2", "fr-spec static-2x2 map=32"]


def test_cli_bench_refuses_a_config_map_that_clashes(tiny_dirs, tmp_path, capsys):
    target_dir, draft_dir = tiny_dirs
    TokenMap(list(range(100, 116)), VOCAB).save(tmp_path / "odd16.safetensors")
    config = DecodeConfig(target=str(target_dir), draft=str(draft_dir), dtype="fp32", token_map_size=16,
                          token_map_path="odd16.safetensors", tree="chain-2").save(tmp_path / "tune.json")
    code = main(["bench", "--config", str(config), "--num-prompts", "1", "--max-new-tokens", "4", "--counts",
                 str(_counts_file(tiny_dirs, tmp_path)), "--token-map-sizes", "16", "--out", str(tmp_path / "o"),
                 "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "differs from the bench's map of the same size 16" in err


def test_cli_tune_notes_a_targets_mtp_layers(tiny_dirs, tmp_path, capsys):
    """With --draft, a target carrying MTP layers is detected (from its tensor names) and the note says that --mtp
    (or no --draft) tunes them (tests/tune/test_mtp_tune.py). A draft of another vocabulary then stops the run
    before any measurement."""
    from tests.bench.conftest import make_tokenizer
    from tests.decode.mtp_tiny import save_mtp_checkpoint
    from tests.decode.spec_tiny import tiny_lm

    mtp_dir = save_mtp_checkpoint(tmp_path / "mtp_target", "mimo", vocab=VOCAB)
    make_tokenizer().save_pretrained(mtp_dir)
    other = tmp_path / "other_draft"
    tiny_lm("qwen2", VOCAB + 8, dtype=torch.float32).save_pretrained(other)
    make_tokenizer().save_pretrained(other)
    code = main(["tune", "--target", str(mtp_dir), "--draft", str(other), "--dtype", "fp32", "--num-prompts", "1",
                 "--threads", "1", "--out", str(tmp_path / "t.json")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "carries 1 MTP layer(s) (mimo layout); --mtp (or no --draft) tunes them instead of the draft model" in err
    assert not (tmp_path / "t.json").exists()

    code = main(["tune", "--target", str(tiny_dirs[0]), "--draft", str(other), "--dtype", "fp32", "--num-prompts",
                 "1", "--threads", "1", "--out", str(tmp_path / "t.json")])
    assert code == 2 and "MTP layer" not in capsys.readouterr().err
