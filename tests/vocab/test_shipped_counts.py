"""The token counts shipped with the package and `frspec vocab get`: every shipped tokenizer is there with the ids
its maps must keep, maps come out in every format offline, and bad requests are one-line errors with no output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from frspec.cli import main
from frspec.vocab.shipped import DOMAINS, PARTS, domain_counts, load_shipped, shipped_metadata, shipped_names
from frspec.vocab.token_map import TokenMap

# name -> (tokenizer ids, end-of-turn id its chat template emits, a chat-template token id)
SHIPPED = {
    "llama3.1": (128_256, 128_009, 128_006),  # <|eot_id|>, <|start_header_id|>
    "deepseek-v3": (128_815, 1, 128_804),  # <｜end▁of▁sentence｜>, <｜Assistant｜>
    "gemma3": (262_145, 106, 105),  # <end_of_turn>, <start_of_turn>
    "qwen2.5": (151_936, 151_645, 151_644),  # <|im_end|>, <|im_start|>
}


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_every_tokenizer_ships_with_its_kept_tokens():
    assert set(SHIPPED) <= set(shipped_names())
    for name, (vocab_size, eot, template) in SHIPPED.items():
        meta = shipped_metadata(name)
        assert meta["tokenizer"]["vocab_size"] == vocab_size
        kept = set(meta["keep_tokens"].values())
        assert {eot, template} <= kept, name
        # Placeholders (Gemma's 6,000 <unusedN>, Llama's reserved specials) are not forced into maps.
        assert not any("unused" in t or "reserved" in t for t in meta["keep_tokens"]), name
        parts = load_shipped(name)
        assert set(parts) == set(PARTS)
        for part, counts in parts.items():
            assert counts.vocab_size == vocab_size and counts.total > 10_000, (name, part)
            assert counts.metadata["tokenizer"]["vocab_hash"] == meta["tokenizer"]["vocab_hash"]
        # The model emits its end-of-turn token once per assistant turn, so the chat counts have it.
        assert int(parts["chat"].counts[eot]) > 1000, name
        assert parts["chat"].metadata["skip"] == 0 and parts["chat-heldout"].metadata["skip"] == 15_000


def test_domains_rank_differently():
    parts = load_shipped("qwen2.5")
    tops = {d: set(TokenMap.from_counts(domain_counts(parts, d), top_k=4096).ids.tolist()) for d in DOMAINS}
    assert tops["chat"] != tops["code"]
    assert tops["mix"] - tops["chat"] and tops["mix"] - tops["code"]


@pytest.mark.parametrize("fmt,suffix", [("thunlp", ".pt"), ("frspec", ".safetensors"),
                                        ("eagle3", ".safetensors"), ("vllm-scores", ".pt")])
def test_get_writes_every_format(tmp_path, capsys, fmt, suffix):
    out = tmp_path / f"map{suffix}"
    code, stdout, err = run(capsys, "vocab", "get", "gemma3", "--size", 16384, "--domain", "mix", "--format", fmt,
                            "--out", out)
    assert code == 0, err
    assert "kept 16,384 of 262,145 ids" in stdout and "<- this map" in stdout and "held-out code" in stdout
    token_map = TokenMap.load(out, vocab_size=262_145)
    assert token_map.k == 16384 and {106, 105, 1} <= set(token_map.ids.tolist())  # <end_of_turn>, <start_of_turn>, <eos>
    if fmt == "frspec":
        assert token_map.metadata["tokenizer"]["vocab_size"] == 262_145
        assert token_map.metadata["shipped"] == {"name": "gemma3", "domain": "mix"}


def test_get_thunlp_matches_ranking_and_vocab_size(tmp_path, capsys):
    out = tmp_path / "ds.pt"
    code, stdout, err = run(capsys, "vocab", "get", "DeepSeek_V3", "--size", 32768, "--vocab-size", 129_280,
                            "--out", out)
    assert code == 0, err
    ids = torch.load(out, weights_only=True)
    assert isinstance(ids, list) and len(ids) == 32768 and 1 in ids
    chat = load_shipped("deepseek-v3")["chat"].counts
    assert chat[ids[0]] == chat.max()  # frequency order
    # Gemma-3-1B's head has 262,144 rows: the never-counted image token (id 262,144) is dropped.
    code, stdout, err = run(capsys, "vocab", "get", "gemma3", "--size", 8192, "--vocab-size", 262_144,
                            "--format", "eagle3", "--out", tmp_path / "g.safetensors")
    assert code == 0, err
    assert TokenMap.load(tmp_path / "g.safetensors", vocab_size=262_144).k == 8192


def test_list(capsys):
    code, stdout, err = run(capsys, "vocab", "get", "--list")
    assert code == 0, err
    for name in SHIPPED:
        assert name in stdout


@pytest.mark.parametrize("argv,message", [
    (["nosuch", "--size", "10"], "no shipped counts for 'nosuch'; shipped: "),
    (["qwen2.5", "--size", "0"], "--size must be a positive"),
    (["qwen2.5", "--size", "999999"], "larger than the 151,936-id vocabulary"),
    (["qwen2.5", "--size", "5"], "cannot hold the 26 tokens"),
    (["qwen2.5", "--size", "100", "--vocab-size", "1000"], "would drop id 1000"),
    (["qwen2.5"], "vocab get needs --size"),
])
def test_get_errors_are_one_line_with_no_output(tmp_path, capsys, argv, message):
    out = tmp_path / "map.pt"
    code, stdout, err = run(capsys, "vocab", "get", *argv, "--out", out)
    assert code == 2 and message in err and err.count("\n") == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_get_needs_neither_tokenizer_nor_network(tmp_path):
    """`vocab get` in a fresh process, offline, loads no tokenizer (frspec's loader never imported: no files, no hub)."""
    script = (
        "import sys\nfrom frspec.cli import main\n"
        f"code = main(['vocab', 'get', 'llama3.1', '--size', '4096', '--out', {str(tmp_path / 'm.pt')!r}])\n"
        "assert code == 0 and 'frspec.models.tokenizer' not in sys.modules"
    )
    env = {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
           "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert 128_009 in torch.load(tmp_path / "m.pt", weights_only=True)
