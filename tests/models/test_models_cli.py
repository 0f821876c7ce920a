"""`frspec models prepare` and `frspec models list`."""

from __future__ import annotations

import hashlib

import pytest

from frspec.cli import main
from frspec.models import defaults
from frspec.models.defaults import DEFAULT_MODELS, ROLES, DefaultModel


@pytest.fixture
def fake_draft(tmp_path, tiny_gguf, monkeypatch) -> DefaultModel:
    """The default draft replaced by the tiny GGUF, shipped as a single fake part package."""
    data = tiny_gguf[0].read_bytes()
    model = DefaultModel(
        name="tiny-draft", role="draft", package_prefix="fake-draft-part", version="1.0", num_parts=1,
        gguf_name="tiny-draft.gguf", size=len(data), sha256=hashlib.sha256(data).hexdigest(),
    )
    package = tmp_path / "site-packages" / model.module(1)
    (package / "data").mkdir(parents=True)
    (package / "data" / "part01.bin").write_bytes(data)
    monkeypatch.setattr(defaults, "find_package_dir", {model.module(1): package}.get)
    monkeypatch.setitem(DEFAULT_MODELS, model.name, model)
    monkeypatch.setitem(ROLES, "draft", model.name)
    return model


def test_list_empty_cache(tmp_path, capsys):
    assert main(["models", "list", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no cached models" in out
    assert "frspec models prepare --only target" in out and "frspec models prepare --only draft" in out


def test_prepare_then_list(tmp_path, cache_root, fake_draft, capsys):
    assert main(["models", "prepare", "--only", "draft", "--cache-dir", str(tmp_path / "c")]) == 0
    assert "draft: tiny-draft ready" in capsys.readouterr().out
    assert main(["models", "list", "--cache-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "tiny-draft" in out and " ok " in out and str(tmp_path / "c" / "models" / "tiny-draft") in out
    assert "--only draft" not in out  # prepared now; only the target is still missing
    assert "--only target" in out


def test_list_flags_incomplete_entries(tmp_path, capsys):
    (tmp_path / "models" / "broken").mkdir(parents=True)
    main(["models", "list", "--cache-dir", str(tmp_path)])
    assert "INCOMPLETE" in capsys.readouterr().out


def test_prepare_without_packages_is_a_one_line_error(tmp_path, fake_draft, monkeypatch, capsys):
    monkeypatch.setattr(defaults, "find_package_dir", lambda module: None)
    assert main(["models", "prepare", "--only", "draft", "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("frspec: error: ") and err.count("\n") == 1
    assert "pip install -e '.[models]'" in err and "fake-draft-part1==1.0" in err
