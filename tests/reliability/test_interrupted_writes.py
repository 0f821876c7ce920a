"""An interrupt (Ctrl-C) while a command writes its output leaves no output and no temporary file: exit 130."""

from __future__ import annotations

import pytest

import frspec.io
from bad_inputs import bench, build_map, count
from test_bad_inputs import leftovers, run_cli

COMMANDS = {
    "vocab count": lambda ws, t: (count(ws, ws.text, t / "c.safetensors"), t / "c.safetensors"),
    "vocab build": lambda ws, t: (build_map(ws, ws.counts, t / "m.safetensors", "--top-k", "8"), t / "m.safetensors"),
    "vocab convert": lambda ws, t: (["vocab", "convert", ws.map, t / "m.pt"], t / "m.pt"),
    "vocab coverage --plot": lambda ws, t: (["vocab", "coverage", "--counts", ws.counts, "--plot", t / "p.png"],
                                            t / "p.png"),
    "bench": lambda ws, t: (bench(ws, t / "out"), t / "out" / "results.json"),
}


@pytest.mark.parametrize("when", ["mid-write", "before-rename"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_interrupted_write_leaves_nothing(command, when, ws, tmp_path, monkeypatch):
    argv, output = COMMANDS[command](ws, tmp_path)
    real_atomic = frspec.io.atomic_path

    if when == "before-rename":
        def replace(*args, **kwargs):  # the temporary file is complete; the interrupt lands just before the rename
            raise KeyboardInterrupt

        monkeypatch.setattr(frspec.io.os, "replace", replace)
    else:
        import contextlib

        @contextlib.contextmanager
        def interrupted(path):
            with real_atomic(path) as tmp:
                yield tmp
                tmp.write_bytes(b"half a file")  # whatever the writer wrote, only part of it is there
                raise KeyboardInterrupt

        for module in ("frspec.vocab.formats", "frspec.vocab.counts", "frspec.vocab.coverage", "frspec.bench.report"):
            monkeypatch.setattr(f"{module}.atomic_path", interrupted)
    code, out, err = run_cli(argv)
    assert code == 130 and err.strip().splitlines()[-1] == "frspec: interrupted", (code, err)
    assert not output.exists(), f"{output} was left behind"
    assert not leftovers(tmp_path)
