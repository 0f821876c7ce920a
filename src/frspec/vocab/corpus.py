"""Reading corpora: expand inputs to files, read records (text, JSONL, JSON arrays, truncated JSON), turn records
into documents.

A document is either a plain string or a chat: a list of {"role", "content"} messages with roles normalized to
system/user/assistant. Rendering chats into text is the tokenizer's business (see `chat.py`).
"""

from __future__ import annotations

import glob
import json
import os
import sys
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Union

from frspec.errors import FrspecError

Message = dict[str, str]
Document = Union[str, list[Message]]

JSON_SUFFIXES = {".json"}
JSONL_SUFFIXES = {".jsonl", ".ndjson"}
# Large plain-text files are cut at line breaks into documents of about this size, so they stream and batch.
TEXT_CHUNK_CHARS = 1 << 20

# ShareGPT dumps use several names for the same three roles.
ROLE_ALIASES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "model": "assistant",
}


def warn(message: str) -> None:
    """Print a one-line warning for the user (the CLI's error style, but the run goes on)."""
    print(f"frspec: warning: {message}", file=sys.stderr)


def expand_inputs(inputs: list[str]) -> list[Path]:
    """Turn files, directories (searched recursively, hidden files skipped) and glob patterns into a file list.

    Order is the order given, each directory or glob sorted, duplicates dropped. Missing inputs are errors: a typo
    must not silently shrink the corpus.
    """
    files: list[Path] = []
    for spec in inputs:
        path = Path(spec).expanduser()
        if path.is_file():
            found = [path]
        elif path.is_dir():
            found = sorted(
                p for p in path.rglob("*")
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
            if not found:
                raise FrspecError(f"input directory {spec!r} contains no files")
        elif glob.has_magic(spec):
            found = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True) if Path(p).is_file())
            if not found:
                raise FrspecError(f"no files match {spec!r}")
        else:
            raise FrspecError(f"input not found: {spec}")
        files.extend(found)
    unique = list(dict.fromkeys(p.resolve() for p in files))
    if not unique:
        raise FrspecError("no input files given")
    return unique


@dataclass
class Corpus:
    """The documents of a list of input files, read lazily.

    `field` picks the JSON field to count (a string, a list of strings, or a list of chat messages); without it,
    records are recognized as ShareGPT (`conversations`), OpenAI (`messages`) or `{"text": ...}`. `skip` and
    `limit` select a slice of records across all files, so disjoint slices can serve as build and held-out sets.
    While iterating, `bytes_read` tracks progress against `total_bytes`; `skipped_bytes` and `dropped_messages`
    record what could not be used.
    """

    files: list[Path]
    field: str | None = None
    skip: int = 0
    limit: int | None = None
    bytes_read: int = 0
    records: int = 0
    skipped_bytes: int = 0
    dropped_messages: int = 0
    warnings: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def from_inputs(cls, inputs: list[str], **kwargs: Any) -> "Corpus":
        return cls(expand_inputs(inputs), **kwargs)

    @property
    def total_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files)

    def __iter__(self) -> Iterator[Document]:
        if self.skip < 0 or (self.limit is not None and self.limit < 0):
            raise FrspecError("--skip and --limit must not be negative")
        if self.limit == 0:
            raise FrspecError("--limit 0 counts nothing: give a positive number of records, or leave it out")
        seen = 0
        for path in self.files:
            done_before = self.bytes_read
            for record, pos in self._records(path):
                self.bytes_read = done_before + pos
                seen += 1
                if seen <= self.skip:
                    continue
                if self.limit is not None and self.records >= self.limit:
                    return
                self.records += 1
                yield from self._documents(record, path, seen)
            self.bytes_read = done_before + path.stat().st_size

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        warn(message)

    # -- records -----------------------------------------------------------------------------------------------

    def _records(self, path: Path) -> Iterator[tuple[Any, int]]:
        """Yield (record, byte offset reached) for one file."""
        suffix = path.suffix.lower()
        try:
            if suffix in JSONL_SUFFIXES:
                yield from self._jsonl_records(path)
            elif suffix in JSON_SUFFIXES:
                yield from self._json_records(path)
            else:
                yield from _text_records(path)
        except UnicodeDecodeError as e:
            raise FrspecError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e
        except OSError as e:
            raise FrspecError(f"cannot read {path}: {e.strerror or e}") from e

    def _jsonl_records(self, path: Path) -> Iterator[tuple[Any, int]]:
        pos = 0
        size = path.stat().st_size
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                pos += len(raw)
                line = raw.decode("utf-8").strip()
                if not line:
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    # Only the very last line may be cut off (an interrupted download); anything else is corruption.
                    if pos == size and not raw.endswith(b"\n"):
                        self.skipped_bytes += len(raw)
                        self._warn(f"{path}: last line is cut off mid-record; skipped {len(raw):,} bytes")
                        return
                    raise FrspecError(f"{path}:{lineno}: invalid JSON ({e.msg})") from e
                yield record, pos

    def _json_records(self, path: Path) -> Iterator[tuple[Any, int]]:
        """A JSON array (or a single value), decoded element by element so a file cut off mid-record still yields
        every complete record. Offsets are character offsets, close enough to bytes for a progress bar."""
        text = path.read_text(encoding="utf-8")
        decoder = json.JSONDecoder()
        pos = _skip_ws(text, 0)
        if pos == len(text):
            return
        if text[pos] != "[":
            try:
                value, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as e:
                raise FrspecError(f"{path}: invalid JSON ({e.msg} at char {e.pos})") from e
            if _skip_ws(text, end) != len(text):
                raise FrspecError(f"{path}: extra data after the JSON value at char {end}")
            yield value, len(text)
            return
        pos = _skip_ws(text, pos + 1)
        count = 0
        while pos < len(text) and text[pos] != "]":
            try:
                value, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as e:
                if text.rstrip().endswith("]"):  # the array is closed, so the damage is inside: corrupt
                    raise FrspecError(f"{path}: invalid JSON in record {count + 1} ({e.msg} at char {e.pos})") from e
                skipped = len(text[pos:].encode("utf-8"))
                self.skipped_bytes += skipped
                total = path.stat().st_size
                self._warn(
                    f"{path}: JSON ends mid-record; kept {count:,} complete records and skipped the last "
                    f"{skipped:,} bytes ({100 * skipped / total:.3f}% of the file)"
                )
                return
            count += 1
            yield value, end
            pos = _skip_ws(text, end)
            if pos < len(text) and text[pos] == ",":
                pos = _skip_ws(text, pos + 1)
            elif pos < len(text) and text[pos] != "]":
                raise FrspecError(f"{path}: expected ',' or ']' after record {count} at char {pos}")
        if pos >= len(text) and count:
            self._warn(f"{path}: JSON array is not closed; kept all {count:,} complete records")

    # -- documents ---------------------------------------------------------------------------------------------

    def _documents(self, record: Any, path: Path, index: int) -> Iterator[Document]:
        where = f"{path} record {index}"
        if self.field is not None:
            if not isinstance(record, dict) or self.field not in record:
                raise FrspecError(f"{where} has no field {self.field!r}")
            yield from self._value_documents(record[self.field], where)
        elif isinstance(record, str):
            yield record
        elif isinstance(record, dict) and "conversations" in record:
            yield from self._value_documents(record["conversations"], where)
        elif isinstance(record, dict) and "messages" in record:
            yield from self._value_documents(record["messages"], where)
        elif isinstance(record, dict) and "text" in record:
            yield from self._value_documents(record["text"], where)
        else:
            keys = sorted(record)[:8] if isinstance(record, dict) else type(record).__name__
            raise FrspecError(f"cannot tell what to count in {where} (keys: {keys}); pass --field")

    def _value_documents(self, value: Any, where: str) -> Iterator[Document]:
        if isinstance(value, str):
            yield value
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            yield from value  # e.g. MT-Bench `turns`: each turn is a document
        elif isinstance(value, list) and all(isinstance(v, dict) for v in value):
            chat = self._chat(value, where)
            if chat:
                yield chat
        else:
            raise FrspecError(f"{where}: expected text, a list of texts or a list of chat messages")

    def _chat(self, messages: list[dict], where: str) -> list[Message]:
        chat = []
        for m in messages:
            role = m.get("role", m.get("from"))
            content = m.get("content", m.get("value"))
            if isinstance(content, list):  # OpenAI content parts: keep the text ones
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            norm = ROLE_ALIASES.get(str(role).lower()) if role is not None else None
            if norm is None or not isinstance(content, str):
                self.dropped_messages += 1
                continue
            chat.append({"role": norm, "content": content})
        return chat


def _skip_ws(text: str, pos: int) -> int:
    n = len(text)
    while pos < n and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _text_records(path: Path) -> Iterator[tuple[str, int]]:
    """A plain-text file as one document, or as ~1 MiB documents cut at line breaks when it is large."""
    pos = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(TEXT_CHUNK_CHARS)
            if not chunk:
                return
            if len(chunk) == TEXT_CHUNK_CHARS:
                chunk += f.readline()  # finish the line so no token is split
            pos += len(chunk)
            text = chunk.decode("utf-8")
            if text:
                yield text, pos
