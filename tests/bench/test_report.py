import csv
import json

import pytest
import torch

from frspec.bench import report
from frspec.bench.report import COLUMNS, format_value, markdown_table, render_table, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _row(method, k=None, size=None, tps=10.0, greedy="yes", tree=None):
    tree = tree or (f"chain-{k}" if k else None)
    label = {"vanilla": "vanilla", "draft": f"draft k={k}", "fr-spec": f"fr-spec k={k} map={size}",
             "eagle": f"eagle {tree}", "eagle+fr-spec": f"eagle+fr-spec {tree} map={size}"}[method]
    spec = method != "vanilla"
    return {
        "label": label, "method": method, "tree": tree, "num_spec_tokens": k, "token_map_size": size,
        "acceptance_length": 2.5 if spec else 1.0, "decode_tokens_per_s": tps, "total_time_s": 12.345,
        "end_to_end_tokens_per_s": 96 / 12.345,
        "forward_ratio": 0.31 if spec else None, "speedup_vs_vanilla": tps / 10.0 if spec else None,
        "speedup_vs_drafter": 1.1 if method.endswith("fr-spec") else None, "lm_head_share": 0.25 if spec else None,
        "greedy_identical": greedy if spec else "reference", "tokens": 96,
    }


def _payload():
    rows = [_row("vanilla"), _row("draft", 3, tps=15.0), _row("fr-spec", 3, 8, tps=17.0, greedy="1 differ"),
            _row("fr-spec", 3, 32, tps=16.0), _row("draft", 1, tps=12.0), _row("fr-spec", 1, 8, tps=13.0)]
    meta = {"commit": "abc123", "target": "t", "draft": "d", "dtype": "bfloat16", "threads": 2,
            "machine": {"cpu": "Some CPU", "cores": 2, "platform": "Linux"}, "num_prompts": 2, "dataset": "mtbench",
            "max_new_tokens": 16, "decoding": "greedy", "vocab_size": 64, "run_time_s": 3.0, "warmup_time_s": 1.0}
    divergences = [{"method": "fr-spec k=3 map=8", "prompt_id": "p1", "position": 5, "vanilla_token": 7,
                    "method_token": 9, "top2_margin": 0.0625}]
    return {"meta": meta, "rows": rows, "divergences": divergences}


def test_write_report_produces_json_csv_markdown_and_plots(tmp_path):
    payload = _payload()
    written = write_report(tmp_path / "out", payload)
    names = sorted(p.name for p in written)
    assert names == ["acceptance_vs_map_size.png", "results.csv", "results.json", "results.md",
                     "throughput_vs_map_size.png"]
    out = tmp_path / "out"
    assert json.loads((out / "results.json").read_text()) == payload
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["label"] for r in rows] == [r["label"] for r in payload["rows"]]
    assert list(rows[0])[: len(COLUMNS)] == [k for k, _ in COLUMNS]
    assert float(rows[2]["decode_tokens_per_s"]) == 17.0 and rows[0]["forward_ratio"] == ""
    md = (out / "results.md").read_text()
    for _, title in report.columns_for(payload["rows"]):  # optional columns no row fills are left out
        assert title in md
    assert "abc123" in md and "Some CPU" in md and "0.0625" in md and "1 differ" in md
    assert "![throughput_vs_map_size.png](throughput_vs_map_size.png)" in md
    for png in ("throughput_vs_map_size.png", "acceptance_vs_map_size.png"):
        data = (out / png).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
    assert not list(out.glob(".*"))  # no temp files left behind


def test_a_quantized_runs_report_names_its_weights():
    payload = _payload()
    assert "Weights:" not in report.markdown_report(payload)  # --dtype weights: the dtype line says it all
    payload["meta"].update(quant="int4", draft_quant="int8")
    assert "- Weights: target int4, draft int8 (activations bfloat16)" in report.markdown_report(payload)


def test_a_report_says_when_eos_was_ignored():
    payload = _payload()
    assert "EOS ignored" not in report.markdown_report(payload)
    payload["meta"]["ignore_eos"] = True
    assert "(EOS ignored: every answer runs to it)" in report.markdown_report(payload)


def test_a_report_names_the_kernels_its_process_chose_for_half_precision_calls(monkeypatch):
    # They are measured once per process (models/wide_linear.py, models/one_row_linear.py): a mis-measurement
    # slows every forward of a run, and the machine line shows it.
    from frspec.bench.environment import machine_info
    from frspec.models import one_row_linear, wide_linear

    monkeypatch.setattr(wide_linear, "fp32_is_faster", lambda dtype: True)
    monkeypatch.setattr(one_row_linear, "native_is_faster", lambda dtype: False)
    payload = _payload()
    assert "through fp32" not in report.markdown_report(payload)
    payload["meta"]["machine"] = machine_info(torch.bfloat16)
    assert (f"; bfloat16 calls through fp32: from {wide_linear.WIDE_ROWS} rows, one-row calls on PyTorch's kernel: no"
            in report.markdown_report(payload))
    monkeypatch.setattr(wide_linear, "fp32_is_faster", lambda dtype: False)
    payload["meta"]["machine"] = machine_info(torch.bfloat16)
    assert "; bfloat16 calls through fp32: never, one-row" in report.markdown_report(payload)
    assert "half_kernels" not in machine_info(torch.float32) and "half_kernels" not in machine_info()


def test_an_auto_rows_report_names_the_step_costs_it_chose_by():
    """The costs an auto row chose by (cached from an earlier measurement, or measured for the run) are in the
    report: a drifted cached table is visible next to the choices it led to."""
    from frspec.decode.step_costs import StepCosts

    costs = StepCosts({1: 0.106, 2: 0.087, 4: 0.123, 7: 0.226}, {1: 0.031}, {32768: {1: 0.004}}, full_size=151936,
                      context=128)
    costs.provenance["measured_at"] = "2026-12-04T13:51:58Z"
    payload = _payload()
    assert "chose by" not in report.markdown_report(payload)
    payload["meta"]["sections"] = [{"target": "t", "controller_costs": {"fr-spec auto": costs.to_dict()}}]
    line = next(x for x in report.markdown_report(payload).splitlines() if "chose by" in x)
    assert line == ("- `fr-spec auto` chose by step costs measured 2026-12-04T13:51:58Z: the target's forward after "
                    "128 tokens 1 row 106 ms, 2 rows 87 ms, 4 rows 123 ms; the drafter's step 31 ms (all of them: "
                    "`controller_costs` in results.json)")
    # Rescaled during the run from the forwards the engine timed (decode/cost_calibration.py): said, with how much.
    costs.provenance["recalibrated"] = {"target_forwards": 180, "draft_steps": 150,
                                        "target_scales": {"1": 0.81, "3": 0.76}, "draft_scale": 0.97}
    payload["meta"]["sections"] = [{"target": "t", "controller_costs": {"fr-spec auto": costs.to_dict()}}]
    line = next(x for x in report.markdown_report(payload).splitlines() if "chose by" in x)
    assert ("31 ms, rescaled by the run's end from the engine's timed forwards: the target x0.81 at 1 row, x0.76 at "
            "3 rows (the last 180 forwards kept), drafting x0.97 (the last 150 steps) (all of them") in line


def test_vanilla_only_report_has_no_plots(tmp_path):
    payload = _payload()
    payload["rows"] = payload["rows"][:1]
    names = sorted(p.name for p in write_report(tmp_path, payload))
    assert names == ["results.csv", "results.json", "results.md"]


def test_failed_write_keeps_previous_file_and_leaves_no_temp(tmp_path, monkeypatch):
    payload = _payload()
    write_report(tmp_path, payload)
    before = (tmp_path / "results.md").read_text()

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(report, "markdown_report", boom)
    with pytest.raises(RuntimeError):
        write_report(tmp_path, payload)
    assert (tmp_path / "results.md").read_text() == before
    assert not list(tmp_path.glob(".*"))


def test_table_formatting(capsys):
    assert format_value("speedup_vs_vanilla", 1.234) == "1.23x"
    assert format_value("lm_head_share", 0.256) == "25.6%"
    assert format_value("forward_ratio", None) == "-"
    assert format_value("drafter_prefills", {"whole": 3, "window": 2, "none": 0}) == "whole:3 window:2"
    assert format_value("decode_tokens_per_s", 123.456) == "123.5"
    md = markdown_table(_payload()["rows"])
    assert md.count("\n") == 1 + 6 and (
        "| fr-spec | chain-3 | 3 | 8 | 2.50 | 17.00 | 12.35 | 7.78 | 0.31 | 1.70x | 1.10x | 25.0% | 1 differ |") in md
    from rich.console import Console

    console = Console(width=250, force_terminal=False)
    render_table(_payload()["rows"], console=console)
    out = capsys.readouterr().out
    assert "Decoding" in out and "Throughput" in out and "1 differ" in out
    assert "│ fr-spec │ chain-3 │        3 │        32 │       2.50 │      16.00 │" in out


def _eagle_payload():
    """A main table (1.5B-like target) and an EAGLE table on its own target, as `frspec bench --eagle` writes."""
    payload = _payload()
    main = [{"target": "big", **r} for r in payload["rows"][:3]]
    eagle = [{"target": "small", **r} for r in [
        _row("vanilla", tps=20.0), _row("eagle", 4, tps=30.0), _row("eagle+fr-spec", 4, 32, tps=33.0),
        _row("eagle", 5, tps=35.0, tree="dynamic-5x4x16"),
        _row("eagle+fr-spec", 5, 32, tps=36.0, tree="dynamic-5x4x16", greedy="2 differ")]]
    payload["rows"] = main + eagle
    payload["meta"].update(
        eagle_head="default", eagle_target="small",
        sections=[{"target": "big", "token_maps_source": "counts A"},
                  {"target": "small", "token_maps_source": "counts B"}],
    )
    payload["divergences"][0]["target"] = "big"
    return payload


def test_report_with_eagle_rows_has_a_table_per_target_and_the_tree_column(tmp_path, capsys):
    payload = _eagle_payload()
    write_report(tmp_path, payload)
    md = (tmp_path / "results.md").read_text()
    assert "| Method | Tree | Num Spec Tokens |" in md
    big, small = md.index("### Target `big`"), md.index("### Target `small`")
    assert big < md.index("| fr-spec | chain-3 | 3 | 8 |") < small
    assert small < md.index("| eagle+fr-spec | dynamic-5x4x16 | 5 | 32 | 2.50 | 36.00 |")
    assert md.count("| vanilla | - | - | - |") == 2
    assert "- EAGLE head: `default` on target `small`" in md
    assert "Token maps (target `big`): counts A" in md and "Token maps (target `small`): counts B" in md
    assert "| big | fr-spec k=3 map=8 | p1 | 5 |" in md  # divergences name their target
    with open(tmp_path / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["tree"] for r in rows[3:]] == ["", "chain-4", "chain-4", "dynamic-5x4x16", "dynamic-5x4x16"]
    assert [r["target"] for r in rows] == ["big"] * 3 + ["small"] * 5
    for png in ("throughput_vs_map_size.png", "acceptance_vs_map_size.png"):
        assert (tmp_path / png).read_bytes().startswith(PNG_MAGIC)


def test_plot_has_one_line_per_drafter_and_shape(tmp_path, monkeypatch):
    import matplotlib.axes

    from frspec.bench import plots

    lines = {}
    original = matplotlib.axes.Axes.plot

    def spy(self, xs, ys, *args, **kwargs):
        lines[kwargs["label"]] = (list(xs), list(ys))
        return original(self, xs, ys, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    plots.plot_vs_map_size(_eagle_payload()["rows"], "decode_tokens_per_s", "tok/s", tmp_path / "p.png", vocab_size=64)
    assert lines == {
        "big: draft chain-3": ([8, 64], [17.0, 15.0]),
        "small: eagle chain-4": ([32, 64], [33.0, 30.0]),
        "small: eagle dynamic-5x4x16": ([32, 64], [36.0, 35.0]),
    }
