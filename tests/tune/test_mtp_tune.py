"""`frspec tune --mtp`: the MTP ranks per draft depth replay the engine's greedy acceptance exactly (fp64), the
replay by depth, and the CLI end to end on a tiny MiMo-layout checkpoint whose written config round-trips through
`generate --config` and `bench --config` with the target's own greedy output."""

from __future__ import annotations

import json

import pytest
import torch

from tests.decode.mtp_tiny import load_target, save_mtp_checkpoint
from tests.decode.spec_tiny import hf_greedy, tiny_tokenizer

from frspec.cli import main
from frspec.decode.decode_config import DecodeConfig
from frspec.decode.factory import build_generator
from frspec.decode.sampling import SamplingParams
from frspec.decode.stats import GenerationStats
from frspec.decode.tree_shape import TreeShape
from frspec.models.mtp import load_mtp_head
from frspec.tune.measure import reference_outputs
from frspec.tune.mtp_measure import mtp_base_costs, mtp_ranks, mtp_vocabs
from frspec.tune.predict import OUTSIDE, acceptance, replay
from frspec.vocab.token_map import TokenMap

VOCAB = 96
PROMPTS = ([5, 9, 13, 2, 7, 40, 3], [11, 4, 60, 8, 31])


def test_replay_by_depth_reads_each_depths_rank():
    # output 0 is the prefill's; at depth 1 every token is the top choice, at depth 2 none is
    ranks = [[9, 0, 0, 0, 0, 0], [9, 1, 1, 1, 1, 1]]
    assert replay(ranks, depth=2, by_depth=True)[:2] == (5, 3)  # steps at 1 and 3 accept 1 each; at 5 none fits
    assert replay(ranks, depth=2, branching=2, by_depth=True)[:2] == (5, 2)  # branching 2 takes rank 1 too
    # depth 3 has no ranks recorded: OUTSIDE (the step at 1 accepts 2; the one at 4 drafts the 1 that fits)
    assert replay(ranks, depth=3, branching=2, by_depth=True)[2:] == ([2, 1, 1], [2, 1, 0])
    assert replay(ranks[0], depth=2)[:2] == (5, 2)  # a draft model's ranks serve every depth


@pytest.fixture(scope="module")
def mimo(tmp_path_factory):
    root = save_mtp_checkpoint(tmp_path_factory.mktemp("mtp_tune") / "mimo", "mimo", vocab=VOCAB)
    tiny_tokenizer().save_pretrained(root)
    return root


# MiMo (dense attention); MiMo whose MTP layer leans on the target's hidden state (input-projection noise 0.5), so
# its choices below the root differ from depth 1's where it matters; and Qwen3.5 (a hybrid target: the engine's
# hidden states come from per-node verification, tune's from one forward). The MoE families cannot run in fp64
# (transformers' grouped matmul).
REPLAY_CASES = {
    "mimo": ("mimo", 0.1, (TreeShape.chain(1), TreeShape.chain(3), TreeShape.chain(4), TreeShape.static(2, 2),
                           TreeShape.static(3, 2))),
    "mimo-noisy": ("mimo", 0.5, (TreeShape.chain(3), TreeShape.static(3, 2))),
    "qwen3_5": ("qwen3_5", 0.1, (TreeShape.chain(3), TreeShape.static(3, 2))),
}


@pytest.mark.parametrize("case", list(REPLAY_CASES))
def test_mtp_ranks_replay_the_engines_acceptance_in_fp64(mimo, tmp_path, case):
    """Per-depth ranks from batched teacher-forced MTP forwards give, replayed, exactly the tokens per step the
    engine's MtpDrafter reaches: chains (recursive below the root) and static trees, with and without a map. On the
    noisy MiMo, replaying depth 1's ranks at every depth (a draft model's replay) does not: the control."""
    family, noise, shapes = REPLAY_CASES[case]
    root = mimo if case == "mimo" else save_mtp_checkpoint(tmp_path / case, family, vocab=VOCAB, noise=noise)
    target = load_target(root, dtype=torch.float64)
    head = load_mtp_head(target, root)
    token_map = TokenMap(list(range(0, VOCAB, 2)) + list(range(1, VOCAB // 2, 2)), VOCAB)
    outputs, _ = reference_outputs(target, None, PROMPTS, 24)
    ranks = mtp_ranks(target, head, mtp_vocabs(head, {72: token_map}), list(zip(PROMPTS, outputs)), 4)
    assert all(len(r) == 4 and all(len(d) == 24 for d in r) for r in ranks[None])
    depth_one_differs = False
    for key, tm in ((None, None), (72, token_map)):
        for shape in shapes:
            gen = build_generator(target, None, tm, eagle=head, tree=shape)
            runs = [gen.generate(input_ids=torch.tensor([p]), max_new_tokens=24, sampling=SamplingParams())
                    for p in PROMPTS]
            assert [list(r.token_ids) for r in runs] == outputs
            engine = GenerationStats.aggregate(r.stats for r in runs)
            per_step, _ = acceptance(ranks[key], shape, by_depth=True)
            assert per_step == pytest.approx(engine.acceptance_length), (key, str(shape))
            assert 1.0 < per_step < shape.depth + 1  # drafts both accepted and rejected
            depth_one = acceptance([[r[0]] * 4 for r in ranks[key]], shape, by_depth=True)[0]
            depth_one_differs |= depth_one != pytest.approx(engine.acceptance_length)
    if case == "mimo-noisy":
        assert depth_one_differs


def test_mtp_base_costs_cover_every_width(mimo):
    target = load_target(mimo)
    costs = mtp_base_costs(load_mtp_head(target, mimo), [1, 2, 4], context=10, rounds=1)
    assert sorted(costs) == [1, 2, 4] and all(c > 0 for c in costs.values())


@pytest.fixture(scope="module")
def deep_mimo(tmp_path_factory):
    """A MiMo-layout target 8 layers deep with one MTP layer, so drafting with it pays even on a tiny model."""
    root = save_mtp_checkpoint(tmp_path_factory.mktemp("mtp_tune_cli") / "mimo", "mimo", vocab=VOCAB, layers=8)
    tiny_tokenizer().save_pretrained(root)
    TokenMap(list(range(0, VOCAB, 2)) + list(range(1, VOCAB // 2, 2)), VOCAB).save(root.parent / "map72.frspec")
    return root


def _json_run(argv, capsys) -> dict:
    code = main(argv)
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_cli_tune_mtp_config_round_trips_through_generate_and_bench(deep_mimo, tmp_path, capsys, monkeypatch):
    """`frspec tune` on a target carrying MTP layers (no --draft: detected) tunes them, writes an "mtp" config, and
    `generate --config` / `bench --config` reproduce its pick with the target's own greedy output.

    On tiny models on a shared CPU vanilla sometimes measures fastest and the config would then draft nothing; the
    pick is made among the drafting configurations here (everything else is the command's own path)."""
    from frspec.tune import search

    real_pick = search.pick_fastest
    monkeypatch.setattr(search, "pick_fastest",
                        lambda confirmed, measured: real_pick([c for c in confirmed if c.shape is not None], measured))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ("the cat sat on", "a dog ran to")))
    out, report = tmp_path / "cfg" / "tune.json", tmp_path / "report"
    code = main(["tune", "--target", str(deep_mimo), "--dataset", str(prompts), "--dtype", "fp32", "--threads", "1",
                 "--token-map", str(deep_mimo.parent / "map72.frspec"), "--num-prompts", "2", "--max-new-tokens",
                 "16", "--confirm-prompts", "2", "--confirm-tokens", "12", "--top", "2", "--out", str(out),
                 "--report", str(report), "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "MTP layer(s) (mimo layout): tuning them as the drafter" in captured.err
    details = json.loads((report / "tune.json").read_text())
    assert details["meta"]["draft"].startswith("mtp (mimo layout")
    ranks = details["measurements"]["ranks"]
    assert set(ranks) == {"full", "72"} and all(len(per_prompt) == 5 for per_prompt in ranks["full"])  # depths 1..5
    rows = details["comparison"]
    assert any(r["config"] == "vanilla" for r in rows) and any(r["tree"] and r["map_size"] is None for r in rows)
    assert not [n for n in details["notes"] if "differs from vanilla" in n]  # the confirming bench checked greedy
    config = DecodeConfig.load(out)
    picked = next(r for r in rows if r["picked"])
    assert (config.tree, config.token_map_size) == (picked["tree"], picked["map_size"])
    assert picked["measured_tokens_per_s"] == max(r["measured_tokens_per_s"] for r in rows if r["tree"])
    assert config.mtp and config.draft is None and json.loads(out.read_text())["mtp"] is True

    base = ["generate", "--prompt", "the cat sat on", "--raw", "--max-new-tokens", "20", "--json", "--threads", "1"]
    vanilla = _json_run([*base, "--target", str(deep_mimo), "--dtype", "fp32"], capsys)
    tuned = _json_run([*base, "--config", str(out)], capsys)
    assert tuned["method"] == ("mtp" if config.token_map_size is None else "mtp+fr-spec")
    assert tuned["token_ids"] == vanilla["token_ids"]
    shape = TreeShape.parse(config.tree)
    assert tuned["stats"]["proposed_per_position"] and len(tuned["stats"]["proposed_per_position"]) == shape.depth

    assert main(["bench", "--config", str(out), "--dataset", str(prompts), "--num-prompts", "2", "--max-new-tokens",
                 "8", "--threads", "1", "--no-progress", "--out", str(tmp_path / "bench")]) == 0
    rows = json.loads((tmp_path / "bench" / "results.json").read_text())["rows"]
    want = ["vanilla", f"mtp {config.tree}"] + ([f"mtp+fr-spec {config.tree} map=72"] if config.token_map_size else [])
    assert [r["label"] for r in rows] == want
    assert all(r["greedy_identical"] in ("yes", "reference") for r in rows)


def test_written_mtp_config_reads_back_and_refuses_a_draft_too(tmp_path):
    config = DecodeConfig(target="t", mtp=True, tree="chain-3").save(tmp_path / "c.json")
    assert DecodeConfig.load(config).mtp and "mtp" in json.loads(config.read_text())
    assert "mtp" not in DecodeConfig(target="t", draft="d", tree="chain-3").to_dict()  # only written when true
    from frspec.errors import FrspecError

    with pytest.raises(FrspecError, match="'draft' must be null"):
        DecodeConfig(target="t", draft="d", mtp=True, tree="chain-3")
    with pytest.raises(FrspecError, match="'tree' is set exactly"):
        DecodeConfig(target="t", mtp=True)
    from frspec.bench.plan import plan_bench

    mtp_config = DecodeConfig.load(config)
    plan = plan_bench(quick=True, target="t", draft="none", config=mtp_config)
    assert plan.mtp and plan.eagle_tree_shapes == () and plan.eagle_token_map_sizes == ()  # only the config's rows
    with pytest.raises(FrspecError, match="drop --eagle HEAD"):
        plan_bench(quick=True, target="t", draft="none", eagle="some-head", config=mtp_config)


def test_cli_tune_mtp_bad_input_is_one_line(mimo, tmp_path, capsys):
    from tests.decode.spec_tiny import tiny_lm

    code = main(["tune", "--target", str(mimo), "--mtp", "--draft", str(mimo), "--out", str(tmp_path / "t.json")])
    assert code == 2 and "without --draft" in capsys.readouterr().err
    plain = tmp_path / "plain"
    tiny_lm("qwen2", VOCAB, dtype=torch.float32).save_pretrained(plain)
    tiny_tokenizer().save_pretrained(plain)
    code = main(["tune", "--target", str(plain), "--mtp", "--dtype", "fp32", "--num-prompts", "1", "--threads", "1",
                 "--out", str(tmp_path / "t.json")])
    err = capsys.readouterr().err
    assert code == 2 and "carries no MTP layers" in err and "Traceback" not in err
    assert not (tmp_path / "t.json").exists()
