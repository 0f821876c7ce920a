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


@pytest.mark.parametrize("flag, eager", [([], True), (["--vllm-compiled"], False)])
def test_vllm_rows_are_eager_by_default_and_compiled_on_request(flag, eager):
    """Issue 19's table has compiled and eager rows: one run each, the flag picks vLLM's enforce_eager."""
    import argparse

    from frspec.bench.methods import VANILLA, Method
    from frspec.bench.vllm_runner import Drafters, _engine_kwargs
    from frspec.commands.bench import plan_from_args, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["bench", "--engine", "vllm", "--batch-sizes", "1,4,16", *flag])
    plan = plan_from_args(args)
    assert plan.batch_sizes == (1, 4, 16) and plan.vllm_compiled is (not eager)
    kwargs = _engine_kwargs(Method(VANILLA), "target", Drafters(), "float32", 256, 16, 0, plan.vllm_compiled)
    assert kwargs["enforce_eager"] is eager


@pytest.mark.parametrize("distinct, batch, n", [(4, 1, 4), (4, 4, 4), (4, 16, 16), (6, 4, 8), (3, 2, 4)])
def test_each_batch_size_decodes_every_prompt_once_in_whole_batches(distinct, batch, n):
    from frspec.bench.vllm_runner import prompts_per_batch_size

    assert prompts_per_batch_size(distinct, batch) == n
