"""`frspec train eagle` end to end on a tiny target saved as a HF directory."""

import json

import pytest
import torch
from safetensors.torch import load_file

from frspec.cli import main
from frspec.models.eagle_loading import load_eagle_head
from frspec.models.loading import load_model

from tests.train.train_tiny import save_target_dir, write_chats


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    return save_target_dir(tmp / "target"), write_chats(tmp / "chats.json", 40)


def run(target, data, out, *extra):
    return main(["train", "eagle", "--target", str(target), "--data", str(data), "--assistant-only",
                 "--out", str(out), "--epochs", "2", "--batch-tokens", "400", "--loss-vocab", "32",
                 "--eval-every", "5", "--threads", "1", "--no-progress", *extra])


def test_trains_writes_and_the_head_loads(setup, tmp_path, capsys):
    target_dir, data = setup
    assert run(target_dir, data, tmp_path / "head") == 0
    out = capsys.readouterr().out
    assert "held-out top-1" in out and "wrote" in out
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["frspec_training"]["steps"] > 0 and len(config["frspec_training"]["final"]) > 2
    log = json.loads((tmp_path / "head" / "train" / "log.json").read_text())
    assert [e["epoch"] for e in log["epochs"]] == [1, 2] and all("eval_top1" in e for e in log["epochs"])
    target = load_model(str(target_dir), dtype="fp32")
    head = load_eagle_head(tmp_path / "head", target)
    with torch.no_grad():
        features = head(torch.tensor([[5, 6, 7]]), torch.randn(1, 3, 32), torch.arange(3)[None])
    assert head.draft_logits(features).shape == (1, 3, target.config.vocab_size)


def test_interrupted_training_resumes_to_the_same_head(setup, tmp_path, capsys):
    target_dir, data = setup
    assert run(target_dir, data, tmp_path / "straight") == 0
    assert run(target_dir, data, tmp_path / "resumed", "--max-steps", "3") == 0
    assert "stopped at step 3" in capsys.readouterr().out
    assert not (tmp_path / "resumed" / "model.safetensors").exists()
    assert run(target_dir, data, tmp_path / "resumed") == 2  # a checkpoint is there: refuse to overwrite it
    assert "--resume" in capsys.readouterr().err
    assert run(target_dir, data, tmp_path / "resumed", "--resume") == 0
    a = load_file(str(tmp_path / "straight" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("extra, message", [
    (["--epochs", "0"], "--epochs must be at least 1"),
    (["--lr", "0"], "--lr must be positive"),
    (["--loss-vocab", "0"], "--loss-vocab must be at least 1"),
    (["--device", "gpu"], "unknown device"),
])
def test_bad_arguments_are_one_line_errors(setup, tmp_path, capsys, extra, message):
    target_dir, data = setup
    assert run(target_dir, data, tmp_path / "h", *extra) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("frspec: error:") and "Traceback" not in err


def test_missing_data_is_a_one_line_error(setup, tmp_path, capsys):
    target_dir, _ = setup
    assert run(target_dir, tmp_path / "nope.json", tmp_path / "h") == 2
    assert "input not found" in capsys.readouterr().err
