"""An interrupt (Ctrl-C) while a command writes its output leaves no output and no temporary file: exit 130."""

from __future__ import annotations

import pytest

import frspec.io
from tests.reliability.bad_inputs import bench, build_map, count
from tests.reliability.test_bad_inputs import leftovers, run_cli

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


# --- train eagle: a head is two files, config.json (written last) marking it complete ---------------------------------

HEAD_FILES = ("config.json", "model.safetensors")


def _train_argv(ws, out, work) -> list:
    return ["train", "eagle", "--target", ws.target, "--data", ws.sharegpt, "--out", out, "--work", work,
            "--epochs", "1", "--dtype", "fp32", "--threads", "1", "--no-progress"]


def _head_files(directory) -> dict:
    return {name: (directory / name).read_bytes() for name in HEAD_FILES if (directory / name).exists()}


@pytest.mark.parametrize("previous", [True, False], ids=["over-a-previous-head", "fresh"])
@pytest.mark.parametrize("when", ["weights-mid-write", "config-mid-write", "first-rename", "second-rename"])
def test_interrupted_train_leaves_no_partial_head(when, previous, ws, tmp_path, monkeypatch):
    """Interrupts while the files are written leave a previous head byte for byte as it was; interrupts within the
    final renames leave no head (never new weights under an old config.json); no temporary file either way."""
    import pathlib
    import shutil

    from frspec.errors import FrspecError
    from frspec.models.eagle_loading import resolve_head_dir
    from frspec.train.default_head import is_head_ready

    out = tmp_path / "head"
    if previous:
        shutil.copytree(ws.eagle, out)
    before = _head_files(out) if previous else {}
    hits = []  # the interrupts that fired: the test is vacuous if the run stopped anywhere else
    if when == "weights-mid-write":
        def save_file(state, path, metadata=None):
            hits.append(path)
            pathlib.Path(path).write_bytes(b"half a safetensors file")
            raise KeyboardInterrupt

        monkeypatch.setattr("frspec.train.head.save_file", save_file)
    elif when == "config-mid-write":
        real_write_text = pathlib.Path.write_text

        def write_text(self, data, *args, **kwargs):
            if self.name.startswith(".config.json.") and self.parent == out:
                hits.append(self)
                real_write_text(self, data[: len(data) // 2])
                raise KeyboardInterrupt
            return real_write_text(self, data, *args, **kwargs)

        monkeypatch.setattr(pathlib.Path, "write_text", write_text)
    else:
        real_replace, renames = frspec.io.os.replace, []

        def replace(src, dst):
            if pathlib.Path(dst).parent == out and pathlib.Path(dst).name in HEAD_FILES:
                renames.append(dst)
                if len(renames) == (1 if when == "first-rename" else 2):
                    hits.append(dst)
                    raise KeyboardInterrupt
            return real_replace(src, dst)

        monkeypatch.setattr(frspec.io.os, "replace", replace)
    code, _, err = run_cli(_train_argv(ws, out, tmp_path / "work"))
    assert code == 130 and err.strip().splitlines()[-1] == "frspec: interrupted", (code, err)
    assert len(hits) == 1, "the interrupt must land where this case says"
    assert not leftovers(tmp_path)
    if when.endswith("mid-write"):
        assert _head_files(out) == before  # the previous head untouched, or still no head at all
    else:
        assert not (out / "config.json").exists() and not is_head_ready(out)
        with pytest.raises(FrspecError, match="has no config.json"):
            resolve_head_dir(out)
