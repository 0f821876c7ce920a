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


def test_mtp_ranks_replay_the_engines_acceptance_in_fp64(mimo):
    """Per-depth ranks from batched teacher-forced MTP forwards give, replayed, exactly the tokens per step the
    engine's MtpDrafter reaches: chains (recursive below the root) and static trees, with and without a map."""
    target = load_target(mimo, dtype=torch.float64)
    head = load_mtp_head(target, mimo)
    token_map = TokenMap(list(range(0, VOCAB, 2)) + list(range(1, VOCAB // 2, 2)), VOCAB)
    outputs, _ = reference_outputs(target, None, PROMPTS, 24)
    ranks = mtp_ranks(target, head, mtp_vocabs(head, {72: token_map}), list(zip(PROMPTS, outputs)), 4)
    assert all(len(r) == 4 and all(len(d) == 24 for d in r) for r in ranks[None])
    # the depths differ (recursive MTP reads its own features below the root), or replaying by depth tests nothing
    assert any(r[0] != r[1] for r in ranks[None])
    for key, tm in ((None, None), (72, token_map)):
        for shape in (TreeShape.chain(1), TreeShape.chain(3), TreeShape.chain(4), TreeShape.static(2, 2),
                      TreeShape.static(3, 2)):
            gen = build_generator(target, None, tm, shape.depth, eagle=head,
                                  tree=None if shape.kind == "chain" else shape)
            runs = [gen.generate(input_ids=torch.tensor([p]), max_new_tokens=24, sampling=SamplingParams())
                    for p in PROMPTS]
            assert [list(r.token_ids) for r in runs] == outputs
            engine = GenerationStats.aggregate(r.stats for r in runs)
            per_step, _ = acceptance(ranks[key], shape, by_depth=True)
            assert per_step == pytest.approx(engine.acceptance_length), (key, str(shape))
            assert 1.0 < per_step < shape.depth + 1  # drafts both accepted and rejected


def test_mtp_base_costs_cover_every_width(mimo):
    target = load_target(mimo)
    costs = mtp_base_costs(load_mtp_head(target, mimo), [1, 2, 4], context=10, rounds=1)
    assert sorted(costs) == [1, 2, 4] and all(c > 0 for c in costs.values())
