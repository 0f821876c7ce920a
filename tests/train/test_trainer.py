"""Training: the loss falls and the head learns the target; an interrupted run resumes to the same result."""

import pytest
import torch

from frspec.errors import FrspecError
from frspec.train.dataset import FeatureDataset, epoch_batches, loss_vocab_ids
from frspec.train.features import CollectOptions, collect_features
from frspec.train.head import new_head, trainable_state
from frspec.train.trainer import TrainConfig, evaluate, train_head

from tests.train.train_tiny import tiny_target, tiny_tokenizer, write_chats

CONFIG = TrainConfig(epochs=3, lr=3e-3, batch_tokens=400, loss_vocab=32, warmup_steps=3, eval_every=5,
                     checkpoint_every=4)


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("features")
    write_chats(tmp / "chats.json", 60)
    opts = CollectOptions(assistant_only=True, progress=False)
    collect_features(tiny_target(), tiny_tokenizer(), [str(tmp / "chats.json")], tmp / "f", "tiny", opts)
    return FeatureDataset(tmp / "f")


def quiet(_line):
    pass


def test_loss_falls_and_held_out_top1_rises(features, tmp_path):
    target = tiny_target()
    head = new_head(target)
    weight = target.lm_head.weight.float()
    _, held = features.split(CONFIG.eval_every)
    before = evaluate(head, features, held, weight, weight, CONFIG)
    state = train_head(head, features, CONFIG, tmp_path / "ckpt.pt", log=quiet)
    assert [e["epoch"] for e in state.history] == [1, 2, 3]
    train_losses = [e["train_loss"] for e in state.history]
    assert train_losses == sorted(train_losses, reverse=True)
    after = state.history[-1]
    assert after["eval_loss"] < 0.6 * before["eval_loss"]
    assert after["eval_top1"] > before["eval_top1"] + 0.05
    assert all(not p.requires_grad for p in target.parameters())  # the target's embedding and LM head stay frozen


def test_resumed_run_matches_an_uninterrupted_one(features, tmp_path):
    target = tiny_target()
    straight = new_head(target)
    done = train_head(straight, features, CONFIG, tmp_path / "a.pt", log=quiet)

    interrupted = new_head(target)
    stopped = train_head(interrupted, features, CONFIG, tmp_path / "b.pt", stop_after_steps=5, log=quiet)
    assert stopped.step == 5 and len(stopped.history) < CONFIG.epochs
    resumed_head = new_head(target, seed=123)  # a fresh process: the weights come from the checkpoint
    lines = []
    resumed = train_head(resumed_head, features, CONFIG, tmp_path / "b.pt", resume=True, log=lines.append)
    assert lines[0].startswith("resumed from") and "step 5/" in lines[0]
    assert resumed.step == done.step
    for key, value in trainable_state(straight).items():
        torch.testing.assert_close(trainable_state(resumed_head)[key], value, rtol=0, atol=0)
    assert resumed.history == done.history


def test_resume_with_other_settings_is_refused(features, tmp_path):
    target = tiny_target()
    train_head(new_head(target), features, CONFIG, tmp_path / "c.pt", stop_after_steps=2, log=quiet)
    other = TrainConfig(**{**CONFIG.__dict__, "lr": 1e-2})
    with pytest.raises(FrspecError, match="other settings"):
        train_head(new_head(target), features, other, tmp_path / "c.pt", resume=True, log=quiet)


def test_batches_and_split_are_deterministic_and_complete(features):
    train, held = features.split(5)
    assert not set(train) & set(held) and sorted(train + held) == list(range(len(features.documents)))
    lengths = [len(d.ids) for d in features.documents]
    a = epoch_batches(train, lengths, 400, seed=0, epoch=1)
    assert a == epoch_batches(train, lengths, 400, seed=0, epoch=1) != epoch_batches(train, lengths, 400, 0, 2)
    assert sorted(i for b in a for i in b) == sorted(train)
    assert all(sum(lengths[i] for i in b) >= 400 for b in a[:-1])


def test_loss_vocab_keeps_the_most_frequent_ids_and_the_forced_ones():
    counts = torch.tensor([5, 0, 9, 1, 7, 0])
    assert loss_vocab_ids(counts, 2).tolist() == [2, 4]
    assert loss_vocab_ids(counts, 3, always=[5]).tolist() == [2, 4, 5]
    assert loss_vocab_ids(counts, None) is None and loss_vocab_ids(counts, 6) is None
    with pytest.raises(FrspecError):
        loss_vocab_ids(counts, 0)


def test_unrolled_depths_read_what_a_drafted_chain_reads(features):
    """Depth 2 of the training-time test is the head's second draft step exactly: rooted at t, it reads
    (x_{t+2}, its own depth-1 output) at position t+1 over a cache of the real inputs up to t."""
    from transformers import DynamicCache

    from frspec.train.trainer import document_loss

    target = tiny_target()
    head = new_head(target).eval()
    doc = features.documents[0]
    weight = target.lm_head.weight.float()
    with torch.no_grad():
        results = document_loss(head, doc, weight, CONFIG, None, depths=3)
        ids, f = doc.ids, doc.hidden.float()
        for t in (0, 5, len(ids) - 5):
            cache = DynamicCache()
            g = head(ids[None, 1 : t + 2], f[None, : t + 1], torch.arange(t + 1)[None], cache=cache)[0, -1]
            torch.testing.assert_close(g, results[0][3][t], atol=1e-5, rtol=1e-4)
            for depth in (2, 3):
                g = head(ids[None, t + depth : t + depth + 1], g[None, None], torch.tensor([[t + depth - 1]]),
                         cache=cache)[0, -1]
                torch.testing.assert_close(g, results[depth - 1][3][t], atol=1e-5, rtol=1e-4)
    # A draft that would read past the document's end trains nothing.
    assert results[2][2] <= results[1][2] <= results[0][2]


def test_training_time_test_improves_the_second_draft(features, tmp_path):
    target = tiny_target()
    weight = target.lm_head.weight.float()
    _, held = features.split(CONFIG.eval_every)
    scores = {}
    for unroll in (1, 2):
        head = new_head(target)
        config = TrainConfig(**{**CONFIG.__dict__, "unroll": unroll})
        state = train_head(head, features, config, tmp_path / f"u{unroll}.pt", log=quiet)
        scores[unroll] = state.history[-1]
        assert state.history[0]["train_loss"] > state.history[-1]["train_loss"]
    assert scores[2]["eval_top1_depth2"] > scores[1]["eval_top1_depth2"]
