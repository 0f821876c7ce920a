"""`frspec generate --config`: a decode config sets the models, map and draft shape; explicit options win; a bad
config is one line."""

from __future__ import annotations

import json

import pytest

from frspec import cli
from frspec.decode.decode_config import DecodeConfig
from frspec.vocab.token_map import TokenMap

from tests.decode.spec_tiny import save_tiny_pair


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    TokenMap(list(range(40)), save_tiny_pair(root)).save(root / "cfg-map40.safetensors")
    DecodeConfig(target=str(root / "target"), draft=str(root / "draft"), dtype="fp32", token_map_size=40,
                 token_map_path="cfg-map40.safetensors", tree="static-2x2").save(root / "tune.json")
    return root


def _json(argv, capsys) -> dict:
    code = cli.main(argv)
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


BASE = ["generate", "--prompt", "hello", "--max-new-tokens", "8", "--json", "--threads", "1"]


def test_the_config_sets_models_map_and_tree(model_dirs, capsys):
    tuned = _json([*BASE, "--config", str(model_dirs / "tune.json")], capsys)
    assert tuned["stats"]["tree"] == "static-2x2" and tuned["stats"]["num_spec_tokens"] == 2
    assert "fr-spec" in tuned["method"] or "40" in tuned["method"], tuned["method"]
    # the same run spelled out on the command line: the same tokens (greedy, lossless)
    explicit = _json([*BASE, "--target", str(model_dirs / "target"), "--draft", str(model_dirs / "draft"),
                      "--dtype", "fp32", "--token-map", str(model_dirs / "cfg-map40.safetensors"),
                      "--tree-depth", "2", "--tree-branching", "2"], capsys)
    assert explicit["method"] == tuned["method"] and explicit["token_ids"] == tuned["token_ids"]


def test_explicit_options_override_the_config(model_dirs, capsys):
    out = _json([*BASE, "--config", str(model_dirs / "tune.json"), "--num-spec-tokens", "3"], capsys)
    assert out["stats"]["tree"] == "chain-3"  # the shape options replace the config's tree
    vanilla = _json([*BASE, "--target", str(model_dirs / "target"), "--dtype", "fp32"], capsys)
    assert out["token_ids"] == vanilla["token_ids"]


def test_a_bad_config_is_one_line(model_dirs, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "frspec-config", "version": 1, "target": "t", "tree": "chain-2"}')
    for path, message in ((bad, "'tree' is set exactly when there is a 'draft'"),
                          (tmp_path / "missing.json", "config file not found")):
        assert cli.main([*BASE, "--config", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and str(path) in err and "\n" not in err and "Traceback" not in err
    assert cli.main(["generate", "--prompt", "hi"]) == 2
    assert "give --target (or --config FILE)" in capsys.readouterr().err
