"""`frspec generate` end to end on tiny models saved to a temporary directory."""

from __future__ import annotations

import json

import pytest

from frspec import cli
from frspec.vocab.token_map import TokenMap

from tests.decode.spec_tiny import save_tiny_pair


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    pytest.importorskip("frspec.models.loading")
    root = tmp_path_factory.mktemp("models")
    TokenMap(list(range(40)), save_tiny_pair(root)).save(root / "map.frspec")
    return root


def _run(argv, capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_json(model_dirs, capsys):
    base = ["generate", "--target", str(model_dirs / "target"), "--prompt", "hello", "--max-new-tokens", "8",
            "--dtype", "fp32", "--json", "--threads", "1"]
    code, out, err = _run(base, capsys)
    assert code == 0, err
    vanilla = json.loads(out)
    assert vanilla["method"] == "vanilla" and len(vanilla["token_ids"]) <= 8 and isinstance(vanilla["text"], str)
    for key in ("tokens", "target_forwards", "acceptance_length", "decode_tokens_per_s", "end_to_end_tokens_per_s",
                "forward_ratio"):
        assert key in vanilla["stats"]
    code, out, err = _run(base + ["--draft", str(model_dirs / "draft"), "--token-map", str(model_dirs / "map.frspec"),
                                  "--num-spec-tokens", "3"], capsys)
    assert code == 0, err
    frspec = json.loads(out)
    assert frspec["method"] == "fr-spec" and frspec["token_ids"] == vanilla["token_ids"]  # lossless


def test_generate_streams_text_and_a_stats_line(model_dirs, capsys):
    code, out, err = _run(["generate", "--target", str(model_dirs / "target"), "--draft", str(model_dirs / "draft"),
                           "--prompt", "hi", "--max-new-tokens", "6", "--dtype", "fp32", "--raw",
                           "--temperature", "0.8", "--seed", "1"], capsys)
    assert code == 0, err
    assert "tokens in" in err and "acceptance length" in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--num-spec-tokens", "0"], "num_spec_tokens"),
        (["--token-map", "missing.frspec"], "--draft"),
        (["--temperature", "-1"], "temperature"),
    ],
)
def test_generate_bad_input_is_one_line(model_dirs, capsys, extra, message):
    code, out, err = _run(["generate", "--target", str(model_dirs / "target"), "--prompt", "x"] + extra, capsys)
    assert code == 2 and err.startswith("frspec: error:") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("budget", ["fixed", "additive"])
def test_generate_with_context_rows_is_lossless(model_dirs, capsys, budget):
    base = ["generate", "--target", str(model_dirs / "target"), "--prompt", "hello there", "--max-new-tokens", "8",
            "--dtype", "fp32", "--json", "--threads", "1"]
    code, out, err = _run(base, capsys)
    vanilla = json.loads(out)
    code, out, err = _run(base + ["--draft", str(model_dirs / "draft"), "--token-map", str(model_dirs / "map.frspec"),
                                  "--context-rows", "16", "--context-budget", budget, "--num-spec-tokens", "3"], capsys)
    assert code == 0, err
    record = json.loads(out)
    assert record["token_ids"] == vanilla["token_ids"] and record["method"] == "fr-spec"
    assert record["context"]["budget"] == budget and 0 < record["context"]["request_rows"] <= 16


@pytest.mark.parametrize("extra, message", [
    (["--context-rows", "8"], "--context-rows extends a token map"),
    (["--context-rows", "-1"], "--context-rows must be >= 0"),
])
def test_generate_refuses_bad_context_options(model_dirs, capsys, extra, message):
    code, _, err = _run(["generate", "--target", str(model_dirs / "target"), "--prompt", "hi",
                         "--draft", str(model_dirs / "draft"), *extra], capsys)
    assert code == 2 and message in err and "Traceback" not in err


def test_generate_token_map_size_auto_and_fixed(model_dirs, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FRSPEC_CACHE", str(tmp_path / "cache"))
    base = ["generate", "--target", str(model_dirs / "target"), "--prompt", "hello there", "--max-new-tokens", "10",
            "--dtype", "fp32", "--json", "--threads", "1"]
    code, out, err = _run(base, capsys)
    vanilla = json.loads(out)
    drafted = base + ["--draft", str(model_dirs / "draft"), "--token-map", str(model_dirs / "map.frspec")]
    # The default: the controller chooses length and map size (a ranked head over the map's 40 ids and the rest).
    code, out, err = _run(drafted, capsys)
    assert code == 0, err
    auto = json.loads(out)
    assert auto["token_ids"] == vanilla["token_ids"]
    assert 40 in auto["auto"]["map_sizes"] and auto["auto"]["draft_lengths"][0] == 0
    assert sum(auto["stats"]["chosen_depth_histogram"]) == auto["stats"]["target_forwards"]
    # A fixed length with an automatic size, and a fixed size (static: no controller at a fixed length).
    code, out, err = _run(drafted + ["--num-spec-tokens", "2", "--token-map-size", "auto"], capsys)
    record = json.loads(out)
    assert code == 0 and record["token_ids"] == vanilla["token_ids"] and record["auto"]["draft_lengths"] == [2]
    plain, *drafted_steps = record["stats"]["chosen_depth_histogram"]  # plain steps: only at the token budget's end
    assert sum(record["stats"]["chosen_map_sizes"].values()) == sum(drafted_steps) > 0 and plain <= 1
    code, out, err = _run(drafted + ["--num-spec-tokens", "2", "--token-map-size", "16"], capsys)
    record = json.loads(out)
    assert code == 0 and record["token_ids"] == vanilla["token_ids"] and "auto" not in record
    assert record["method"] == "fr-spec"
    # A quantized drafter head: the ranked head is packed once and the controller still chooses the size.
    code, out, err = _run(drafted + ["--draft-quant", "int8"], capsys)
    assert code == 0, err
    record = json.loads(out)
    assert record["token_ids"] == vanilla["token_ids"] and 40 in record["auto"]["map_sizes"]
    # Context rows copy float rows per request: not on a packed ranked head, said in one line.
    code, out, err = _run(drafted + ["--draft-quant", "int8", "--token-map-size", "auto", "--context-rows", "4",
                                     "--context-budget", "additive"], capsys)
    assert code == 2 and "takes no context rows" in err.strip().splitlines()[-1] and "Traceback" not in err


@pytest.mark.parametrize("extra, message", [
    (["--token-map-size", "x"], "--token-map-size must be a number or auto"),
    (["--token-map-size", "0"], "--token-map-size must be >= 1"),
    (["--draft", "D", "--token-map-size", "auto"], "give --token-map too"),
    (["--draft", "D", "--token-map", "M", "--token-map-size", "41", "--num-spec-tokens", "2"],
     "exceeds the token map's 40 ids"),
])
def test_generate_bad_map_size_is_one_line(model_dirs, capsys, extra, message):
    extra = [str(model_dirs / "draft") if a == "D" else str(model_dirs / "map.frspec") if a == "M" else a
             for a in extra]
    code, out, err = _run(["generate", "--target", str(model_dirs / "target"), "--prompt", "x", "--dtype", "fp32"]
                          + extra, capsys)
    last = err.strip().splitlines()[-1]  # (a size checked against the loaded map follows the loading's progress)
    assert code == 2 and last.startswith("frspec: error:") and message in last, err


def test_generate_auto_size_with_context_rows(model_dirs, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FRSPEC_CACHE", str(tmp_path / "cache"))
    base = ["generate", "--target", str(model_dirs / "target"), "--prompt", "hello there", "--max-new-tokens", "8",
            "--dtype", "fp32", "--json", "--threads", "1"]
    code, out, err = _run(base, capsys)
    vanilla = json.loads(out)
    drafted = base + ["--draft", str(model_dirs / "draft"), "--token-map", str(model_dirs / "map.frspec"),
                      "--token-map-size", "auto", "--num-spec-tokens", "2", "--context-rows", "8"]
    code, out, err = _run(drafted + ["--context-budget", "additive"], capsys)
    assert code == 0, err
    record = json.loads(out)
    assert record["token_ids"] == vanilla["token_ids"] and 0 < record["context"]["request_rows"] <= 8
    code, out, err = _run(drafted, capsys)  # the default fixed budget needs a fixed size
    assert code == 2 and "--context-budget additive" in err.strip().splitlines()[-1]
