"""A code corpus every machine has: the Python sources of the running interpreter's standard library and of the
installed packages.

FR-Spec's default maps are counted on chat text, so identifiers, operators and indentation runs that dominate code
rank low; a map counted on real code fits code prompts. The sources are taken in a stable pseudo-random order
(by a hash of each file's path relative to its root, so the same files are taken on every machine that has them)
up to a byte budget, which keeps counting to a minute or so. A fixed tenth of the standard library (by the same
hash) is held out of every build slice, for measuring coverage on code the map was not counted on.

The sources differ between Python versions and environments; the counts' metadata records the roots, files and
bytes taken.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from frspec.errors import FrspecError

# Larger .py files are mostly generated tables (unicode data, topic dumps), not code anyone writes.
MAX_FILE_BYTES = 256 << 10
DEFAULT_BUILD_BYTES = 16 << 20  # ~4.5M Qwen2.5 tokens: about 25 s of tokenizing on two cores
DEFAULT_HELDOUT_BYTES = 4 << 20
HELDOUT_BUCKETS = 10  # one stdlib file in ten (by path hash) is held out


@dataclass(frozen=True)
class SourceFile:
    path: Path
    root: str  # "stdlib" or "site-packages"
    key: str  # the path relative to its root: what the order and the held-out split hash

    @property
    def bucket(self) -> int:
        return int(hashlib.sha1(self.key.encode()).hexdigest()[:8], 16) % HELDOUT_BUCKETS

    @property
    def order(self) -> str:
        return hashlib.sha1(f"order:{self.key}".encode()).hexdigest()


@dataclass
class CodeSlice:
    """The documents (file texts) of a slice of the code corpus, read lazily; totals are filled while reading."""

    files: list[SourceFile]
    max_bytes: int
    taken_files: int = 0
    taken_bytes: int = 0
    skipped: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[str]:
        self.taken_files = self.taken_bytes = 0
        for f in self.files:
            if self.taken_bytes >= self.max_bytes:
                return
            try:
                raw = f.path.read_bytes()
                text = raw.decode("utf-8")
            except (OSError, UnicodeDecodeError):
                self.skipped.append(f.key)  # unreadable or not UTF-8: not worth failing a count for
                continue
            if not text.strip():
                continue
            self.taken_files += 1
            self.taken_bytes += len(raw)
            yield text

    def metadata(self) -> dict:
        return {"code_files": self.taken_files, "code_bytes": self.taken_bytes, "code_skipped": len(self.skipped)}


def source_roots() -> dict[str, Path]:
    """The interpreter's stdlib and its installed-package directories (site-packages)."""
    paths = sysconfig.get_paths()
    roots = {"stdlib": Path(paths["stdlib"])}
    for key in ("purelib", "platlib"):
        p = Path(paths[key])
        if p != roots["stdlib"] and p not in roots.values():
            roots.setdefault("site-packages", p)
    return roots


def python_sources(roots: dict[str, Path] | None = None) -> list[SourceFile]:
    """Every .py file under the roots (the stdlib's own site-packages excluded: those are packages), up to
    MAX_FILE_BYTES, in the stable hashed order."""
    roots = source_roots() if roots is None else roots
    files = []
    for name, root in roots.items():
        if not root.is_dir():
            continue
        for path in root.rglob("*.py"):
            rel = path.relative_to(root)
            if any(part in ("site-packages", "dist-packages", "__pycache__") or part.startswith(".")
                   for part in rel.parts[:-1]):
                continue
            try:
                if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
                    continue
            except OSError:
                continue
            files.append(SourceFile(path, name, f"{name}/{rel.as_posix()}"))
    if not files:
        raise FrspecError(f"no Python sources found under {', '.join(str(r) for r in roots.values())}")
    return sorted(files, key=lambda f: f.order)


def code_slices(
    build_bytes: int = DEFAULT_BUILD_BYTES,
    heldout_bytes: int = DEFAULT_HELDOUT_BYTES,
    roots: dict[str, Path] | None = None,
) -> tuple[CodeSlice, CodeSlice]:
    """(build, held-out): the build slice is stdlib and site-packages files outside the held-out tenth of the
    stdlib, the held-out slice only that tenth; each capped at its byte budget."""
    if build_bytes <= 0 or heldout_bytes <= 0:
        raise FrspecError("code corpus byte budgets must be positive")
    files = python_sources(roots)
    heldout = [f for f in files if f.root == "stdlib" and f.bucket == 0]
    build = [f for f in files if not (f.root == "stdlib" and f.bucket == 0)]
    if not heldout:
        raise FrspecError("the standard library has no files to hold out")
    return CodeSlice(build, build_bytes), CodeSlice(heldout, heldout_bytes)


def count_code(tokenizer, code: CodeSlice, vocab_size: int | None = None):
    """Token counts of a code slice (plain text, no special tokens), with the slice recorded in the metadata."""
    from frspec.vocab.counting import count_tokens

    counts = count_tokens(tokenizer, code, vocab_size=vocab_size)
    counts.metadata.update(code.metadata())
    counts.metadata["source"] = "python sources: " + ", ".join(sorted({f.root for f in code.files}))
    return counts
