"""Self-distillation data: batched greedy replies equal one-at-a-time greedy decoding, and the features kept on the
way equal a plain forward over prompt + reply."""

import torch

from frspec.decode.stopping import default_eos_ids
from frspec.train.dataset import FeatureDataset
from frspec.train.features import CollectOptions, collect_features, target_features
from frspec.train.regenerate import first_exchange, generate_with_features

from tests.train.train_tiny import tiny_target, tiny_tokenizer, write_chats

EOT = 3  # <|im_end|> in the tiny tokenizer


def test_batched_replies_match_greedy_generate_and_features_match_a_forward():
    target, tok = tiny_target(predictable=True), tiny_tokenizer()
    texts = ["<|im_start|>user\nthe cat<|im_end|>\n<|im_start|>assistant\n", "th", "a dog ran to the park while"]
    prompts = [tok.encode(t, add_special_tokens=False) for t in texts]
    limits = [40, 5, 30]
    # The random target never ends a turn by itself: stop at a token the first reply writes early on and the
    # second does not, so some rows stop at a stop id, others at their limit, and rows leave the batch early.
    free = generate_with_features(target, prompts, limits, stop_ids=[], pad_id=0)
    stop = next(t for t in free[0][0][2:] if t not in free[1][0])
    out = generate_with_features(target, prompts, limits, stop_ids=[stop], pad_id=0)
    stopped = 0
    for prompt, limit, (reply, features) in zip(prompts, limits, out):
        expected = target.generate(torch.tensor([prompt]), max_new_tokens=limit, do_sample=False, pad_token_id=0,
                                   eos_token_id=stop)[0, len(prompt):].tolist()
        assert reply == expected
        assert len(reply) == limit or reply[-1] == stop
        stopped += reply[-1] == stop
        assert features.shape == (len(prompt) + len(reply), target.config.hidden_size)
        torch.testing.assert_close(features, target_features(target, torch.tensor(prompt + reply)),
                                   atol=1e-5, rtol=1e-4)
    assert 0 < stopped < len(prompts)  # both ways of ending a reply, and rows leaving the batch early, were run


def test_first_exchange_and_stop_ids():
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"}, {"role": "user", "content": "v"}]
    assert first_exchange(chat) == chat[:2]
    assert first_exchange(chat[2:]) is None  # opens with the assistant
    assert default_eos_ids(tiny_target(), tiny_tokenizer()) == {EOT}  # where regenerated replies stop


def test_regenerated_collection_trains_on_the_targets_replies_and_resumes(tmp_path):
    data = write_chats(tmp_path / "chats.json", 12)
    target, tok = tiny_target(predictable=True), tiny_tokenizer()

    def collect(out, **kw):
        opts = CollectOptions(assistant_only=True, regenerate=True, regenerate_max_new_tokens=12, regenerate_batch=4,
                              shard_tokens=100, progress=False, **kw)
        return collect_features(target, tok, [str(data)], out, "tiny", opts)

    manifest = collect(tmp_path / "f")
    assert manifest["complete"] and manifest["exhausted"] and manifest["documents"] == 12
    for doc in FeatureDataset(tmp_path / "f").documents:
        ids, mask = doc.ids.tolist(), doc.mask.tolist()
        prompt = ids[: mask.index(1)]
        assert tok.decode(prompt).endswith("<|im_start|>assistant\n") and all(mask[len(prompt):])
        expected = target.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0,
                                   eos_token_id=EOT)[0, len(prompt):].tolist()
        assert ids[len(prompt):] == expected
        torch.testing.assert_close(doc.hidden, target_features(target, doc.ids), atol=1e-5, rtol=1e-4)

    part = collect(tmp_path / "g", max_tokens=150)
    assert not part["exhausted"] and part["records"] % 4 == 0 and 0 < part["records"] < 12
    resumed = collect(tmp_path / "g")
    assert resumed["documents"] == 12 and resumed["tokens"] == manifest["tokens"]
