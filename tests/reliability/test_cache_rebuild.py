"""A damaged model-cache entry is rebuilt from its GGUF, not reported as a broken model (models/cache.py,
models/loading.py), whether the damage changes a file's size (caught by the entry check) or not (caught when the
weights fail to load)."""

from __future__ import annotations

import json

import pytest

from frspec.models.cache import list_entries
from tests.reliability.test_bad_inputs import run_cli


def _generate(ws) -> list[int]:
    code, out, err = run_cli(["generate", "--target", ws.gguf, "--prompt", "hello", "--raw", "--max-new-tokens", "5",
                              "--dtype", "fp32", "--threads", "1", "--json"])
    assert code == 0, err
    return json.loads(out)["token_ids"]


@pytest.mark.parametrize("damage", ["same-size garbage", "truncated", "deleted"])
def test_damaged_entry_is_rebuilt(ws, damage):
    first = _generate(ws)
    (entry,) = [e for e in list_entries() if e.valid]
    weights = entry.path / "model.safetensors"
    size = weights.stat().st_size
    if damage == "same-size garbage":
        weights.write_bytes(b"\xff" * size)
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[: size // 2])
    else:
        weights.unlink()
    assert _generate(ws) == first
    assert weights.stat().st_size == size and all(e.valid for e in list_entries())
