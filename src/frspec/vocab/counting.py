"""Counting token ids over a corpus: render, tokenize in batches on all cores, and add up a bincount."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from frspec.errors import FrspecError
from frspec.vocab.tokenizer_identity import tokenizer_identity
from frspec.vocab.chat import ChatRenderer
from frspec.vocab.corpus import Corpus, Document
from frspec.vocab.counts import TokenCounts
from frspec.vocab.special_tokens import keep_token_ids

# A batch is flushed to the tokenizer at this many characters or texts, whichever comes first: big enough for the
# Rust tokenizer to spread over all cores, small enough to keep memory flat and the progress bar moving.
BATCH_CHARS = 4 << 20
BATCH_TEXTS = 4096


def count_tokens(
    tokenizer: PreTrainedTokenizerBase,
    documents: Iterable[Document],
    *,
    vocab_size: int | None = None,
    assistant_only: bool = False,
    add_special_tokens: bool = False,
    progress_bar: tqdm | None = None,
    on_batch: Callable[[], None] | None = None,
) -> TokenCounts:
    """Count token ids over `documents` (strings, or chats rendered with the tokenizer's chat template).

    The counts cover max(full tokenizer vocabulary, `vocab_size`) ids: a model's LM head may have more rows than
    the tokenizer has ids, and a map is checked against the model. `assistant_only` counts only what the model
    generates in assistant turns; plain-text documents are counted whole either way. `add_special_tokens` lets
    the tokenizer add its BOS/EOS to each plain-text document (chats get theirs from the template).
    `progress_bar` gets the running document and token totals; `on_batch()` is called after each batch.
    """
    identity = tokenizer_identity(tokenizer)
    if vocab_size is not None and int(vocab_size) < 1:
        raise FrspecError(f"--vocab-size must be a positive number of LM-head rows, got {vocab_size}")
    size = max(identity["vocab_size"], int(vocab_size or 0))
    counts = np.zeros(size, dtype=np.int64)
    renderer: ChatRenderer | None = None
    documents_seen = 0
    tokens = 0
    start = time.perf_counter()

    def tokenize(texts: list[str], special: bool) -> np.ndarray:
        if tokenizer.is_fast:
            encodings = tokenizer.backend_tokenizer.encode_batch_fast(texts, add_special_tokens=special)
            ids = [e.ids for e in encodings]
        else:
            ids = tokenizer(texts, add_special_tokens=special)["input_ids"]
        flat = np.fromiter((i for row in ids for i in row), dtype=np.int64)
        return np.bincount(flat, minlength=size) if flat.size else np.zeros(size, dtype=np.int64)

    # Tokenizing a batch (Rust, GIL released, all cores) overlaps with rendering the next one (Python).
    pool = ThreadPoolExecutor(max_workers=1)
    pending: list[Future] = []

    def drain(keep: int) -> None:
        nonlocal counts, tokens
        while len(pending) > keep:
            batch_counts = pending.pop(0).result()
            if batch_counts.size > size:
                raise FrspecError(f"tokenizer produced id {batch_counts.size - 1}, outside the {size}-id vocabulary")
            counts += batch_counts
            tokens = int(counts.sum())
            if progress_bar is not None:
                progress_bar.set_postfix(docs=f"{documents_seen:,}", tokens=f"{tokens:,}", refresh=False)
            if on_batch is not None:
                on_batch()

    batches = {False: [], True: []}  # texts that get special tokens added, and texts that do not
    chars = 0
    try:
        for doc in documents:
            documents_seen += 1
            if isinstance(doc, str):
                batches[add_special_tokens].append(doc)
                chars += len(doc)
            else:
                if renderer is None:
                    renderer = ChatRenderer(tokenizer)
                texts = renderer.assistant_turns(doc) if assistant_only else renderer.full(doc)
                batches[False].extend(texts)
                chars += sum(len(t) for t in texts)
            if chars >= BATCH_CHARS or len(batches[False]) + len(batches[True]) >= BATCH_TEXTS:
                for special, texts in batches.items():
                    if texts:
                        pending.append(pool.submit(tokenize, texts, special))
                batches = {False: [], True: []}
                chars = 0
                drain(keep=1)
        for special, texts in batches.items():
            if texts:
                pending.append(pool.submit(tokenize, texts, special))
        drain(keep=0)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)

    if documents_seen == 0 or tokens == 0:
        raise FrspecError("the corpus is empty: no tokens were counted")
    metadata = {
        "tokenizer": identity,
        "documents": documents_seen,
        "tokens": tokens,
        "assistant_only": bool(assistant_only),
        "add_special_tokens": bool(add_special_tokens),
        "keep_tokens": keep_token_ids(tokenizer),
        "seconds": round(time.perf_counter() - start, 3),
    }
    if renderer is not None and renderer.failed:
        metadata["chats_rejected_by_template"] = renderer.failed
    return TokenCounts(torch.from_numpy(counts), metadata)


def count_corpus(
    tokenizer: PreTrainedTokenizerBase,
    inputs: list[str],
    *,
    field: str | None = None,
    assistant_only: bool = False,
    add_special_tokens: bool = False,
    vocab_size: int | None = None,
    skip: int = 0,
    limit: int | None = None,
    progress: bool = True,
) -> TokenCounts:
    """Count token ids over files, directories or globs of text, JSONL, JSON or ShareGPT/OpenAI chat data.

    `skip`/`limit` select a slice of records across the inputs (for disjoint build and held-out sets). A JSON
    file cut off mid-record yields all of its complete records and a warning. See `count_tokens` for the rest.
    """
    corpus = Corpus.from_inputs(inputs, field=field, skip=skip, limit=limit)
    bar = tqdm(total=corpus.total_bytes, unit="B", unit_scale=True, desc="counting", disable=not progress)

    def advance() -> None:
        bar.update(corpus.bytes_read - bar.n)

    try:
        result = count_tokens(
            tokenizer,
            corpus,
            vocab_size=vocab_size,
            assistant_only=assistant_only,
            add_special_tokens=add_special_tokens,
            progress_bar=bar,
            on_batch=advance,
        )
    finally:
        bar.close()
    result.metadata.update(
        {
            "inputs": [str(p) for p in corpus.files],
            "field": field,
            "records": corpus.records,
            "skip": skip,
            "limit": limit,
            "skipped_bytes": corpus.skipped_bytes,
            "dropped_messages": corpus.dropped_messages,
        }
    )
    return result
