"""Every format round-trips, is detected from its content, and bad files are one-line errors."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from frspec.errors import FrspecError
from frspec.vocab.counts import TokenCounts
from frspec.vocab.formats import FORMATS, detect_format, vllm_scores
from frspec.vocab.formats import write_token_map as save_token_map
from frspec.vocab.token_map import TokenMap

load_token_map = TokenMap.load

VOCAB = 40
COUNTS = torch.tensor([(i * 7919) % 23 for i in range(VOCAB - 2)] + [0, 0])  # ties, zeros; 38, 39 never seen


def built_map(k=12) -> TokenMap:
    identity = {"name": "t", "vocab_size": VOCAB, "vocab_hash": "0" * 16}
    counts = TokenCounts(COUNTS, {"keep_tokens": {"<eos>": 39, "<pad>": 38}, "tokenizer": identity})
    return TokenMap.from_counts(counts, top_k=k)


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip(tmp_path, fmt):
    tm = built_map()
    assert 39 in tm.ids.tolist()  # forced although never counted: the vllm-scores floor case
    path = tmp_path / f"map.{fmt}"
    assert save_token_map(tm, path, format=fmt) == fmt
    assert detect_format(path) == fmt
    back = load_token_map(path, vocab_size=VOCAB)
    assert back.vocab_size == VOCAB and back.metadata["format"] == fmt
    if fmt == "eagle3":  # eagle3 cannot hold frequency order
        assert back.ids.tolist() == sorted(tm.ids.tolist())
    else:
        assert back.ids.tolist() == tm.ids.tolist()
    if fmt == "frspec":
        assert torch.equal(back.counts, tm.counts)
        assert back.metadata["coverage"] == tm.metadata["coverage"]
        assert back.metadata["tokenizer"] == tm.metadata["tokenizer"]
        assert back.metadata["kept_tokens"] == {"<pad>": 38, "<eos>": 39}


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_without_counts(tmp_path, fmt):
    tm = TokenMap([5, 3, 17, 0, 39], VOCAB)
    save_token_map(tm, tmp_path / "m", format=fmt)
    back = load_token_map(tmp_path / "m", vocab_size=VOCAB)
    assert back.ids.tolist() == (sorted(tm.ids.tolist()) if fmt == "eagle3" else tm.ids.tolist())


def test_thunlp_is_a_plain_list_loadable_with_weights_only(tmp_path):
    tm = built_map()
    tm.save(tmp_path / "freq.pt")  # .pt defaults to thunlp
    raw = torch.load(tmp_path / "freq.pt", weights_only=True)
    assert isinstance(raw, list) and all(type(i) is int for i in raw)
    assert raw == tm.ids.tolist() and 39 in raw and 38 in raw


def test_thunlp_without_vocab_size_is_marked_and_cannot_become_other_formats(tmp_path):
    torch.save([3, 1, 2], tmp_path / "m.pt")
    tm = TokenMap.load(tmp_path / "m.pt")
    assert tm.vocab_size == 4 and tm.metadata["vocab_size_known"] is False
    with pytest.raises(FrspecError, match="does not record its vocabulary size"):
        tm.save(tmp_path / "m.safetensors")
    assert not (tmp_path / "m.safetensors").exists()
    completed = TokenMap.load(tmp_path / "m.pt", vocab_size=10)
    assert completed.vocab_size == 10 and completed.metadata["vocab_size_known"] is True
    completed.save(tmp_path / "m.safetensors")
    assert TokenMap.load(tmp_path / "m.safetensors").vocab_size == 10


def test_thunlp_as_int_tensor_is_accepted(tmp_path):
    torch.save(torch.tensor([4, 2, 9]), tmp_path / "t.pt")
    assert TokenMap.load(tmp_path / "t.pt", vocab_size=10).ids.tolist() == [4, 2, 9]


def test_eagle3_semantics(tmp_path):
    tm = TokenMap([9, 2, 5], 12)
    tm.save(tmp_path / "e.safetensors", format="eagle3")
    from safetensors.torch import load_file

    t = load_file(str(tmp_path / "e.safetensors"))
    assert t["d2t"].dtype == torch.int64 and t["t2d"].dtype == torch.bool
    assert (torch.arange(3) + t["d2t"]).tolist() == [2, 5, 9]  # target_id = i + d2t[i], sorted
    assert t["t2d"].nonzero().flatten().tolist() == [2, 5, 9] and t["t2d"].numel() == 12


def test_eagle3_checkpoint_with_other_tensors_and_torch_dict(tmp_path):
    d2t = torch.tensor([1, 1, 3])  # ids 1, 2, 5
    t2d = torch.zeros(8, dtype=torch.bool)
    t2d[[1, 2, 5]] = True
    save_file({"d2t": d2t, "t2d": t2d, "fc.weight": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    assert TokenMap.load(tmp_path / "model.safetensors").ids.tolist() == [1, 2, 5]
    torch.save({"d2t": d2t, "t2d": t2d}, tmp_path / "buffers.pt")
    assert TokenMap.load(tmp_path / "buffers.pt").ids.tolist() == [1, 2, 5]


def test_eagle3_disagreeing_buffers_are_corrupt(tmp_path):
    t2d = torch.zeros(8, dtype=torch.bool)
    t2d[[1, 2, 6]] = True
    save_file({"d2t": torch.tensor([1, 1, 3]), "t2d": t2d}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(FrspecError, match="disagree"):
        TokenMap.load(tmp_path / "bad.safetensors")


def test_vllm_scores_are_relative_frequencies_with_a_threshold(tmp_path):
    tm = built_map()
    scores = vllm_scores(tm)
    assert scores.shape == (VOCAB,) and scores.dtype == torch.float64
    kept = tm.ids[tm.counts > 0]
    assert torch.allclose(scores[kept], tm.counts[tm.counts > 0].double() / int(COUNTS.sum()))
    mask = torch.ones(VOCAB, dtype=torch.bool)
    mask[tm.ids] = False
    assert bool((scores[mask] == 0).all()) and bool((scores[tm.ids] > 0).all())
    torch.save(scores, tmp_path / "s.pt")
    top = TokenMap.load(tmp_path / "s.pt", threshold=float(scores[tm.ids[4]]))
    assert top.ids.tolist() == tm.ids[:4].tolist()
    with pytest.raises(FrspecError, match="no token scores above"):
        TokenMap.load(tmp_path / "s.pt", threshold=1.0)


def test_vocab_size_mismatch_is_refused(tmp_path):
    for fmt in ("frspec", "vllm-scores", "eagle3"):
        save_token_map(built_map(), tmp_path / fmt, format=fmt)
        with pytest.raises(FrspecError, match=f"vocabulary of {VOCAB} ids but the model has 50"):
            load_token_map(tmp_path / fmt, vocab_size=50)
    torch.save([1, 45], tmp_path / "t.pt")
    with pytest.raises(FrspecError, match="out of range"):
        load_token_map(tmp_path / "t.pt", vocab_size=VOCAB)


@pytest.mark.parametrize(
    "write, message",
    [
        (lambda p: torch.save([1, 2, 2], p), "duplicated id 2"),
        (lambda p: torch.save([1, -2], p), "negative"),
        (lambda p: torch.save([], p), "empty"),
        (lambda p: torch.save({"weights": torch.zeros(2)}, p), "unrecognized"),
        (lambda p: torch.save(torch.zeros(2, 2, dtype=torch.long), p), "unrecognized"),
        (lambda p: p.write_bytes(b"not a token map at all"), "corrupt"),
        (lambda p: p.write_bytes(b""), "corrupt"),
        (lambda p: save_file({"w": torch.zeros(2)}, str(p)), "holds no token map"),
        (lambda p: TokenCounts(torch.ones(5, dtype=torch.long)).save(p), "token-counts file"),
        (lambda p: torch.save(torch.tensor([0.5, float("nan")]), p), "finite"),
    ],
)
def test_bad_map_files(tmp_path, write, message):
    path = tmp_path / "bad.pt"
    write(path)
    with pytest.raises(FrspecError, match=message) as e:
        TokenMap.load(path)
    assert "\n" not in str(e.value)


def test_truncated_files_are_errors(tmp_path):
    for fmt in FORMATS:
        path = tmp_path / f"m-{fmt}"
        save_token_map(built_map(), path, format=fmt)
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
        with pytest.raises(FrspecError):
            load_token_map(path, vocab_size=VOCAB)


def test_missing_file_wrong_declared_format_and_unknown_format(tmp_path):
    with pytest.raises(FrspecError, match="not found"):
        TokenMap.load(tmp_path / "nope.pt")
    built_map().save(tmp_path / "m.pt")
    with pytest.raises(FrspecError, match="not a eagle3 token map"):
        TokenMap.load(tmp_path / "m.pt", format="eagle3")
    with pytest.raises(FrspecError, match="unknown token-map format"):
        built_map().save(tmp_path / "x", format="sglang")


def test_failed_write_leaves_no_file(tmp_path, monkeypatch):
    import frspec.vocab.formats as formats

    def boom(token_map, tmp):
        tmp.write_bytes(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setitem(formats._WRITERS, "thunlp", boom)
    with pytest.raises(RuntimeError):
        built_map().save(tmp_path / "m.pt")
    assert list(tmp_path.iterdir()) == []
