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
                                  "--context-rows", "16", "--context-budget", budget], capsys)
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
