"""`frspec generate --quant`: a quantized draft + FR-Spec map gives exactly the quantized target's own output."""

from __future__ import annotations

import json

import pytest

from frspec import cli
from frspec.vocab.token_map import TokenMap

from tests.decode.spec_tiny import TOKENIZER_VOCAB, save_tiny_pair


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    vocab = save_tiny_pair(root, "qwen2", 16 * -(-TOKENIZER_VOCAB // 16))  # a multiple of the int4 packing's 16
    TokenMap(list(range(40)), vocab).save(root / "map.frspec")
    return root


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_generate_quantized_is_lossless_against_the_quantized_target(model_dirs, capsys, quant):
    base = ["generate", "--target", str(model_dirs / "target"), "--prompt", "hello there", "--max-new-tokens",
            "12", "--dtype", "fp32", "--json", "--threads", "1", "--quant", quant]
    outputs = {}
    for name, extra in (("vanilla", []), ("fr-spec", ["--draft", str(model_dirs / "draft"), "--token-map",
                                                       str(model_dirs / "map.frspec"), "--num-spec-tokens", "3"]),
                        ("draft", ["--draft", str(model_dirs / "draft"), "--draft-quant", "int8"])):
        assert cli.main(base + extra) == 0
        outputs[name] = json.loads(capsys.readouterr().out)
    assert outputs["fr-spec"]["method"] == "fr-spec"
    assert outputs["fr-spec"]["token_ids"] == outputs["vanilla"]["token_ids"]
    assert outputs["draft"]["token_ids"] == outputs["vanilla"]["token_ids"]
    with pytest.raises(SystemExit):
        cli.main(base[:-1] + ["int3"])


def test_generate_chain_length_auto_follows_the_measured_curve(model_dirs, capsys):
    """A quantized target with a draft model measures its chain length by default (or with `auto`); the output is
    still the quantized target's own."""
    base = ["generate", "--target", str(model_dirs / "target"), "--prompt", "hello there", "--max-new-tokens",
            "10", "--dtype", "fp32", "--json", "--threads", "1", "--quant", "int4"]
    assert cli.main(base) == 0
    vanilla = json.loads(capsys.readouterr().out)
    for extra in ([], ["--num-spec-tokens", "auto"]):
        assert cli.main(base + ["--draft", str(model_dirs / "draft")] + extra) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["token_ids"] == vanilla["token_ids"]
        assert 1 <= out["stats"]["num_spec_tokens"] <= 8
    assert cli.main(base + ["--draft", str(model_dirs / "draft"), "--num-spec-tokens", "many"]) == 2
    assert "--num-spec-tokens must be a number or auto" in capsys.readouterr().err
