"""`frspec bench --engine vllm` where vLLM is not installed (the main venv): one line saying how to get it."""

import pytest

from frspec.cli import main


def test_without_vllm_the_command_says_how_to_get_it(capsys):
    try:
        from vllm import LLM  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vLLM is installed here")
    assert main(["bench", "--engine", "vllm", "--out", "/nonexistent"]) == 2
    err = capsys.readouterr().err.strip()
    assert "setup_vllm.sh" in err and "\n" not in err
