"""`frspec serve`: the server command line and environment it hands over to vLLM."""

import pytest

from frspec.cli import build_parser, main


def test_serve_passes_the_map_to_the_plugin_and_the_rest_to_vllm(tmp_path, monkeypatch):
    pytest.importorskip("vllm.entrypoints.openai.api_server")
    from frspec.commands.serve import server_command

    token_map = tmp_path / "map.pt"
    token_map.write_bytes(b"")
    args = build_parser().parse_args(["serve", "--token-map", str(token_map), "--token-map-format", "thunlp", "--",
                                      "--model", "m", "--port", "8001"])
    command, env = server_command(args)
    assert command[1:] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--port", "8001"]
    assert env["FRSPEC_TOKEN_MAP"] == str(token_map.resolve()) and env["FRSPEC_TOKEN_MAP_FORMAT"] == "thunlp"


def test_serve_refuses_a_missing_map_in_one_line(capsys):
    assert main(["serve", "--token-map", "/nonexistent/map.pt", "--", "--model", "m"]) == 2
    err = capsys.readouterr().err.strip()
    assert "token map not found" in err and "\n" not in err


def test_serve_passes_the_context_rows_to_the_plugin(tmp_path):
    pytest.importorskip("vllm.entrypoints.openai.api_server")
    from frspec.commands.serve import server_command

    token_map = tmp_path / "map.pt"
    token_map.write_bytes(b"")
    args = build_parser().parse_args(["serve", "--token-map", str(token_map), "--context-rows", "1024",
                                      "--context-budget", "additive", "--", "--model", "m"])
    _, env = server_command(args)
    assert env["FRSPEC_CONTEXT_ROWS"] == "1024" and env["FRSPEC_CONTEXT_BUDGET"] == "additive"


def test_serve_refuses_an_automatic_length_in_one_line(tmp_path, capsys):
    from frspec.decode.decode_config import DecodeConfig

    DecodeConfig(target="t", draft="d", token_map_size=8, token_map_path="map.frspec", tree="auto").save(
        tmp_path / "auto.json")
    assert main(["serve", "--config", str(tmp_path / "auto.json"), "--", "--port", "8001"]) == 2
    err = capsys.readouterr().err.strip()
    assert "vLLM drafts a fixed length" in err and "\n" not in err


def test_serve_passes_an_automatic_map_size_to_the_plugin(tmp_path):
    pytest.importorskip("vllm.entrypoints.openai.api_server")
    from frspec.commands.serve import server_command
    from frspec.decode.decode_config import DecodeConfig

    token_map = tmp_path / "map.pt"
    token_map.write_bytes(b"")
    args = build_parser().parse_args(["serve", "--token-map", str(token_map), "--token-map-size", "auto", "--",
                                      "--model", "m"])
    assert server_command(args)[1]["FRSPEC_TOKEN_MAP_SIZE"] == "auto"
    # A tuned config whose map size is auto: the plugin reads it from FRSPEC_CONFIG (settings.auto_map_size).
    DecodeConfig(target="t", draft="d", token_map_size="auto", token_map_path=str(token_map), tree="chain-3").save(
        tmp_path / "auto.json")
    _, env = server_command(build_parser().parse_args(["serve", "--config", str(tmp_path / "auto.json"), "--",
                                                       "--model", "m"]))
    assert env["FRSPEC_CONFIG"] == str((tmp_path / "auto.json").resolve())
