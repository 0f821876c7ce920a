import os

# No model hub is reachable on CI machines; without this a hub-id lookup retries for most of a minute before failing.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import atexit
import shutil
import tempfile
from pathlib import Path

import pytest
import torch


def _isolate_step_costs() -> None:
    """Tests measure step costs of throw-away models; keep those records out of the user's cache. Everything else
    in it (prepared models, tokenizers, counted maps) is shared through links, so the tests that use the real
    models still find them."""
    real = Path(os.environ.get("FRSPEC_CACHE") or Path.home() / ".cache" / "frspec")
    isolated = Path(tempfile.mkdtemp(prefix="frspec-test-cache-"))
    if real.is_dir():
        for entry in real.iterdir():
            if entry.name != "step_costs":
                (isolated / entry.name).symlink_to(entry.resolve())
    os.environ["FRSPEC_CACHE"] = str(isolated)
    atexit.register(shutil.rmtree, isolated, True)  # unlinks the links, never follows them


_isolate_step_costs()


@pytest.fixture(autouse=True)
def _nothing_carried():
    """Every test's generators start from nothing learnt: what an earlier test's requests taught the controller is
    kept beside the session's step costs (decode/carried_state.py) and would make a test's outcome depend on the
    order tests ran in."""
    shutil.rmtree(Path(os.environ["FRSPEC_CACHE"]) / "step_costs" / "carried", ignore_errors=True)


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
