"""The table of vLLM symbols: a vLLM that lacks one is refused in one line naming its version and the symbol
(a fake vLLM module tree here, so this runs without vLLM; tests/vllm checks the real one has them all)."""

import types

import pytest

from frspec.errors import FrspecError
from frspec.vllm_plugin.internals import SYMBOLS, Symbol, check_vllm, missing_symbol


class FakeRunner:
    def __init__(self):
        self.speculator = None

    def load_model(self):
        pass


def fake_vllm(name):
    modules = {"vllm.fake.runner": types.SimpleNamespace(Runner=FakeRunner)}
    if name not in modules:
        raise ModuleNotFoundError(name)
    return modules[name]


PRESENT = Symbol("vllm.fake.runner", "Runner.load_model", "hook", attrs=())


def test_every_symbol_present_passes():
    assert missing_symbol([PRESENT, Symbol("vllm.fake.runner", "Runner", "read", attrs=("speculator",))],
                          fake_vllm) is None
    check_vllm([PRESENT], fake_vllm, version="9.9.9")


@pytest.mark.parametrize("symbol, missing", [
    (Symbol("vllm.fake.runner", "Runner.propose_draft_token_ids", "hook"),
     "vllm.fake.runner:Runner.propose_draft_token_ids"),
    (Symbol("vllm.fake.moved", "Runner", "read"), "vllm.fake.moved:Runner"),
    (Symbol("vllm.fake.runner", "Runner", "read", attrs=("speculator", "drafter")), "vllm.fake.runner:Runner.drafter"),
])
def test_a_missing_symbol_is_refused_in_one_line_with_the_version(symbol, missing):
    with pytest.raises(FrspecError) as err:
        check_vllm([PRESENT, symbol], fake_vllm, version="9.9.9")
    message = str(err.value)
    assert "vLLM 9.9.9" in message and missing in message and "\n" not in message


def test_the_table_names_each_symbol_once_and_says_why():
    names = [s.name for s in SYMBOLS]
    assert len(names) == len(set(names))
    assert all(s.use and s.runner in ("all", "V1", "V2") for s in SYMBOLS)
