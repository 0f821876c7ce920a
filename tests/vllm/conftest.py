"""vLLM tests: run with .venv-vllm (`bash scripts/setup_vllm.sh`); the main suite skips this folder when vLLM is
not importable (tests/conftest.py). Engines run in this process (no engine-core or worker subprocess), so the
tests can read what the drafter and the rejection sampler see; the served test covers vLLM's own processes."""

import os

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.pop("FRSPEC_TOKEN_MAP", None)
os.environ.pop("FRSPEC_TOKEN_MAP_FORMAT", None)

import pytest

from tests.vllm.vllm_tiny import build_models


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Tiny random fp32 models saved as HF directories with a tokenizer, and token maps for them."""
    return build_models(tmp_path_factory.mktemp("vllm-tiny"))


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Overrides the suite's one-thread default: vLLM's CPU worker sets its own threads."""
    yield
