"""`frspec bench --engine vllm` end to end on tiny models: vanilla, draft and FR-Spec engines at two batch sizes,
greedy identity against vanilla vLLM, FR-Spec active in the engine that has the map and only there. The engines run
in this process (conftest.py), one after another as the bench starts them, so an engine with the map follows engines
without it in the same process (the plugin must still be active there); vLLM's own processes are test_serve.py's."""

import json

import pytest

from frspec.bench.vllm_runner import vllm_eagle_method
from frspec.cli import main


def test_vllm_bench_runs_every_method_at_every_batch_size(tiny, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("hello there", "abc def", "why?")))
    out = tmp_path / "out"
    argv = ["bench", "--engine", "vllm", "--target", tiny.target, "--draft", tiny.draft, "--dataset", str(prompts),
            "--num-prompts", "3", "--max-new-tokens", "10", "--num-spec-tokens", "2", "--token-map", tiny.token_map,
            "--batch-sizes", "1,2", "--repeats", "1", "--dtype", "fp32", "--warmup-tokens", "2", "--out", str(out),
            "--vllm-full-row"]
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    rows = {(r["label"], r["batch_size"]): r for r in result["rows"]}
    labels = ("vanilla", "draft k=2", "fr-spec k=2 map=40", "fr-spec k=2 map=40 full-row")
    auto = "fr-spec chain-2 map=auto (maps <= 40 or none)"  # the plugin's map size per batch step, ranked by the map
    assert set(rows) == {(m, b) for m in labels + (auto,) for b in (1, 2)}
    for b in (1, 2):
        for label in labels[2:]:
            assert rows[(label, b)]["greedy_identical"] == "yes"
            assert rows[(label, b)]["drafter_rows"] == [40]
            assert rows[(label, b)]["speedup_vs_drafter"] > 0
        assert rows[("draft k=2", b)]["greedy_identical"] == "yes"
        assert rows[("draft k=2", b)]["drafter_rows"] is None
        # --vllm-full-row: the same map applied both ways on V1, each reported with the way it took.
        assert rows[("fr-spec k=2 map=40", b)]["drafter_path"] == "compact"
        assert rows[("fr-spec k=2 map=40 full-row", b)]["drafter_path"] == "full-row"
        assert rows[("fr-spec k=2 map=40 full-row", b)]["full_row_vs_compact"] > 0
        assert rows[(auto, b)]["greedy_identical"] == "yes" and rows[(auto, b)]["auto_vs_best_static"] > 0
        chosen = rows[(auto, b)]["chosen_map_sizes"]
        assert chosen and {int(k) for k in chosen} <= {12, 24, 40, 96} and sum(chosen.values()) > 0
    assert result["divergences"] == []
    text = (out / "results.md").read_text()
    assert "| fr-spec | 2 | 40 | 2 |" in text and "| fr-spec full-row | 2 | 40 | 2 |" in text
    assert "Full Row vs Compact" in text and "Auto vs Best Static (same length)" in text


def test_vllm_bench_picks_the_method_of_the_eagle_heads_layout(tiny):
    assert vllm_eagle_method(tiny.eagle_head) == "eagle"
    assert vllm_eagle_method(tiny.eagle3_head) == "eagle3"


def test_vllm_bench_eagle_rows_with_and_without_the_map(tiny, tmp_path):
    """--eagle HEAD: vLLM's eagle3 method over the full vocabulary and with the map (whose rows are the map's
    intersection with the head's d2t), on the head's target, each greedy-identical to vanilla vLLM; three prompts
    repeated to fill a batch of 4. An EAGLE-1/2 head takes the same bench path under vLLM's "eagle" method (the test
    above); its engine, with and without the map, is tests/vllm/test_eagle.py's and test_compiled.py's."""
    head, method, kept = "eagle3_head", "eagle3", 20
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("hello there", "abc def", "why?")))
    out = tmp_path / "out"
    argv = ["bench", "--engine", "vllm", "--target", tiny.eagle_target, "--draft", "none",
            "--eagle", getattr(tiny, head), "--dataset", str(prompts), "--num-prompts", "3", "--max-new-tokens", "12",
            "--num-spec-tokens", "2", "--token-map", tiny.token_map, "--batch-sizes", "1,4", "--repeats", "1",
            "--dtype", "fp32", "--warmup-tokens", "2", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["meta"]["eagle_method"] == method
    assert result["meta"]["distinct_prompts"] == 3 and result["meta"]["prompt_ids"][3].endswith("#2")
    rows = {(r["label"], r["batch_size"]): r for r in result["rows"]}
    labels = ("vanilla", "eagle chain-2", "eagle+fr-spec chain-2 map=40")
    assert set(rows) == {(m, b) for m in labels for b in (1, 4)}
    for b in (1, 4):
        assert rows[("eagle chain-2", b)]["greedy_identical"] == "yes"
        assert rows[("eagle+fr-spec chain-2 map=40", b)]["greedy_identical"] == "yes"
        assert rows[("eagle chain-2", b)]["drafter_rows"] is None
        assert rows[("eagle+fr-spec chain-2 map=40", b)]["drafter_rows"] == [kept]  # eagle3: map ∩ d2t
        assert rows[("eagle+fr-spec chain-2 map=40", b)]["drafts"] > 0
    generated = [len(t) for g in result["generations"] for t in g["token_ids"]]
    # Batch 1 decodes the 3 distinct prompts; batch 4 the 3 cycled up to one whole batch.
    assert len(generated) == 3 * (3 + 4) and sum(generated) > 3 * (3 + 4) * 2  # not just EOS at once
    assert result["divergences"] == []


def test_vllm_bench_refuses_eagle_tree_shapes(tiny, capsys):
    argv = ["bench", "--engine", "vllm", "--target", tiny.eagle_target, "--draft", "none", "--eagle", tiny.eagle_head,
            "--tree-shapes", "static-3x2", "--token-map", tiny.token_map, "--dtype", "fp32"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "chains only" in err and "static-3x2" in err and "\n" not in err
