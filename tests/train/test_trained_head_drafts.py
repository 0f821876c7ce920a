"""A head written by the trainer drafts through the engine, and greedy decoding stays exactly the target's."""

import torch

from frspec.decode import factory as engine
from frspec.decode.tree_shape import TreeShape
from frspec.train.dataset import FeatureDataset
from frspec.train.features import CollectOptions, collect_features
from frspec.train.head import new_head, save_head
from frspec.train.trainer import TrainConfig, train_head

from tests.train.train_tiny import tiny_target, tiny_tokenizer, write_chats


def drafted(target, head_dir):
    """Greedy output and acceptance length of a depth-4 EAGLE chain, and the vanilla greedy output (fp64)."""
    target = target.double()  # losslessness is exact in fp64: no near-tie can flip between forward shapes
    prompt = tiny_tokenizer().encode("<|im_start|>user\nthe cat<|im_end|>\n<|im_start|>assistant\n")
    vanilla = engine.build_generator(target).generate(input_ids=prompt, max_new_tokens=40, eos_token_ids=[])
    eagle = engine.build_generator(target, eagle=head_dir, tree=TreeShape.chain(4))
    out = eagle.generate(input_ids=prompt, max_new_tokens=40, eos_token_ids=[])
    return out.token_ids, out.stats.acceptance_length, vanilla.token_ids


def test_trained_head_drafts_losslessly_and_gets_drafts_accepted(tmp_path):
    target = tiny_target(predictable=True)
    write_chats(tmp_path / "chats.json", 60)
    collect_features(target, tiny_tokenizer(), [str(tmp_path / "chats.json")], tmp_path / "f", "tiny",
                     CollectOptions(assistant_only=True, progress=False))
    save_head(new_head(target), tmp_path / "untrained", dtype=torch.float32)
    head = new_head(target)
    config = TrainConfig(epochs=4, lr=1e-2, batch_tokens=400, warmup_steps=3, eval_every=0)
    train_head(head, FeatureDataset(tmp_path / "f"), config, tmp_path / "c.pt", log=lambda _: None)
    save_head(head, tmp_path / "head", dtype=torch.float32)

    untrained_ids, untrained_tau, vanilla_ids = drafted(tiny_target(predictable=True), tmp_path / "untrained")
    ids, tau, _ = drafted(tiny_target(predictable=True), tmp_path / "head")
    assert ids == vanilla_ids and untrained_ids == vanilla_ids
    assert tau > untrained_tau + 0.3  # training is what gets the drafts accepted
