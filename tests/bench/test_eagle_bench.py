"""`frspec bench` with EAGLE heads and token trees: tiny random targets, oracle heads from the engine tests."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from frspec.bench.datasets import encode_prompt
from frspec.bench.eagle_heads import DEFAULT_HEAD_NAME, resolve_eagle_head
from frspec.bench.methods import EAGLE, EAGLE_FRSPEC, VANILLA, plan_methods
from frspec.bench.runner import run_benchmark
from frspec.bench.summary import summarize
from frspec.cli import main
from frspec.errors import FrspecError
from frspec.models.tokenizer import load_tokenizer
from frspec.decode.tree_shape import TreeShape
from frspec.vocab.counting import count_tokens
from frspec.vocab.token_map import TokenMap

from tests.models.eagle_layouts import eagle2_tensors, head_config, write_checkpoint
from tests.decode.eagle_tiny import mostly_bigram, oracle_eagle2_checkpoint, oracle_eagle2_head, oracle_eagle3_head
from tests.bench.conftest import CORPUS, VOCAB


PROMPTS = ["Write a travel story.", "Explain the math of a python list sum.", "Why is the fox quick?"]


def _models(tiny_dirs):
    """fp64 target made mostly bigram (so oracle EAGLE heads agree with it often), the draft, the tokenizer."""
    target_dir, draft_dir = tiny_dirs
    target = mostly_bigram(AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval())
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float64).eval()
    return target, draft, load_tokenizer(str(target_dir))


@pytest.mark.parametrize("head_kind", ["eagle2", "eagle3"])
def test_runner_with_eagle_chain_trees_and_maps_is_lossless_in_fp64(tiny_dirs, head_kind):
    """Every method kind and shape on one target: greedy outputs equal vanilla's in fp64, rows are consistent."""
    target, draft, tok = _models(tiny_dirs)
    head = oracle_eagle2_head(target) if head_kind == "eagle2" else oracle_eagle3_head(target)
    counts = count_tokens(tok, CORPUS, vocab_size=VOCAB)
    maps = {k: TokenMap.from_counts(counts, top_k=k) for k in (16, 64)}
    methods = plan_methods(
        [2], [64], draft_tree_shapes=[TreeShape.static(2, 2)],
        eagle_tree_shapes=[TreeShape.chain(3), TreeShape.static(2, 2), TreeShape.dynamic(3, 3, 8)],
        eagle_token_map_sizes=[16, 64],
    )
    prompts = [(f"p{i}", encode_prompt(tok, text)) for i, text in enumerate(PROMPTS)]
    result = run_benchmark(target, draft, tok, prompts, methods, maps, max_new_tokens=16, progress=False, eagle=head)

    assert len(result.generations) == len(prompts) * len(methods)
    for pid, _ in prompts:
        outputs = {tuple(g.token_ids) for g in result.generations if g.prompt_id == pid}
        assert len(outputs) == 1 and len(next(iter(outputs))) == 16  # greedy fp64: all equal vanilla's
    assert result.divergences == []
    for g in result.generations:
        if g.method.tree is not None:
            assert g.stats.tree == str(g.method.tree)

    rows = {r["label"]: r for r in summarize(result)}
    assert all(r["greedy_identical"] == "yes" for label, r in rows.items() if label != VANILLA)
    chain, chain16 = rows["eagle chain-3"], rows["eagle+fr-spec chain-3 map=16"]
    assert (chain["method"], chain["tree"], chain["num_spec_tokens"]) == (EAGLE, "chain-3", 3)
    assert (chain16["method"], chain16["tree"], chain16["token_map_size"]) == (EAGLE_FRSPEC, "chain-3", 16)
    assert rows["eagle dynamic-3x3x8"]["tree"] == "dynamic-3x3x8" and rows["draft static-2x2"]["tree"] == "static-2x2"
    if head_kind == "eagle2":
        # This oracle head agrees with the target often; a 16-id map cannot propose most of what the target says.
        # The two rows share one head, so this also shows each ran with its own LM-head restriction.
        assert chain["acceptance_length"] > 1.5
        assert chain16["acceptance_length"] < chain["acceptance_length"]
    assert chain16["speedup_vs_drafter"] == pytest.approx(chain16["decode_tokens_per_s"] / chain["decode_tokens_per_s"])
    assert rows["eagle+fr-spec dynamic-3x3x8 map=64"]["speedup_vs_drafter"] == pytest.approx(
        rows["eagle+fr-spec dynamic-3x3x8 map=64"]["decode_tokens_per_s"] / rows["eagle dynamic-3x3x8"]["decode_tokens_per_s"])
    for label, row in rows.items():
        if label == VANILLA:
            continue
        assert 0 < row["lm_head_share"] < 1 and row["forward_ratio"] > 0
        # Steps that drafted (the last one of a prompt may have no room left to draft).
        assert row["target_forwards"] - len(prompts) <= sum(row["accepted_depth_histogram"]) <= row["target_forwards"]
    # Trees verify more nodes per step than their depth; chains exactly their depth (short near the budget's end).
    assert 2 < rows["eagle static-2x2"]["draft_tokens_per_step"] <= 6
    assert rows["eagle dynamic-3x3x8"]["draft_tokens_per_step"] <= 8
    assert rows["eagle chain-3"]["draft_tokens_per_step"] <= 3


def _head_dir(tmp_path, model_dir, name="head"):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    config, state = oracle_eagle2_checkpoint(model)
    return write_checkpoint(tmp_path / name, config, state, fmt="safetensors")


def _counts_file(tiny_dirs, tmp_path):
    path = tmp_path / "counts.safetensors"
    count_tokens(load_tokenizer(str(tiny_dirs[0])), CORPUS, vocab_size=VOCAB).save(path)
    return path


def _bench(tiny_dirs, tmp_path, *extra):
    target_dir, draft_dir = tiny_dirs
    threads = torch.get_num_threads()
    try:
        return main(["bench", "--target", str(target_dir), "--draft", str(draft_dir), "--dtype", "fp64",
                     "--threads", "1", "--num-prompts", "2", "--max-new-tokens", "10", "--num-spec-tokens", "2",
                     "--token-map-sizes", "16", "--counts", str(_counts_file(tiny_dirs, tmp_path)),
                     "--out", str(tmp_path / "out"), "--no-progress", *extra])
    finally:
        torch.set_num_threads(threads)


def test_cli_eagle_on_its_own_target_gets_its_own_table_and_vanilla(tiny_dirs, tmp_path, capsys):
    target_dir, draft_dir = tiny_dirs
    head = _head_dir(tmp_path, draft_dir)
    code = _bench(tiny_dirs, tmp_path, "--eagle", str(head), "--eagle-target", str(draft_dir),
                  "--tree-shapes", "chain-2,dynamic-3x2x4", "--eagle-token-map-sizes", "64",
                  "--draft-tree-shapes", "static-2x2")
    assert code == 0
    payload = json.loads((tmp_path / "out" / "results.json").read_text())
    labels = [(r["target"], r["label"]) for r in payload["rows"]]
    main_t, eagle_t = str(target_dir), str(draft_dir)
    assert labels == [
        (main_t, "vanilla"), (main_t, "draft k=2"), (main_t, "fr-spec k=2 map=16"),
        (main_t, "draft static-2x2"), (main_t, "fr-spec static-2x2 map=16"),
        (main_t, "fr-spec auto (maps <= 16 or none)"),
        (eagle_t, "vanilla"), (eagle_t, "eagle chain-2"), (eagle_t, "eagle+fr-spec chain-2 map=64"),
        (eagle_t, "eagle+fr-spec chain-2 map=auto (maps <= 64 or none)"),
        (eagle_t, "eagle dynamic-3x2x4"), (eagle_t, "eagle+fr-spec dynamic-3x2x4 map=64"),
        (eagle_t, "eagle+fr-spec dynamic-3x2x4 map=auto (maps <= 64 or none)"),
    ]
    assert all(r["greedy_identical"] in ("yes", "reference") for r in payload["rows"])
    # Speedups of EAGLE rows are against the EAGLE target's own vanilla.
    eagle_vanilla = payload["rows"][6]
    assert payload["rows"][7]["speedup_vs_vanilla"] == pytest.approx(
        payload["rows"][7]["decode_tokens_per_s"] / eagle_vanilla["decode_tokens_per_s"])
    # Each EAGLE auto row is judged against the best of the EAGLE target's vanilla and static EAGLE rows.
    eagle_rows = [r for r in payload["rows"] if r["target"] == eagle_t]
    auto = eagle_rows[3]
    best = max((r for r in eagle_rows if not r["auto"]), key=lambda r: r["decode_tokens_per_s"])
    assert auto["auto"] and auto["best_static"] == best["label"] and sum(auto["chosen_map_sizes"].values()) > 0
    meta = payload["meta"]
    assert meta["eagle_head"] == str(head) and meta["eagle_target"] == eagle_t
    assert [s["target"] for s in meta["sections"]] == [main_t, eagle_t]
    assert meta["sections"][1]["eagle_head_version"] == 2 and meta["sections"][1]["draft"] is None
    assert len(payload["generations"]) == 2 * 13
    assert {g["target"] for g in payload["generations"]} == {main_t, eagle_t}
    md = (tmp_path / "out" / "results.md").read_text()
    assert f"### Target `{eagle_t}`" in md and "| eagle+fr-spec | dynamic-3x2x4 | 3 | 64 |" in md
    out = capsys.readouterr().out
    assert out.count("frspec bench:") == 2 and "dynamic-3x2x4" in out  # one terminal table per target


def test_cli_default_head_on_the_main_target_shares_its_table(tiny_dirs, tmp_path, monkeypatch, capsys):
    target_dir, _ = tiny_dirs
    monkeypatch.setenv("FRSPEC_CACHE", str(tmp_path / "cache"))
    with pytest.raises(FrspecError, match="no trained default EAGLE head"):
        resolve_eagle_head("default")
    code = _bench(tiny_dirs, tmp_path, "--eagle", "default", "--eagle-target", str(target_dir), "--draft", "none",
                  "--tree-shapes", "static-2x2", "--eagle-token-map-sizes", "16")
    assert code == 2 and "no trained default EAGLE head" in capsys.readouterr().err

    head = _head_dir(tmp_path / "cache" / "heads", target_dir, DEFAULT_HEAD_NAME)
    assert resolve_eagle_head("default") == head
    code = _bench(tiny_dirs, tmp_path, "--eagle", "default", "--eagle-target", str(target_dir), "--draft", "none",
                  "--tree-shapes", "static-2x2", "--eagle-token-map-sizes", "16")
    assert code == 0
    payload = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["label"] for r in payload["rows"]] == ["vanilla", "eagle static-2x2", "eagle+fr-spec static-2x2 map=16",
                                                     "eagle+fr-spec static-2x2 map=auto (maps <= 16 or none)"]
    assert all(r["greedy_identical"] in ("yes", "reference") for r in payload["rows"])
    assert payload["meta"]["eagle_head_dir"] == str(head) and len(payload["meta"]["sections"]) == 1


def _misfit_head(tmp_path):
    """An EAGLE-2 head of hidden size 32 (the tiny targets have 48)."""
    return write_checkpoint(tmp_path / "misfit", head_config(32, VOCAB, 1), eagle2_tensors(32, VOCAB), "safetensors")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--eagle", "HEAD", "--tree-shapes", "tree-3"], "--tree-shapes: bad shape 'tree-3'"),
        (["--eagle", "HEAD", "--tree-shapes", "chain-2,chain-2"], "--tree-shapes has duplicates"),
        (["--eagle", "HEAD", "--tree-shapes", "static-9x9"], "limit 4096"),
        (["--eagle", "HEAD", "--tree-shapes", "dynamic-3x0x4"], "tree branching must be >= 1"),
        (["--draft-tree-shapes", "static-2"], "--draft-tree-shapes: bad shape"),
        (["--tree-shapes", "chain-2"], "--tree-shapes configures the EAGLE rows: give --eagle HEAD too"),
        (["--eagle", "MISFIT"], "does not fit the target"),
        (["--eagle", "nowhere/at/all"], "EAGLE head not found"),
        (["--eagle", "HEAD", "--eagle-token-map-sizes", "500"], "token-map size 500 exceeds"),
        (["--eagle", "HEAD", "--eagle-token-map-sizes", "0"], "--eagle-token-map-sizes values must be >= 1"),
    ],
)
def test_cli_bad_eagle_input_is_one_line_error(tiny_dirs, tmp_path, capsys, extra, message):
    target_dir, draft_dir = tiny_dirs
    paths = {"HEAD": str(_head_dir(tmp_path, draft_dir)), "MISFIT": str(_misfit_head(tmp_path))}
    extra = [paths.get(x, x) for x in extra]
    code = _bench(tiny_dirs, tmp_path, "--eagle-target", str(draft_dir), *extra) if "--eagle" in extra else \
        _bench(tiny_dirs, tmp_path, *extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and message in err[-1] and err[-1].startswith("frspec: error:")
    assert not any("Traceback" in line for line in err)
    assert not (tmp_path / "out" / "results.json").exists()


def test_cli_eagle_mtp_drafts_with_the_targets_own_mtp_layers(tiny_dirs, tmp_path, capsys):
    """`--eagle mtp`: the EAGLE rows draft with the MTP layers of the EAGLE target's checkpoint (a tiny MiMo here:
    dense, so it runs in the bench's fp64); greedy rows equal that target's vanilla row (the bench refuses
    divergences)."""
    from tests.bench.conftest import make_tokenizer
    from tests.decode.mtp_tiny import save_mtp_checkpoint

    mtp_dir = save_mtp_checkpoint(tmp_path / "mtp_target", "mimo", vocab=VOCAB)
    make_tokenizer().save_pretrained(mtp_dir)
    code = _bench(tiny_dirs, tmp_path, "--eagle", "mtp", "--eagle-target", str(mtp_dir), "--tree-shapes",
                  "chain-2,static-2x2", "--eagle-token-map-sizes", "64")
    assert code == 0, capsys.readouterr().err
    payload = json.loads((tmp_path / "out" / "results.json").read_text())
    rows = [r for r in payload["rows"] if r["target"] == str(mtp_dir)]
    labels = [r["label"] for r in rows]
    assert labels[0] == "vanilla" and "eagle chain-2" in labels and "eagle+fr-spec static-2x2 map=64" in labels


def test_cli_mtp_rows_are_labelled_mtp_and_equal_vanilla(tiny_dirs, tmp_path, capsys):
    """`--mtp`: rows drafted by the target checkpoint's own MTP layers (a tiny MiMo: dense, so it runs in the
    bench's fp64), labelled mtp / mtp+fr-spec, in the target's own table; greedy rows equal its vanilla row. Without
    --mtp the bench notes that the checkpoint carries MTP layers and stays as asked."""
    from tests.bench.conftest import make_tokenizer
    from tests.decode.mtp_tiny import save_mtp_checkpoint

    mtp_dir = save_mtp_checkpoint(tmp_path / "mtp_target", "mimo", vocab=VOCAB)
    make_tokenizer().save_pretrained(mtp_dir)
    code = _bench(tiny_dirs, tmp_path, "--target", str(mtp_dir), "--draft", "none")
    err = capsys.readouterr().err
    assert code == 0, err
    assert "carries 1 MTP layer(s) (mimo layout); --mtp adds rows drafted by them" in err
    payload = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["label"] for r in payload["rows"]] == ["vanilla"]

    code = _bench(tiny_dirs, tmp_path, "--target", str(mtp_dir), "--draft", "none", "--mtp", "--tree-shapes",
                  "chain-2,static-2x2", "--eagle-token-map-sizes", "64")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "--mtp adds rows" not in captured.err
    assert "MTP layers" in captured.out  # the terminal table's title names the drafter
    payload = json.loads((tmp_path / "out" / "results.json").read_text())
    rows = {r["label"]: r for r in payload["rows"]}
    assert list(rows) == [
        "vanilla", "mtp chain-2", "mtp+fr-spec chain-2 map=64", "mtp+fr-spec chain-2 map=auto (maps <= 64 or none)",
        "mtp static-2x2", "mtp+fr-spec static-2x2 map=64", "mtp+fr-spec static-2x2 map=auto (maps <= 64 or none)"]
    assert {r["target"] for r in payload["rows"]} == {str(mtp_dir)} and len(payload["meta"]["sections"]) == 1
    assert all(r["greedy_identical"] == "yes" for label, r in rows.items() if label != "vanilla")
    assert rows["mtp chain-2"]["method"] == "mtp" and rows["mtp+fr-spec static-2x2 map=64"]["method"] == "mtp+fr-spec"
    mapped, full = rows["mtp+fr-spec static-2x2 map=64"], rows["mtp static-2x2"]
    assert mapped["speedup_vs_drafter"] == pytest.approx(mapped["decode_tokens_per_s"] / full["decode_tokens_per_s"])
    md = (tmp_path / "out" / "results.md").read_text()
    assert "| mtp+fr-spec | static-2x2 | 2 | 64 |" in md
    assert f"- Drafter: the MTP layers of target `{mtp_dir}`" in md


def test_cli_bad_mtp_input_is_one_line_error(tiny_dirs, tmp_path, capsys):
    """--mtp with --eagle, with vLLM, or on a target without MTP layers: one line each, nothing written."""
    target_dir, draft_dir = tiny_dirs
    head = str(_head_dir(tmp_path, draft_dir))
    for extra, message in (
        (["--mtp", "--eagle", head], "give --mtp or --eagle HEAD, not both"),
        (["--mtp", "--engine", "vllm"], "MTP rows run on frspec's own engine"),
        (["--mtp", "--draft", "none"], "carries no MTP layers"),
    ):
        code = _bench(tiny_dirs, tmp_path, *extra)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and message in err[-1] and err[-1].startswith("frspec: error:"), (extra, err[-1:])
        assert not any("Traceback" in line for line in err)
        assert not (tmp_path / "out" / "results.json").exists()
