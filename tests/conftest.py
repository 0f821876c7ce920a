import os

# No model hub is reachable on CI machines; without this a hub-id lookup retries for most of a minute before failing.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny test models run fastest, and least disturbed by other processes' load, on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

# tests/vllm needs vLLM's CPU build, which lives in its own venv (scripts/setup_vllm.sh; scripts/test.sh runs it).
import importlib.util

_vllm = importlib.util.find_spec("vllm")  # not tests/vllm: that is the package tests.vllm
collect_ignore = [] if _vllm is not None and _vllm.origin not in (None, "namespace") else ["vllm"]
