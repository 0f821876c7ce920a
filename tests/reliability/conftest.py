"""Good inputs of every kind the CLI reads (tiny, built in-process), from which the bad-input tests derive bad ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.decode.eagle_tiny import oracle_eagle2_checkpoint
from tests.decode.spec_tiny import tiny_lm, tiny_tokenizer
from tests.models.tiny_gguf_models import write_tiny_gguf


class Workspace:
    """Paths of good inputs; `bad/` holds the broken variants tests write."""

    def __init__(self, root: Path):
        self.root = root
        self.bad = root / "bad"
        self.bad.mkdir(parents=True)
        tok = tiny_tokenizer()
        self.vocab = len(tok)
        for name, seed, vocab in (("target", 0, self.vocab), ("draft", 1, self.vocab), ("other", 2, self.vocab + 8)):
            model = tiny_lm("llama", vocab, hidden=32, seed=seed, dtype=torch.float32)
            model.save_pretrained(root / name)
            tok.save_pretrained(root / name)
        self.target, self.draft, self.other_vocab_model = root / "target", root / "draft", root / "other"
        from frspec.vocab.token_map import TokenMap

        self.map = root / "map.safetensors"
        TokenMap(list(range(40)), self.vocab).save(self.map)
        self.other_vocab_map = root / "map-other.safetensors"
        TokenMap(list(range(40)), self.vocab + 8).save(self.other_vocab_map)
        self.text = root / "corpus.txt"
        self.text.write_text("hello world, the quick brown fox.\n" * 20)
        self.jsonl = root / "prompts.jsonl"
        self.jsonl.write_text("".join(json.dumps({"prompt": f"hello {i}", "category": "x"}) + "\n" for i in range(4)))
        self.sharegpt = root / "chats.json"
        self.sharegpt.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi there"},
                                                                 {"from": "gpt", "value": "hello friend"}]}] * 3))
        self.gguf = root / "tiny.gguf"
        write_tiny_gguf(self.gguf)
        head_config, head_state = oracle_eagle2_checkpoint(tiny_lm("llama", self.vocab, hidden=32, seed=0,
                                                                   dtype=torch.float32))
        self.eagle = root / "eagle"
        self.eagle.mkdir()
        (self.eagle / "config.json").write_text(json.dumps(head_config))
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in head_state.items()}, str(self.eagle / "model.safetensors"))
        self.counts = root / "counts.safetensors"
        from frspec.cli import main

        assert main(["vocab", "count", "--tokenizer", str(self.target), "--input", str(self.text), "--out",
                     str(self.counts), "--no-progress"]) == 0


@pytest.fixture(scope="session")
def ws(tmp_path_factory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("reliability"))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FRSPEC_CACHE", str(tmp_path / "cache"))
