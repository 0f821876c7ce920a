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


def test_generate_auto_measures_costs_for_each_weight_format(model_dirs, capsys, tmp_path, monkeypatch):
    """`generate --draft` (auto length) on an int4 pair measures the controller's costs for the int4 target, int4
    draft body and int4 drafter head, in a cache entry of their own: the float pair's entry is never reused."""
    monkeypatch.setenv("FRSPEC_CACHE", str(tmp_path))
    base = ["generate", "--target", str(model_dirs / "target"), "--draft", str(model_dirs / "draft"), "--prompt",
            "hello there", "--max-new-tokens", "8", "--dtype", "fp32", "--json", "--threads", "1"]
    records = {}
    for quant in ("none", "int4", "int8"):
        assert cli.main(base + ["--quant", quant]) == 0
        records[quant] = json.loads(capsys.readouterr().out)["auto"]
    assert len(list((tmp_path / "step_costs").glob("*.json"))) == 3
    target, drafter = records["int4"]["costs_models"]
    assert "Int4Linear" in target and "Int4Linear" in drafter.split("|head:")[0]
    assert "Int4Linear" in drafter.split("|head:")[1]  # the drafter's own head, quantized apart from the model
    assert all("Int" not in m for m in records["none"]["costs_models"])
    assert all("Int8Linear" in m for m in records["int8"]["costs_models"])
    assert records["int4"]["costs_contexts"] == [128, 512, 2048]
    # The int4 pair again: read from the cache, nothing measured.
    from frspec.decode import cost_measure

    def measure(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(cost_measure, "measure_step_costs", measure)
    assert cli.main(base + ["--quant", "int4"]) == 0
    assert json.loads(capsys.readouterr().out)["auto"] == records["int4"]
    assert len(list((tmp_path / "step_costs").glob("*.json"))) == 3
