"""`frspec bench --engine vllm` end to end on tiny models: vanilla, draft and FR-Spec engines at two batch sizes,
greedy identity against vanilla vLLM, FR-Spec active in the engine that has the map and only there."""

import json

from frspec.cli import main


def test_vllm_bench_runs_every_method_at_every_batch_size(tiny, tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")  # vLLM's own processes, as users run it
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("hello there", "abc def", "why?")))
    out = tmp_path / "out"
    argv = ["bench", "--engine", "vllm", "--target", tiny.target, "--draft", tiny.draft, "--dataset", str(prompts),
            "--num-prompts", "3", "--max-new-tokens", "10", "--num-spec-tokens", "2", "--token-map", tiny.token_map,
            "--batch-sizes", "1,2", "--repeats", "1", "--dtype", "fp32", "--warmup-tokens", "2", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    rows = {(r["label"], r["batch_size"]): r for r in result["rows"]}
    assert set(rows) == {(m, b) for m in ("vanilla", "draft k=2", "fr-spec k=2 map=40") for b in (1, 2)}
    for b in (1, 2):
        assert rows[("fr-spec k=2 map=40", b)]["greedy_identical"] == "yes"
        assert rows[("draft k=2", b)]["greedy_identical"] == "yes"
        assert rows[("fr-spec k=2 map=40", b)]["drafter_rows"] == [40]
        assert rows[("draft k=2", b)]["drafter_rows"] is None
        assert rows[("fr-spec k=2 map=40", b)]["speedup_vs_drafter"] > 0
    assert result["divergences"] == []
    assert "| fr-spec | 2 | 40 | 2 |" in (out / "results.md").read_text()
