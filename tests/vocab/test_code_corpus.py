"""The code corpus (Python sources of the interpreter and installed packages) and mixing counts of two domains."""

from pathlib import Path

import pytest
import torch

from frspec.errors import FrspecError
from frspec.vocab import code_corpus as cc
from frspec.vocab.counts import TokenCounts, mix_counts


def _roots(tmp_path: Path) -> dict[str, Path]:
    std, site = tmp_path / "lib", tmp_path / "site"
    for i in range(40):
        (std / "pkg").mkdir(parents=True, exist_ok=True)
        (std / "pkg" / f"m{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n")
    (std / "site-packages" / "vendored").mkdir(parents=True)
    (std / "site-packages" / "vendored" / "v.py").write_text("x = 1\n")  # a package, not the stdlib
    (std / "__pycache__").mkdir()
    (std / "__pycache__" / "c.py").write_text("x = 1\n")
    (std / "latin.py").write_bytes(b"s = '\xe9'\n")  # not UTF-8: skipped when read
    (std / "big.py").write_text("x = 1\n" * (cc.MAX_FILE_BYTES // 6 + 10))  # a generated table
    site.mkdir()
    for i in range(10):
        (site / f"p{i}.py").write_text(f"import os\nprint(os.sep, {i})\n")
    return {"stdlib": std, "site-packages": site}


def test_sources_skip_packages_inside_the_stdlib_caches_and_huge_files(tmp_path):
    roots = _roots(tmp_path)
    files = cc.python_sources(roots)
    keys = {f.key for f in files}
    assert len(files) == 51 and "stdlib/latin.py" in keys
    assert not any("vendored" in k or "__pycache__" in k or "big.py" in k for k in keys)
    assert files == cc.python_sources(roots)  # a stable order


def test_held_out_stdlib_tenth_never_enters_the_build_slice(tmp_path):
    build, heldout = cc.code_slices(build_bytes=1 << 20, heldout_bytes=1 << 20, roots=_roots(tmp_path))
    build_keys = {f.key for f in build.files}
    heldout_keys = {f.key for f in heldout.files}
    assert heldout_keys and not build_keys & heldout_keys
    assert all(k.startswith("stdlib/") for k in heldout_keys)
    assert any(k.startswith("site-packages/") for k in build_keys)
    texts = list(build) + list(heldout)
    assert build.taken_files + heldout.taken_files == len(texts) == 50
    assert build.skipped + heldout.skipped == ["stdlib/latin.py"]  # not UTF-8


def test_byte_budget_stops_the_slice(tmp_path):
    build, _ = cc.code_slices(build_bytes=60, heldout_bytes=60, roots=_roots(tmp_path))
    texts = list(build)
    assert 1 <= len(texts) <= 3 and build.taken_bytes >= 60
    with pytest.raises(FrspecError, match="positive"):
        cc.code_slices(build_bytes=0)


def test_count_code_counts_the_slice(tmp_path, tiny_tokenizer):
    build, _ = cc.code_slices(roots=_roots(tmp_path))
    counts = cc.count_code(tiny_tokenizer, build)
    assert counts.total > 0 and counts.metadata["code_files"] == build.taken_files
    assert counts.metadata["source"] == "python sources: site-packages, stdlib"


def test_mix_counts_weighs_domains_by_share_not_size():
    big = TokenCounts(torch.tensor([900, 100, 0, 0]))
    small = TokenCounts(torch.tensor([0, 0, 5, 5]))
    mixed = mix_counts([(big, 1.0), (small, 1.0)])
    shares = mixed.counts.double() / mixed.total
    assert shares.tolist() == pytest.approx([0.45, 0.05, 0.25, 0.25])
    assert [m["weight"] for m in mixed.metadata["mixture"]] == [1.0, 1.0]
    tilted = mix_counts([(big, 3.0), (small, 1.0)])
    assert (tilted.counts.double() / tilted.total)[0] == pytest.approx(0.675)
    with pytest.raises(FrspecError, match="different vocabularies|cannot merge"):
        mix_counts([(big, 1.0), (TokenCounts(torch.tensor([1, 2])), 1.0)])
    with pytest.raises(FrspecError, match="non-negative"):
        mix_counts([(big, -1.0), (small, 1.0)])
