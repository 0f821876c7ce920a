"""The default models: parts located in packages, assembled with size/SHA-256 checks, converted once."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch

from frspec.errors import FrspecError
from frspec.models import cache, defaults
from frspec.models.defaults import DEFAULT_MODELS, ROLES, DefaultModel, default_model, prepare_default_models
from frspec.models.loading import load_model

from tests.models.tiny_gguf_models import logits

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = None

FAKE_NAME = "tiny-qwen2-default"


@pytest.fixture
def fake_default(tmp_path, tiny_gguf, monkeypatch) -> tuple[DefaultModel, torch.nn.Module]:
    """A registered default model whose GGUF (the tiny one) is split over three fake installed part packages."""
    path, reference = tiny_gguf
    data = path.read_bytes()
    model = DefaultModel(
        name=FAKE_NAME, role="draft", package_prefix="fake-tiny-part", version="1.0", num_parts=3,
        gguf_name="tiny-default.gguf", size=len(data), sha256=hashlib.sha256(data).hexdigest(),
    )
    packages = {}
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    for i in range(1, 4):
        package = tmp_path / "site-packages" / model.module(i)
        (package / "data").mkdir(parents=True)
        (package / "data" / f"part{i:02d}.bin").write_bytes(data[cut[i - 1] : cut[i]])
        packages[model.module(i)] = package
    monkeypatch.setattr(defaults, "find_package_dir", packages.get)
    monkeypatch.setitem(DEFAULT_MODELS, FAKE_NAME, model)
    monkeypatch.setitem(ROLES, "draft", FAKE_NAME)
    return model, reference


def test_prepare_assembles_converts_and_removes_the_gguf(cache_root, fake_default):
    model, reference = fake_default
    dirs = prepare_default_models(which=("draft",), progress=False)
    assert dirs == {"draft": cache_root / "models" / FAKE_NAME}
    assert (dirs["draft"] / "tokenizer.json").is_file()
    assert not (cache_root / "gguf" / model.gguf_name).exists()
    assert torch.equal(logits(load_model(dirs["draft"], dtype="fp32")), logits(reference))


def test_default_name_is_a_load_model_spec(cache_root, fake_default):
    _, reference = fake_default
    assert torch.equal(logits(load_model(FAKE_NAME, dtype="fp32")), logits(reference))


def test_prepared_model_is_not_assembled_again(cache_root, fake_default, monkeypatch):
    prepare_default_models(which=(FAKE_NAME,), progress=False)
    monkeypatch.setattr(defaults, "assemble_gguf", lambda *a: pytest.fail("assembled again"))
    monkeypatch.setattr(cache, "dequantize_gguf", lambda *a: pytest.fail("converted again"))
    assert prepare_default_models(which=(FAKE_NAME,), verify=True)[FAKE_NAME].is_dir()


def test_concurrent_prepares_of_one_model_build_it_once(cache_root, fake_default, monkeypatch):
    """Two processes (threads here: flock locks are per open file) preparing one model: the second waits for the
    first and then finds it prepared, instead of assembling into and deleting the same GGUF."""
    import threading
    import time

    real_build = defaults._build
    builds = []

    def slow_build(*args):
        builds.append(threading.current_thread().name)
        time.sleep(0.5)  # long enough for the other thread to reach the lock
        real_build(*args)

    monkeypatch.setattr(defaults, "_build", slow_build)
    errors = []

    def run():
        try:
            prepare_default_models(which=(FAKE_NAME,), progress=False)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, name=f"p{i}") for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(builds) == 1
    assert defaults.is_prepared(fake_default[0], None, verify=True)


def test_keep_gguf_then_force_reuses_nothing_stale(cache_root, fake_default):
    model, _ = fake_default
    prepare_default_models(which=("draft",), progress=False, keep_gguf=True)
    kept = cache_root / "gguf" / model.gguf_name
    assert kept.read_bytes() == b"".join(p.read_bytes() for p in defaults.part_paths(model))
    prepare_default_models(which=("draft",), progress=False, force=True)
    assert not kept.exists()


def test_entry_built_from_another_gguf_is_rebuilt(cache_root, fake_default):
    model, _ = fake_default
    entry = prepare_default_models(which=("draft",), progress=False)["draft"]
    marker = json.loads((entry / cache.MARKER).read_text())
    marker["source"]["sha256"] = "0" * 64  # e.g. left by an older release of the default model
    (entry / cache.MARKER).write_text(json.dumps(marker))
    assert not defaults.is_prepared(model)
    prepare_default_models(which=("draft",), progress=False)
    assert defaults.is_prepared(model, verify=True)


@pytest.mark.parametrize("field, message", [("size", "bytes, expected"), ("sha256", "SHA-256")])
def test_assembly_checks_size_and_sha(cache_root, fake_default, monkeypatch, field, message):
    model, _ = fake_default
    wrong = dataclasses.replace(model, **{field: model.size + 1 if field == "size" else "ab" * 32})
    monkeypatch.setitem(DEFAULT_MODELS, FAKE_NAME, wrong)
    with pytest.raises(FrspecError, match=message) as err:
        prepare_default_models(which=(FAKE_NAME,), progress=False)
    assert "--force-reinstall fake-tiny-part1==1.0" in str(err.value)
    assert not (cache_root / "gguf").exists() or list((cache_root / "gguf").iterdir()) == []
    assert not (cache_root / "models" / FAKE_NAME).exists()


def test_missing_part_packages_give_the_install_command(cache_root, fake_default, monkeypatch):
    model, _ = fake_default
    monkeypatch.setattr(defaults, "find_package_dir", lambda module: None)
    with pytest.raises(FrspecError) as err:
        prepare_default_models(which=("draft",), progress=False)
    message = str(err.value)
    assert "pip install -e '.[models]'" in message
    assert all(package in message for package in model.packages())


def test_real_locator_reports_uninstalled_packages():
    ghost = dataclasses.replace(default_model("target"), package_prefix="frspec-no-such-package-part", num_parts=2)
    with pytest.raises(FrspecError, match="frspec-no-such-package-part1==0.2.0 frspec-no-such-package-part2==0.2.0"):
        defaults.part_paths(ghost)


def test_unknown_default_name():
    with pytest.raises(FrspecError, match="unknown default model"):
        default_model("llama-7b")


def test_registry_matches_the_models_extra_in_pyproject():
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if tomllib is None or not pyproject.is_file():
        pytest.skip("needs tomllib and the source checkout")
    extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["models"]
    assert sorted(p for m in DEFAULT_MODELS.values() for p in m.packages()) == sorted(extra)
    assert default_model("target").name == "qwen2.5-coder-1.5b-instruct"
    assert default_model("draft").name == "qwen2.5-coder-0.5b-instruct"


@pytest.mark.parametrize("role", ["target", "draft"])
def test_installed_parts_add_up_to_the_expected_size(role):
    model = default_model(role)
    try:
        parts = defaults.part_paths(model)
    except FrspecError:
        pytest.skip(f"{model.name} part packages are not installed")
    assert [p.name for p in parts] == [f"part{i:02d}.bin" for i in range(1, model.num_parts + 1)]
    assert sum(p.stat().st_size for p in parts) == model.size
