"""Feature collection: shards hold the target's final hidden states; an interrupted collection resumes exactly."""

import pytest
import torch
from safetensors.torch import load_file

from frspec.errors import FrspecError
from frspec.train.dataset import FeatureDataset
from frspec.train.features import CollectOptions, collect_features

from tests.train.train_tiny import tiny_target, tiny_tokenizer, write_chats


def collect(tmp_path, out, max_tokens=None, **kw):
    data = tmp_path / "chats.json"
    if not data.exists():
        write_chats(data, 30)
    opts = CollectOptions(assistant_only=True, max_tokens=max_tokens, shard_tokens=300, progress=False, **kw)
    return collect_features(tiny_target(), tiny_tokenizer(), [str(data)], out, "tiny", opts)


def test_shards_hold_the_targets_last_hidden_state(tmp_path):
    manifest = collect(tmp_path, tmp_path / "f")
    assert manifest["complete"] and manifest["exhausted"] and len(manifest["shards"]) > 1
    assert manifest["documents"] == 30 and manifest["records"] == 30
    target = tiny_target()
    shard = load_file(str(tmp_path / "f" / manifest["shards"][0]["file"]))
    a, b = shard["offsets"][:2].tolist()
    ids = shard["input_ids"][a:b].long()
    with torch.no_grad():
        expected = target(ids[None], output_hidden_states=True).hidden_states[-1][0]
        logits = target(ids[None]).logits[0]
    torch.testing.assert_close(shard["hidden"][a:b], expected)
    # It is what the LM head reads: the target's logits follow from it.
    torch.testing.assert_close(target.lm_head(shard["hidden"][a:b]), logits)


def test_interrupted_collection_resumes_where_it_stopped(tmp_path):
    whole = collect(tmp_path, tmp_path / "whole")
    part = collect(tmp_path, tmp_path / "part", max_tokens=700)
    assert not part["exhausted"] and part["tokens"] < whole["tokens"]
    resumed = collect(tmp_path, tmp_path / "part")
    assert resumed["tokens"] == whole["tokens"] and resumed["documents"] == whole["documents"]
    a, b = FeatureDataset(tmp_path / "whole"), FeatureDataset(tmp_path / "part")
    assert len(a.documents) == len(b.documents)
    for x, y in zip(a.documents, b.documents):
        assert torch.equal(x.ids, y.ids) and torch.equal(x.mask, y.mask) and torch.equal(x.hidden, y.hidden)


def test_other_settings_are_refused(tmp_path):
    collect(tmp_path, tmp_path / "f", max_tokens=300)
    with pytest.raises(FrspecError, match="other settings"):
        collect(tmp_path, tmp_path / "f", max_seq_len=64)
