"""Every row of docs/reliability.md's bad-input table: the exit code, one error line naming the problem, no
traceback, no output file left behind (not even a temporary one)."""

from __future__ import annotations

import re
import traceback
from pathlib import Path

import pytest

from frspec.cli import main

from tests.reliability.bad_inputs import ROWS

DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"


def run_cli(argv) -> tuple[int, str, str]:
    """Run `frspec argv` in-process; an exception escaping main() is what a user would see as a traceback."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse
            code = int(e.code or 0)
        except BaseException:
            return -1, out.getvalue(), traceback.format_exc()
    return code, out.getvalue(), err.getvalue()


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*") if p.is_file() and p.name.endswith(".tmp"))


def _params():
    for row in ROWS:
        marks = [pytest.mark.xfail(strict=True, reason=f"fix pending: {row.pending}")] if row.pending else []
        yield pytest.param(row, id=row.id, marks=marks)


@pytest.mark.parametrize("row", list(_params()))
def test_bad_input_is_one_clear_line(row, ws, tmp_path):
    argv, output = row.build(ws, tmp_path)
    code, out, err = run_cli(argv)
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("usage:")]
    error_lines = [line for line in lines if "error:" in line]
    assert code == row.code, (code, err)
    assert len(error_lines) == 1 and error_lines[0].startswith("frspec"), err
    assert re.search(row.message, error_lines[0]), (row.message, error_lines[0])
    if output is not None:  # no output file (an empty work directory for a resumable run is not output)
        left = [p for p in Path(output).rglob("*") if p.is_file()] if Path(output).is_dir() else [output]
        assert not [p for p in left if Path(p).exists()], f"{output} was left behind"
    assert not leftovers(tmp_path) and not leftovers(ws.root), "temporary files were left behind"


def test_the_doc_lists_every_row():
    text = DOC.read_text()
    missing = [r.id for r in ROWS if f"`{r.id}`" not in text]
    assert not missing, f"docs/reliability.md lacks rows {missing}"
