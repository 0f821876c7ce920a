"""`frspec models prepare --only eagle-head`: the default head's recipe, run on a tiny target standing in for the
0.5B model, trains into the cache, is found by `--eagle default`, is not retrained, and resumes when interrupted."""

import pytest
import torch
from safetensors.torch import load_file

from frspec.bench.eagle_heads import resolve_eagle_head
from frspec.cli import main
from frspec.train import default_head

from tests.train.train_tiny import save_target_dir, write_chats

TINY_RECIPE = dict(assistant_only=True, max_tokens=3000, max_seq_len=256, epochs=2, lr=3e-3, batch_tokens=400,
                   loss_vocab=32, token_loss_weight=0.1, unroll=2, seed=0, eval_every=5)


@pytest.fixture
def tiny_default(tmp_path_factory, monkeypatch):
    tmp = tmp_path_factory.mktemp("default-head")
    target = save_target_dir(tmp / "target")
    data = write_chats(tmp / "chats.json", 30)
    monkeypatch.setattr(default_head, "DEFAULT_EAGLE_TARGET", str(target))
    monkeypatch.setattr(default_head, "RECIPE", dict(TINY_RECIPE))
    monkeypatch.setattr(default_head, "sharegpt_path", lambda: data)
    return target


def prepare(cache):
    return main(["models", "prepare", "--only", "eagle-head", "--cache-dir", str(cache), "--threads", "1"])


def test_prepare_trains_once_and_bench_finds_it(tiny_default, tmp_path, capsys):
    cache = tmp_path / "cache"
    with pytest.raises(Exception, match="models prepare --only eagle-head"):
        resolve_eagle_head("default", cache)
    assert prepare(cache) == 0
    assert "eagle-head: trained" in capsys.readouterr().out
    head = resolve_eagle_head("default", cache)
    assert head == default_head.default_head_dir(cache) and (head / "model.safetensors").is_file()
    assert prepare(cache) == 0
    assert "eagle-head: already trained" in capsys.readouterr().out
    assert main(["models", "list", "--cache-dir", str(cache)]) == 0
    assert "EAGLE head ok" in capsys.readouterr().out


def test_an_interrupted_prepare_continues_to_the_same_head(tiny_default, tmp_path, monkeypatch, capsys):
    assert prepare(tmp_path / "straight") == 0
    monkeypatch.setitem(default_head.RECIPE, "max_steps", 3)
    assert prepare(tmp_path / "interrupted") == 2
    assert "run the same command again" in capsys.readouterr().err
    monkeypatch.setitem(default_head.RECIPE, "max_steps", None)
    assert prepare(tmp_path / "interrupted") == 0
    a = load_file(str(default_head.default_head_dir(tmp_path / "straight") / "model.safetensors"))
    b = load_file(str(default_head.default_head_dir(tmp_path / "interrupted") / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
