"""A trained head is written in the loader's layout and loads back to the same function."""

import json

import pytest
import torch

from frspec.models.eagle import Eagle2Head
from frspec.models.eagle_loading import load_eagle_head
from frspec.train.head import new_head, save_head

from tests.train.train_tiny import tiny_target


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_saved_head_loads_and_computes_the_same(tmp_path, family):
    target = tiny_target(family)
    head = new_head(target, seed=1)
    with torch.no_grad():  # make every tensor matter, norms included
        for p in head.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    save_head(head, tmp_path / "head", dtype=torch.float32, metadata={"note": "test"})
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["frspec_training"] == {"note": "test"}

    loaded = load_eagle_head(tmp_path / "head", target)
    assert isinstance(loaded, Eagle2Head) and loaded.embed_tokens is target.get_input_embeddings()
    assert loaded.lm_head is target.get_output_embeddings()
    ids = torch.randint(0, target.config.vocab_size, (1, 7))
    hidden = torch.randn(1, 7, target.config.hidden_size)
    pos = torch.arange(7)[None]
    with torch.no_grad():
        head.eval()
        torch.testing.assert_close(loaded(ids, hidden, pos), head(ids, hidden, pos))
        features = head(ids, hidden, pos)
        torch.testing.assert_close(loaded.draft_logits(features), target.lm_head(features))


def test_only_the_heads_own_tensors_are_trainable_and_saved(tmp_path):
    target = tiny_target()
    head = new_head(target, intermediate_size=24)
    trainable = {n for n, p in head.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(("fc.", "layers.0.")) for n in trainable)
    save_head(head, tmp_path / "h")
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "h" / "model.safetensors"))
    assert set(saved) == trainable and all(t.dtype == torch.bfloat16 for t in saved.values())
    assert saved["layers.0.mlp.gate_proj.weight"].shape == (24, target.config.hidden_size)
    assert load_eagle_head(tmp_path / "h", target).layers[0].mlp.gate_proj.out_features == 24


def test_init_from_continues_from_a_written_head_and_refuses_misfits(tmp_path):
    from frspec.errors import FrspecError
    from frspec.train.head import init_from, trainable_state

    target = tiny_target()
    trained = new_head(target, seed=3)
    save_head(trained, tmp_path / "h", dtype=torch.float32)
    fresh = new_head(target, seed=4)
    init_from(fresh, tmp_path / "h")
    for key, value in trainable_state(trained).items():
        assert torch.equal(trainable_state(fresh)[key], value)
    with pytest.raises(FrspecError, match="does not fit"):
        init_from(new_head(target, intermediate_size=24), tmp_path / "h")
