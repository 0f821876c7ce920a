"""FR-Spec under tensor parallelism (TP=2 on the CPU build, each rank bound to one core): every rank keeps only the
map rows of its own vocabulary shard, the gathered logits equal a one-rank pruned head, and greedy outputs equal
the target's own."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from frspec.vocab.draft_vocab import DraftVocab
from frspec.vocab.token_map import TokenMap

from tests.vllm.vllm_tiny import PROMPTS, VOCAB, hf_greedy

# Map ids on both ranks' shards: vLLM pads the 96-row head to 128 and gives rank 0 rows [0, 64), rank 1 [64, 96).
MAP_IDS = list(range(4, 44)) + [90, 70, 81]


@pytest.fixture(scope="module")
def tp_run(tiny):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("TP=2 on the CPU build binds each rank to its own core; this machine has one")
    token_map = Path(tiny.root) / "map-tp.safetensors"
    TokenMap(MAP_IDS, VOCAB).save(token_map)
    out, log = Path(tiny.root) / "tp.json", Path(tiny.root) / "tp.log"
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env.update(FRSPEC_TOKEN_MAP=str(token_map), VLLM_CPU_OMP_THREADS_BIND="0|1", VLLM_ALLOW_INSECURE_SERIALIZATION="1")
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, str(Path(__file__).parent / "tp_probe.py"), tiny.target, tiny.draft,
                               json.dumps(PROMPTS), str(out)], env=env, stdout=f, stderr=subprocess.STDOUT, timeout=600)
    assert proc.returncode == 0, log.read_text()[-3000:]
    return json.loads(out.read_text()), log.read_text()


def test_each_rank_keeps_the_map_rows_of_its_own_shard(tp_run):
    result, log = tp_run
    assert [r["rank_rows"] for r in result["ranks"]] == [40, 3]
    assert "this rank: 40 LM-head rows" in log and "this rank: 3 LM-head rows" in log


def test_gathered_logits_equal_the_one_rank_pruned_head(tp_run, tiny):
    result, _ = tp_run
    weight = load_file(f"{tiny.draft}/model.safetensors")["lm_head.weight"]
    one_rank = DraftVocab.build(weight, token_map=TokenMap(MAP_IDS, VOCAB))
    expected = one_rank.logits(torch.tensor(result["hidden"]))
    for rank in result["ranks"]:
        assert rank["target_ids"] == MAP_IDS
        torch.testing.assert_close(torch.tensor(rank["gathered"]), expected, rtol=1e-5, atol=1e-5)


def test_greedy_outputs_equal_the_target_alone(tp_run, tiny):
    result, _ = tp_run
    assert result["outputs"] == hf_greedy(tiny.target, PROMPTS, 16)
