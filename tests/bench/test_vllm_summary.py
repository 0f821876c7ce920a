"""vLLM's rows (bench/vllm_runner.py) are checked and summarized by the same code as frspec's engine's
(bench/divergence.py, bench/summary.py): a method is compared with vanilla of the same round and batch size, and
its greedy identity and speedups are those of the rows of its batch size. Recorded runs, no vLLM needed."""

import pytest
import torch

from frspec.bench.divergence import top2_margin
from frspec.bench.methods import DRAFT, FRSPEC, VANILLA, Method
from frspec.decode.tree_shape import TreeShape
from frspec.bench.vllm_runner import Batch, EngineRun, divergence_dict, summarize, vllm_divergences
from tests.decode.spec_tiny import tiny_lm

VAN = Method(VANILLA)
DR, FR = Method.drafting(DRAFT, TreeShape.chain(2)), Method.drafting(FRSPEC, TreeShape.chain(2), 64)
PROMPTS = {"a": [1, 2, 3], "b": [4, 5]}


def _run(method, round_, outputs_b1, outputs_b2, wall_s):
    """One engine's batches: each prompt alone (batch size 1), then both together (batch size 2)."""
    run = EngineRun(method, round_, startup_s=1.0, drafter_rows=None)
    for pid in PROMPTS:
        run.batches.append(Batch(method, round_, 1, [pid], [outputs_b1[pid]], wall_s, [wall_s], 4, 6))
    run.batches.append(Batch(method, round_, 2, list(PROMPTS), [outputs_b2[p] for p in PROMPTS], wall_s, [wall_s] * 2,
                             4, 6))
    return run


def test_vllm_divergences_match_round_and_batch_size_and_use_the_targets_margin(tmp_path):
    same = {"a": [7, 8, 9], "b": [7, 8]}
    runs = [_run(VAN, 0, same, same, 1.0),
            _run(DR, 0, same, {"a": [7, 8, 9], "b": [7, 6]}, 0.5),   # differs at batch size 2 only
            _run(FR, 0, {"a": [7, 1, 9], "b": [7, 8]}, same, 0.25)]  # differs at batch size 1 only
    target = tiny_lm(vocab_size=16, dtype=torch.float32)
    target.save_pretrained(tmp_path / "t")
    found = vllm_divergences(runs, PROMPTS, str(tmp_path / "t"), "fp32")
    assert [(d.method, d.batch_size, d.round, d.prompt_id, d.position) for d in found] == [
        (DR, 2, 0, "b", 1), (FR, 1, 0, "a", 1)]
    assert found[0].top2_margin == pytest.approx(top2_margin(target, [4, 5, 7]), abs=1e-4)
    assert list(divergence_dict(found[0])) == ["method", "batch_size", "round", "prompt_id", "position",
                                               "vanilla_token", "method_token", "top2_margin"]

    rows = {(r["label"], r["batch_size"]): r for r in summarize(runs, [VAN, DR, FR], (1, 2), found)}
    assert rows[("vanilla", 1)]["greedy_identical"] == "reference"
    assert rows[("draft k=2", 1)]["greedy_identical"] == "yes"
    assert rows[("draft k=2", 2)]["greedy_identical"] == "1 differ"
    assert rows[("fr-spec k=2 map=64", 1)]["greedy_identical"] == "1 differ"
    assert rows[("fr-spec k=2 map=64", 2)]["greedy_identical"] == "yes"
    # 5 tokens in 2 x 1.0 s (vanilla, batch 1) vs 2 x 0.5 s (draft) and 2 x 0.25 s (fr-spec).
    assert rows[("draft k=2", 1)]["speedup_vs_vanilla"] == pytest.approx(2.0)
    assert rows[("fr-spec k=2 map=64", 1)]["speedup_vs_vanilla"] == pytest.approx(4.0)
    assert rows[("fr-spec k=2 map=64", 1)]["speedup_vs_drafter"] == pytest.approx(2.0)
    assert rows[("vanilla", 2)]["speedup_vs_vanilla"] is None and rows[("draft k=2", 2)]["speedup_vs_drafter"] is None
    assert rows[("draft k=2", 1)]["acceptance_length"] == pytest.approx(1 + 6 / 4)
