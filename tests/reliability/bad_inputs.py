"""Every command x bad input the CLI must answer with one clear line: the rows of docs/reliability.md's table.

A row is (id, command, what is wrong, build, exit code, message pattern). `build(ws, tmp)` writes the bad input under
`tmp` and returns (argv, output path or None); the output path must not exist after the command.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class Row:
    id: str
    command: str
    bad: str
    build: Callable
    code: int
    message: str  # a regular expression the error line must match
    pending: str | None = None  # the fix lives in a module being moved (decode redesign): xfail(strict) until then


def garbage(path: Path, data: bytes = b"this is not the file you were looking for\x00\xff" * 8) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def truncated(src: Path, dst: Path, keep: float = 0.5) -> Path:
    data = src.read_bytes()
    return garbage(dst, data[: int(len(data) * keep)])


def model_copy(src: Path, dst: Path, weights: Callable[[Path], None]) -> Path:
    shutil.copytree(src, dst)
    weights(dst / "model.safetensors")
    return dst


def under_a_file(ws, name: str) -> Path:
    """An output path whose parent is a regular file: unwritable even for root."""
    return ws.text / name


def gen(ws, *extra) -> list:
    return ["generate", "--target", ws.target, "--prompt", "hello", "--raw", "--max-new-tokens", "4",
            "--dtype", "fp32", "--threads", "1", *extra]


def count(ws, inputs, out, *extra) -> list:
    return ["vocab", "count", "--tokenizer", ws.target, "--input", inputs, "--out", out, "--no-progress", *extra]


def build_map(ws, counts, out, *extra) -> list:
    return ["vocab", "build", "--counts", counts, "--out", out, *extra]


def bench(ws, out, *extra) -> list:
    return ["bench", "--target", ws.target, "--draft", ws.draft, "--dataset", ws.jsonl, "--num-prompts", "1",
            "--max-new-tokens", "4", "--num-spec-tokens", "2", "--dtype", "fp32", "--threads", "1",
            "--token-map", ws.map, "--no-progress", "--out", out, *extra]


def train(ws, data, out, *extra) -> list:
    return ["train", "eagle", "--target", ws.target, "--data", data, "--out", out, "--max-steps", "1",
            "--dtype", "fp32", "--threads", "1", "--no-progress", *extra]


def _rows() -> list[Row]:
    R = Row
    rows = [
        # --- vocab count: tokenizers, corpora, numbers, output ---------------------------------------------------
        R("count-tokenizer-missing", "vocab count", "tokenizer path does not exist",
          lambda ws, t: (["vocab", "count", "--tokenizer", t / "nope", "--input", ws.text, "--out", t / "c.st"],
                         t / "c.st"), 2, r"nope"),
        R("count-tokenizer-corrupt-json", "vocab count", "tokenizer.json is garbage",
          lambda ws, t: (["vocab", "count", "--tokenizer",
                          garbage(t / "tok" / "tokenizer.json").parent, "--input", ws.text, "--out", t / "c.st"],
                         t / "c.st"), 2, r"tok"),
        R("count-tokenizer-gguf-corrupt", "vocab count", ".gguf tokenizer is not a GGUF",
          lambda ws, t: (["vocab", "count", "--tokenizer", garbage(t / "x.gguf"), "--input", ws.text,
                          "--out", t / "c.st"], t / "c.st"), 2, r"x\.gguf"),
        R("count-tokenizer-gguf-truncated", "vocab count", ".gguf tokenizer cut in half",
          lambda ws, t: (["vocab", "count", "--tokenizer", truncated(ws.gguf, t / "half.gguf"), "--input", ws.text,
                          "--out", t / "c.st"], t / "c.st"), 2, r"half\.gguf"),
        R("count-input-missing", "vocab count", "corpus file does not exist",
          lambda ws, t: (count(ws, t / "none.txt", t / "c.st"), t / "c.st"), 2, r"none\.txt"),
        R("count-input-non-utf8", "vocab count", "corpus is not UTF-8",
          lambda ws, t: (count(ws, garbage(t / "latin1.txt", "caf\xe9 na\xefve\n".encode("latin-1") * 5),
                               t / "c.st"), t / "c.st"), 2, r"latin1\.txt.*UTF-8"),
        R("count-input-empty", "vocab count", "corpus is empty",
          lambda ws, t: (count(ws, garbage(t / "empty.txt", b""), t / "c.st"), t / "c.st"), 2, r"(?i)empty|no "),
        R("count-jsonl-corrupt", "vocab count", "a JSONL line is not JSON",
          lambda ws, t: (count(ws, garbage(t / "bad.jsonl", b'{"text": "ok"}\n{"text": broken\n'), t / "c.st"),
                         t / "c.st"), 2, r"bad\.jsonl"),
        R("count-sharegpt-wrong-schema", "vocab count", "ShareGPT JSON of the wrong shape",
          lambda ws, t: (count(ws, garbage(t / "chats.json", json.dumps({"conversations": 3}).encode()),
                               t / "c.st", "--assistant-only"), t / "c.st"), 2, r"chats\.json"),
        R("count-limit-zero", "vocab count", "--limit 0",
          lambda ws, t: (count(ws, ws.text, t / "c.st", "--limit", "0"), t / "c.st"), 2, r"--limit"),
        R("count-skip-negative", "vocab count", "--skip -1",
          lambda ws, t: (count(ws, ws.text, t / "c.st", "--skip", "-1"), t / "c.st"), 2, r"--skip"),
        R("count-vocab-size-negative", "vocab count", "--vocab-size -3",
          lambda ws, t: (count(ws, ws.text, t / "c.st", "--vocab-size", "-3"), t / "c.st"), 2, r"--vocab-size"),
        R("count-out-unwritable", "vocab count", "--out under a regular file",
          lambda ws, t: (count(ws, ws.text, under_a_file(ws, "c.st")), None), 2, r"corpus\.txt"),
        # --- vocab build -------------------------------------------------------------------------------------------
        R("build-counts-missing", "vocab build", "counts file does not exist",
          lambda ws, t: (build_map(ws, t / "none.safetensors", t / "m.st", "--top-k", "8"), t / "m.st"), 2,
          r"none\.safetensors"),
        R("build-counts-corrupt", "vocab build", "counts file is garbage",
          lambda ws, t: (build_map(ws, garbage(t / "c.safetensors"), t / "m.st", "--top-k", "8"), t / "m.st"), 2,
          r"c\.safetensors"),
        R("build-counts-truncated", "vocab build", "counts file cut in half",
          lambda ws, t: (build_map(ws, truncated(ws.counts, t / "c.safetensors"), t / "m.st", "--top-k", "8"),
                         t / "m.st"), 2, r"c\.safetensors"),
        R("build-counts-is-a-map", "vocab build", "a token map given as counts",
          lambda ws, t: (build_map(ws, ws.map, t / "m.st", "--top-k", "8"), t / "m.st"), 2, r"map\.safetensors"),
        R("build-top-k-zero", "vocab build", "--top-k 0",
          lambda ws, t: (build_map(ws, ws.counts, t / "m.st", "--top-k", "0"), t / "m.st"), 2, r"(?i)top.?k|k must"),
        R("build-top-k-negative", "vocab build", "--top-k -5",
          lambda ws, t: (build_map(ws, ws.counts, t / "m.st", "--top-k", "-5"), t / "m.st"), 2,
          r"(?i)top.?k|k must"),
        R("build-top-k-huge", "vocab build", "--top-k larger than the vocabulary",
          lambda ws, t: (build_map(ws, ws.counts, t / "m.st", "--top-k", "10000000"), t / "m.st"), 2,
          r"10000000"),
        R("build-keep-fraction-out-of-range", "vocab build", "--keep-fraction 1.5",
          lambda ws, t: (build_map(ws, ws.counts, t / "m.st", "--keep-fraction", "1.5"), t / "m.st"), 2,
          r"(?i)fraction"),
        R("build-coverage-out-of-range", "vocab build", "--coverage 0",
          lambda ws, t: (build_map(ws, ws.counts, t / "m.st", "--coverage", "0"), t / "m.st"), 2, r"(?i)coverage"),
        R("build-vocab-size-mismatch", "vocab build", "--vocab-size differs from the counts'",
          lambda ws, t: (build_map(ws, ws.counts, t / "m.st", "--top-k", "8", "--vocab-size", "9999"), t / "m.st"),
          2, r"9999"),
        R("build-out-unwritable", "vocab build", "--out under a regular file",
          lambda ws, t: (build_map(ws, ws.counts, under_a_file(ws, "m.st"), "--top-k", "8"), None), 2,
          r"corpus\.txt"),
        # --- vocab convert / info / coverage / merge: token-map files --------------------------------------------
        R("convert-map-missing", "vocab convert", "map file does not exist",
          lambda ws, t: (["vocab", "convert", t / "none.pt", t / "o.st"], t / "o.st"), 2, r"none\.pt"),
        R("convert-map-corrupt", "vocab convert", "map file is garbage",
          lambda ws, t: (["vocab", "convert", garbage(t / "m.pt"), t / "o.st"], t / "o.st"), 2, r"m\.pt"),
        R("convert-map-truncated", "vocab convert", "frspec map cut in half",
          lambda ws, t: (["vocab", "convert", truncated(ws.map, t / "m.safetensors"), t / "o.pt"], t / "o.pt"), 2,
          r"m\.safetensors"),
        R("convert-map-json", "vocab convert", "a JSON list where a map file is expected",
          lambda ws, t: (["vocab", "convert", garbage(t / "m.json", b"[1, 2, 3]"), t / "o.st"], t / "o.st"), 2,
          r"m\.json"),
        R("convert-map-duplicate-ids", "vocab convert", "thunlp list repeating an id",
          lambda ws, t: (["vocab", "convert", _thunlp(t / "dup.pt", [3, 1, 3]), t / "o.st", "--vocab-size", "72"],
                         t / "o.st"), 2, r"dup\.pt.*thunlp.*duplicated"),
        R("convert-thunlp-without-vocab", "vocab convert", "thunlp map to frspec without a vocabulary size",
          lambda ws, t: (["vocab", "convert", _thunlp(t / "m.pt", [3, 1, 2]), t / "o.safetensors"],
                         t / "o.safetensors"), 2, r"--vocab-size"),
        R("convert-wrong-vocab", "vocab convert", "map ids beyond --vocab-size",
          lambda ws, t: (["vocab", "convert", _thunlp(t / "m.pt", [3, 100]), t / "o.st", "--vocab-size", "72"],
                         t / "o.st"), 2, r"100"),
        R("convert-out-unwritable", "vocab convert", "output under a regular file",
          lambda ws, t: (["vocab", "convert", ws.map, under_a_file(ws, "o.pt")], None), 2, r"corpus\.txt"),
        R("info-counts-not-map", "vocab info", "a counts file given as a map",
          lambda ws, t: (["vocab", "info", ws.counts], None), 2, r"counts"),
        R("coverage-counts-corrupt", "vocab coverage", "counts file is garbage",
          lambda ws, t: (["vocab", "coverage", "--counts", garbage(t / "c.safetensors")], None), 2,
          r"c\.safetensors"),
        R("coverage-map-wrong-vocab", "vocab coverage", "--map for another vocabulary",
          lambda ws, t: (["vocab", "coverage", "--counts", ws.counts, "--map", ws.other_vocab_map], None), 2,
          r"80|72"),
        R("coverage-sizes-negative", "vocab coverage", "--sizes -3",
          lambda ws, t: (["vocab", "coverage", "--counts", ws.counts, "--sizes", "-3"], None), 2, r"-3"),
        R("coverage-plot-unwritable", "vocab coverage", "--plot under a regular file",
          lambda ws, t: (["vocab", "coverage", "--counts", ws.counts, "--plot", under_a_file(ws, "p.png")], None),
          2, r"corpus\.txt"),
        R("merge-counts-corrupt", "vocab merge", "one counts file is garbage",
          lambda ws, t: (["vocab", "merge", ws.counts, garbage(t / "c.safetensors"), "--out", t / "m.st"],
                         t / "m.st"), 2, r"c\.safetensors"),
        # --- generate: models, maps, heads, numbers, prompts ------------------------------------------------------
        R("generate-target-missing", "generate", "target path does not exist",
          lambda ws, t: (["generate", "--target", t / "none", "--prompt", "x"], None), 2, r"none"),
        R("generate-target-corrupt-safetensors", "generate", "target weights are garbage",
          lambda ws, t: (["generate", "--target", model_copy(ws.target, t / "junk", garbage), "--prompt", "x",
                          "--dtype", "fp32"], None), 2, r"junk"),
        R("generate-target-truncated-safetensors", "generate", "target weights cut in half",
          lambda ws, t: (["generate", "--target", model_copy(ws.target, t / "cut",
                                                                lambda p: truncated(p, p, 0.5)),
                          "--prompt", "x", "--dtype", "fp32"], None), 2, r"cut"),
        R("generate-target-gguf-corrupt", "generate", "target .gguf is garbage",
          lambda ws, t: (["generate", "--target", garbage(t / "m.gguf"), "--prompt", "x"], None), 2, r"m\.gguf"),
        R("generate-target-gguf-truncated", "generate", "target .gguf cut in half",
          lambda ws, t: (["generate", "--target", truncated(ws.gguf, t / "half.gguf"), "--prompt", "x"], None), 2,
          r"half\.gguf"),
        R("generate-draft-other-vocab", "generate", "draft with another vocabulary",
          lambda ws, t: (gen(ws, "--draft", ws.other_vocab_model), None), 2, r"(?i)vocab"),
        R("generate-map-corrupt", "generate", "--token-map is garbage",
          lambda ws, t: (gen(ws, "--draft", ws.draft, "--token-map", garbage(t / "m.safetensors")), None), 2,
          r"m\.safetensors"),
        R("generate-map-wrong-vocab", "generate", "--token-map for another vocabulary",
          lambda ws, t: (gen(ws, "--draft", ws.draft, "--token-map", ws.other_vocab_map), None), 2, r"80"),
        R("generate-eagle-missing", "generate", "--eagle directory does not exist",
          lambda ws, t: (gen(ws, "--eagle", t / "nohead"), None), 2, r"nohead"),
        R("generate-eagle-corrupt-config", "generate", "--eagle config.json is garbage",
          lambda ws, t: (gen(ws, "--eagle", _head(ws, t, config=b"{not json")), None), 2, r"head"),
        R("generate-eagle-truncated-weights", "generate", "--eagle weights cut in half",
          lambda ws, t: (gen(ws, "--eagle", _head(ws, t, cut=True)), None), 2, r"head"),
        R("generate-eagle-wrong-target", "generate", "--eagle head of another target",
          lambda ws, t: (gen(ws, "--eagle", _head(ws, t, hidden=48)), None), 2, r"(?i)hidden|size"),
        R("generate-eagle-other-vocab", "generate", "--eagle head of another vocabulary",
          lambda ws, t: (gen(ws, "--eagle", _head(ws, t, vocab_extra=8)), None), 2, r"(?i)vocab"),
        R("generate-max-new-tokens-negative", "generate", "--max-new-tokens -1",
          lambda ws, t: (gen(ws, "--max-new-tokens", "-1"), None), 2, r"max_new_tokens|max-new-tokens"),
        R("generate-max-new-tokens-huge", "generate", "--max-new-tokens 10^12",
          lambda ws, t: (gen(ws, "--max-new-tokens", str(10**12)), None), 2, r"(?i)position|context"),
        R("generate-beyond-context", "generate", "prompt + max_new_tokens beyond the model's positions",
          lambda ws, t: (gen(ws, "--max-new-tokens", "5000"), None), 2, r"(?i)position|context"),
        R("generate-num-spec-tokens-zero", "generate", "--num-spec-tokens 0",
          lambda ws, t: (gen(ws, "--draft", ws.draft, "--num-spec-tokens", "0"), None), 2, r"num_spec_tokens"),
        R("generate-tree-depth-zero", "generate", "--tree-depth 0",
          lambda ws, t: (gen(ws, "--draft", ws.draft, "--tree-depth", "0"), None), 2, r"depth"),
        R("generate-tree-huge", "generate", "--tree-depth 8 --tree-branching 8 (16.7M nodes)",
          lambda ws, t: (gen(ws, "--draft", ws.draft, "--tree-depth", "8", "--tree-branching", "8"), None), 2,
          r"nodes"),
        R("generate-top-p-zero", "generate", "--top-p 0",
          lambda ws, t: (gen(ws, "--temperature", "1", "--top-p", "0"), None), 2, r"top_p"),
        R("generate-top-k-negative", "generate", "--top-k -1",
          lambda ws, t: (gen(ws, "--temperature", "1", "--top-k", "-1"), None), 2, r"top_k"),
        R("generate-temperature-nan", "generate", "--temperature nan",
          lambda ws, t: (gen(ws, "--temperature", "nan"), None), 2, r"temperature"),
        R("generate-prompt-file-missing", "generate", "--prompt-file does not exist",
          lambda ws, t: (["generate", "--target", ws.target, "--prompt-file", t / "none.txt"], None), 2,
          r"none\.txt"),
        R("generate-prompt-file-non-utf8", "generate", "--prompt-file is not UTF-8",
          lambda ws, t: (["generate", "--target", ws.target, "--prompt-file",
                          garbage(t / "p.txt", b"caf\xe9\n")], None), 2, r"p\.txt"),
        R("generate-prompt-file-empty", "generate", "--prompt-file is empty",
          lambda ws, t: (["generate", "--target", ws.target, "--raw", "--dtype", "fp32", "--prompt-file",
                          garbage(t / "p.txt", b"")], None), 2, r"(?i)empty"),
        R("generate-threads-zero", "generate", "--threads 0",
          lambda ws, t: (gen(ws) [:-2] + ["--threads", "0"], None), 2, r"thread"),
        # --- bench ---------------------------------------------------------------------------------------------------
        R("bench-dataset-missing", "bench", "--dataset does not exist",
          lambda ws, t: (bench(ws, t / "out", "--dataset", t / "none.jsonl"), t / "out"), 2, r"none\.jsonl"),
        R("bench-dataset-corrupt", "bench", "--dataset line is not JSON",
          lambda ws, t: (bench(ws, t / "out", "--dataset", garbage(t / "p.jsonl", b'{"prompt": "a"}\n{oops\n')),
                         t / "out"), 2, r"p\.jsonl"),
        R("bench-dataset-empty", "bench", "--dataset is empty",
          lambda ws, t: (bench(ws, t / "out", "--dataset", garbage(t / "p.jsonl", b"")), t / "out"), 2,
          r"p\.jsonl"),
        R("bench-dataset-non-utf8", "bench", "--dataset is not UTF-8",
          lambda ws, t: (bench(ws, t / "out", "--dataset", garbage(t / "p.jsonl", b'{"prompt": "caf\xe9"}\n')),
                         t / "out"), 2, r"p\.jsonl"),
        R("bench-num-prompts-zero", "bench", "--num-prompts 0",
          lambda ws, t: (bench(ws, t / "out", "--num-prompts", "0"), t / "out"), 2, r"num.prompts"),
        R("bench-max-new-tokens-negative", "bench", "--max-new-tokens -4",
          lambda ws, t: (bench(ws, t / "out", "--max-new-tokens", "-4"), t / "out"), 2, r"max.new.tokens"),
        R("bench-map-wrong-vocab", "bench", "--token-map for another vocabulary",
          lambda ws, t: (bench(ws, t / "out", "--token-map", ws.other_vocab_map), t / "out"), 2, r"80"),
        R("bench-out-unwritable", "bench", "--out under a regular file",
          lambda ws, t: (bench(ws, under_a_file(ws, "out")), None), 2, r"corpus\.txt"),
        # --- train eagle ---------------------------------------------------------------------------------------------
        R("train-data-missing", "train eagle", "--data does not exist",
          lambda ws, t: (train(ws, t / "none.jsonl", t / "head"), t / "head"), 2, r"none\.jsonl"),
        R("train-data-empty", "train eagle", "--data is empty",
          lambda ws, t: (train(ws, garbage(t / "d.jsonl", b""), t / "head"), t / "head"), 2, r"(?i)d\.jsonl|empty|no "),
        R("train-epochs-zero", "train eagle", "--epochs 0",
          lambda ws, t: (train(ws, ws.sharegpt, t / "head", "--epochs", "0"), t / "head"), 2, r"epochs"),
        R("train-lr-negative", "train eagle", "--lr -1",
          lambda ws, t: (train(ws, ws.sharegpt, t / "head", "--lr", "-1"), t / "head"), 2, r"lr|learning"),
        R("train-out-unwritable", "train eagle", "--out under a regular file",
          lambda ws, t: (train(ws, ws.sharegpt, under_a_file(ws, "head")), None), 2, r"corpus\.txt"),
    ]
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids)), "row ids must be unique"
    return rows


def _thunlp(path: Path, ids: list[int]) -> Path:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ids, path)
    return path


def _head(ws, t: Path, config: bytes | None = None, cut: bool = False, hidden: int | None = None,
          vocab_extra: int = 0) -> Path:
    head = t / "head"
    shutil.copytree(ws.eagle, head)
    if config is not None:
        (head / "config.json").write_bytes(config)
    if cut:
        truncated(head / "model.safetensors", head / "model.safetensors", 0.5)
    if hidden is not None or vocab_extra:
        import torch

        from tests.decode.eagle_tiny import oracle_eagle2_checkpoint
        from tests.decode.spec_tiny import tiny_lm
        from safetensors.torch import save_file

        cfg, state = oracle_eagle2_checkpoint(tiny_lm("llama", ws.vocab + vocab_extra, hidden=hidden or 32, seed=0,
                                                        dtype=torch.float32))
        (head / "config.json").write_text(json.dumps(cfg))
        save_file({k: v.contiguous() for k, v in state.items()}, str(head / "model.safetensors"))
    return head


ROWS = _rows()


def markdown_table() -> str:
    """The table of docs/reliability.md, from running every row (`python -m tests.reliability.bad_inputs`, from the repository root)."""
    import os
    import re as _re
    import tempfile

    os.environ["FRSPEC_CACHE"] = tempfile.mkdtemp()
    from tests.reliability.conftest import Workspace
    from tests.reliability.test_bad_inputs import run_cli

    root = Path(tempfile.mkdtemp())
    ws = Workspace(root / "ws")
    lines = ["| row | command | bad input | exit | message |", "|---|---|---|---|---|"]
    for row in ROWS:
        t = root / row.id
        t.mkdir()
        argv, _ = row.build(ws, t)
        code, _, err = run_cli(argv)
        if "Traceback" in err:
            msg = "traceback: " + err.strip().splitlines()[-1][:120]
        else:
            msg = next((line for line in err.splitlines() if "error:" in line), f"no error (exit {code})")
        msg = msg.replace(str(t), "DIR").replace(str(ws.root), "WS")
        msg = _re.sub(r"/tmp/[^ ']*/cache", "CACHE", msg)
        if row.pending:
            msg = f"**pending** ({row.pending}); today: {msg}"
        lines.append(f"| `{row.id}` | {row.command} | {row.bad} | {code} | {msg.replace('|', '/')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
