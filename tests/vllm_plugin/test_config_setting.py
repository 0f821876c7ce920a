"""FRSPEC_CONFIG: the plugin reads its token map from a decode config (FRSPEC_TOKEN_MAP still wins), logs a draft
length that differs from vLLM's, and `frspec serve --config` fills in vLLM's model and speculative options. Runs
without vLLM."""

from __future__ import annotations

import json
import logging

import pytest

from frspec.decode.decode_config import DecodeConfig
from frspec.errors import FrspecError
from frspec.vllm_plugin import settings


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    monkeypatch.delenv(settings.TOKEN_MAP_ENV, raising=False)
    (tmp_path / "config.json").write_text("{}")  # a model directory as far as serve's resolution is concerned
    path = DecodeConfig(target=str(tmp_path), draft=str(tmp_path), token_map_size=8,
                        token_map_path="tune-map8.safetensors", tree="chain-3").save(tmp_path / "tune.json")
    monkeypatch.setenv(settings.CONFIG_ENV, str(path))
    return path


def test_the_config_gives_the_map_unless_the_map_variable_is_set(config_file, monkeypatch):
    assert settings.token_map_path() == str(config_file.parent / "tune-map8.safetensors")
    monkeypatch.setenv(settings.TOKEN_MAP_ENV, "/explicit/map.pt")
    assert settings.token_map_path() == "/explicit/map.pt"
    monkeypatch.delenv(settings.TOKEN_MAP_ENV)
    monkeypatch.delenv(settings.CONFIG_ENV)
    assert settings.token_map_path() is None and settings.configured() is None


def test_a_config_without_a_map_leaves_fr_spec_off(tmp_path, monkeypatch):
    monkeypatch.delenv(settings.TOKEN_MAP_ENV, raising=False)
    path = DecodeConfig(target="t", draft="d", tree="chain-4").save(tmp_path / "c.json")
    monkeypatch.setenv(settings.CONFIG_ENV, str(path))
    assert settings.token_map_path() is None


def test_a_different_speculative_length_is_logged(config_file, caplog):
    assert settings.speculative_length_mismatch(3) is None
    message = settings.speculative_length_mismatch(5)
    assert "tuned for 3 draft tokens" in message and "num_speculative_tokens is 5" in message
    with caplog.at_level(logging.WARNING, logger="vllm.frspec"):
        settings.warn_if_length_differs(5)
        settings.warn_if_length_differs(3)
    assert [r.getMessage() for r in caplog.records] == [f"FR-Spec: {message}"]


def test_a_tree_config_says_vllm_drafts_chains(tmp_path, monkeypatch):
    path = DecodeConfig(target="t", draft="d", tree="static-2x2").save(tmp_path / "c.json")
    monkeypatch.setenv(settings.CONFIG_ENV, str(path))
    assert "static-2x2 tree" in settings.speculative_length_mismatch(2)


def test_a_bad_config_is_one_line_naming_it(tmp_path, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    monkeypatch.delenv(settings.TOKEN_MAP_ENV, raising=False)
    monkeypatch.setenv(settings.CONFIG_ENV, str(bad))
    with pytest.raises(FrspecError, match="bad.json: not valid JSON"):
        settings.token_map_path()


def test_serve_fills_in_the_model_and_the_draft_length(config_file):
    from frspec.commands.serve import config_server_args

    config = DecodeConfig.load(config_file)
    args = config_server_args(config, ["--port", "8001"])
    assert args[:2] == ["--model", config.target]
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "model": config.draft, "num_speculative_tokens": 3}
    assert args[-2:] == ["--port", "8001"]
    given = ["--model", "m", "--speculative-config", "{}"]
    assert config_server_args(config, given) == given  # vLLM's own options win


def test_serve_gives_an_mtp_config_vllms_mtp_method(tmp_path):
    from frspec.commands.serve import config_server_args

    (tmp_path / "config.json").write_text("{}")
    config = DecodeConfig(target=str(tmp_path), mtp=True, tree="static-3x2")
    args = config_server_args(config, [])
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "mtp", "num_speculative_tokens": 3}  # vLLM drafts the tree's depth as a chain


def test_v1_compact_setting_is_on_by_default_and_refuses_other_values(monkeypatch):
    from frspec.errors import FrspecError
    from frspec.vllm_plugin.settings import V1_COMPACT_ENV, v1_compact_path

    monkeypatch.delenv(V1_COMPACT_ENV, raising=False)
    assert v1_compact_path() is True
    monkeypatch.setenv(V1_COMPACT_ENV, "0")
    assert v1_compact_path() is False
    monkeypatch.setenv(V1_COMPACT_ENV, "no")
    with pytest.raises(FrspecError, match="FRSPEC_V1_COMPACT must be 0 or 1"):
        v1_compact_path()
