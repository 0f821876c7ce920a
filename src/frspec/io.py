"""File helpers: atomic writers, so that no command ever leaves a half-written output file, and a text reader
whose every failure is a one-line FrspecError naming the file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

from frspec.errors import FrspecError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it over `path`, on failure delete it.

    Writers write to the yielded path (with torch.save, safetensors, open(), ...). The rename is atomic on one
    filesystem, so readers see either the old file, the complete new file, or nothing.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp creates 0600 files; give the output the permissions a plain open() would have.
        umask = os.umask(0)
        os.umask(umask)
        if tmp_path.is_file():
            os.chmod(tmp_path, 0o666 & ~umask)
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """The UTF-8 text of `path`, or a one-line FrspecError naming the file (missing, unreadable, not UTF-8)."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FrspecError(f"{what} not found: {path}") from None
    except UnicodeDecodeError as e:
        raise FrspecError(f"{what} {path} is not UTF-8 text (byte {e.start}); re-encode it as UTF-8") from None
    except OSError as e:
        raise FrspecError(f"cannot read {what} {path}: {e.strerror or e}") from None
