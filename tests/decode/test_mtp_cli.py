"""`frspec generate --target DIR --mtp` end to end on a tiny checkpoint of each MTP family (mtp_tiny.py)."""

from __future__ import annotations

import json

import pytest
from tests.decode.mtp_tiny import FAMILIES, save_mtp_checkpoint
from tests.decode.spec_tiny import tiny_tokenizer

from frspec import cli
from frspec.vocab.token_map import TokenMap

VOCAB = 96


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp_cli")
    dirs = {}
    for family in FAMILIES:
        dirs[family] = save_mtp_checkpoint(root / family, family, vocab=VOCAB)
        tiny_tokenizer().save_pretrained(dirs[family])
    TokenMap(list(range(0, VOCAB, 2)), VOCAB).save(root / "map.frspec")
    return root, dirs


def _run(argv, capsys):
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_with_mtp_is_the_targets_output(checkpoints, family, capsys):
    root, dirs = checkpoints
    base = ["generate", "--target", str(dirs[family]), "--prompt", "the cat sat", "--raw", "--max-new-tokens", "12",
            "--dtype", "fp32", "--json", "--threads", "1"]
    code, out, err = _run(base, capsys)
    assert code == 0, err
    vanilla = json.loads(out)
    assert vanilla["method"] == "vanilla" and "carries 1 MTP layer(s)" in err and "--mtp drafts with them" in err
    code, out, err = _run(base + ["--mtp"], capsys)
    assert code == 0, err
    mtp = json.loads(out)
    assert mtp["method"] == "mtp" and mtp["token_ids"] == vanilla["token_ids"]
    code, out, err = _run(base + ["--mtp", "--token-map", str(root / "map.frspec"), "--tree-depth", "3",
                                  "--tree-branching", "2"], capsys)
    assert code == 0, err
    mapped = json.loads(out)
    assert mapped["method"] == "mtp+fr-spec" and mapped["token_ids"] == vanilla["token_ids"]


def test_mtp_errors_are_one_line(tmp_path, checkpoints, capsys):
    root, dirs = checkpoints
    code, _, err = _run(["generate", "--target", str(dirs["mimo"]), "--mtp", "--draft", str(dirs["mimo"]),
                         "--prompt", "x"], capsys)
    assert code != 0 and "without --draft or --eagle" in err
    from tests.decode.spec_tiny import tiny_lm

    import torch

    tiny_lm("qwen2", VOCAB, dtype=torch.float32).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    code, _, err = _run(["generate", "--target", str(tmp_path), "--mtp", "--prompt", "x", "--dtype", "fp32"], capsys)
    assert code != 0 and "carries no MTP layers" in err and "Traceback" not in err


def test_mtp_on_a_quantized_head_is_a_one_line_error(checkpoints, capsys):
    _, dirs = checkpoints
    code, _, err = _run(["generate", "--target", str(dirs["mimo"]), "--mtp", "--prompt", "x", "--dtype", "fp32",
                         "--quant", "int8"], capsys)
    assert code != 0 and "without --quant" in err and "Traceback" not in err
