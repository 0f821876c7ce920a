"""The decode config file `frspec tune` writes: round trip, relative map paths, and every bad file a one-line
FrspecError naming it."""

from __future__ import annotations

import json

import pytest

from frspec.decode.decode_config import DecodeConfig
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError


def _config(**kw) -> DecodeConfig:
    base = dict(target="t", draft="d", dtype="bf16", token_map_size=32, token_map_path="m.safetensors",
                tree="static-2x2", context_rows=16, context_budget="additive",
                predicted={"tokens_per_s": 5.0}, measured={"tokens_per_s": 4.5}, provenance={"commit": "abc"})
    base.update(kw)
    return DecodeConfig(**base)


def test_round_trip_and_relative_map_path(tmp_path):
    path = _config().save(tmp_path / "sub" / "tune.json")
    data = json.loads(path.read_text())
    assert data["schema"] == "frspec-config" and data["version"] == 1
    assert data["token_map"] == {"size": 32, "path": "m.safetensors"} and data["tree"] == "static-2x2"
    assert list(data)[:8] == ["schema", "version", "target", "draft", "dtype", "quant", "draft_quant", "token_map"]
    loaded = DecodeConfig.load(path)
    assert loaded.token_map_path == str(tmp_path / "sub" / "m.safetensors")  # relative to the config's folder
    assert loaded.shape == TreeShape.static(2, 2)
    assert (loaded.target, loaded.draft, loaded.dtype, loaded.context_rows, loaded.context_budget) == \
        ("t", "d", "bf16", 16, "additive")
    assert loaded.predicted == {"tokens_per_s": 5.0} and loaded.provenance == {"commit": "abc"}
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["tune.json"]  # no temporary file left behind
    vanilla = DecodeConfig(target="t")
    vanilla.save(tmp_path / "v.json")
    again = DecodeConfig.load(tmp_path / "v.json")
    assert again == vanilla and again.shape is None and again.token_map_path is None


def _write(tmp_path, data) -> str:
    path = tmp_path / "c.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


GOOD = {"schema": "frspec-config", "version": 1, "target": "t", "draft": "d", "tree": "chain-3", "token_map": None}


@pytest.mark.parametrize("data, message", [
    ("{not json", "not valid JSON"),
    ([1, 2], "expected a JSON object"),
    ({**GOOD, "schema": "other"}, "not an frspec config"),
    ({**GOOD, "version": 2}, "config version 2 is not supported"),
    ({**GOOD, "colour": "red"}, "unknown keys colour"),
    ({k: v for k, v in GOOD.items() if k != "target"}, "missing 'target'"),
    ({**GOOD, "tree": "ladder-3"}, "bad shape 'ladder-3'"),
    ({**GOOD, "tree": None}, "'tree' is set exactly when there is a 'draft'"),
    ({**GOOD, "token_map": {"size": 32}}, "'token_map' needs both 'size' and 'path'"),
    ({**GOOD, "token_map": {"size": 0, "path": "m"}}, "'size' must be a positive integer"),
    ({**GOOD, "token_map": "m.pt"}, "'token_map' must be null or an object"),
    ({**GOOD, "draft": None, "tree": None, "token_map": {"size": 3, "path": "m"}}, "it needs a 'draft'"),
    ({**GOOD, "context_budget": "sometimes"}, "'context_budget' must be one of fixed, additive"),
    ({**GOOD, "context_rows": -1}, "'context_rows' must be an integer >= 0"),
    ({**GOOD, "measured": [1]}, "'measured' must be an object"),
])
def test_bad_config_is_one_line_naming_the_file(tmp_path, data, message):
    path = _write(tmp_path, data)
    with pytest.raises(FrspecError) as e:
        DecodeConfig.load(path)
    text = str(e.value)
    assert message in text and path in text and "\n" not in text


def test_missing_config_file(tmp_path):
    with pytest.raises(FrspecError, match="config file not found"):
        DecodeConfig.load(tmp_path / "nope.json")
