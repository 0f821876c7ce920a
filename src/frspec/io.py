"""File helpers shared by every writer, so that no command ever leaves a half-written output file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


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
