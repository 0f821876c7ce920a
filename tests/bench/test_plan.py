"""The bench plan: built from the command line or from Python to the same frozen value, checked before anything
loads, and the one source of prompts for both engines."""

import argparse
import dataclasses
import json

import pytest

from frspec.bench.plan import DEFAULT, QUICK, BenchPlan, plan_bench
from frspec.commands.bench import plan_from_args, register
from frspec.decode.sampling import SamplingParams
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError


def _from_cli(*argv: str) -> BenchPlan:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return plan_from_args(parser.parse_args(["bench", *argv]))


def test_the_command_line_and_python_build_the_same_plan():
    cli = _from_cli("--quick", "--num-spec-tokens", "2,4", "--token-map-sizes", "64", "--draft-tree-shapes",
                    "static-2x2", "--context-rows", "8", "--context-budgets", "fixed,additive", "--temperature",
                    "0.5", "--seed", "3", "--no-progress")
    python = plan_bench(quick=True, num_spec_tokens=(2, 4), token_map_sizes=(64,), draft_tree_shapes="static-2x2",
                        context_rows=(8,), context_budgets="fixed,additive",
                        sampling=SamplingParams(temperature=0.5, seed=3), progress=False)
    assert dataclasses.replace(cli, command="") == python
    assert python.draft_tree_shapes == (TreeShape.static(2, 2),) and python.preset == "quick"
    assert python.quant_token_map_sizes == (64,)  # explicit map sizes serve the quantized rows too
    labels = [m.label for m in python.methods()]
    assert labels[:3] == ["vanilla", "draft k=2", "fr-spec k=2 map=64"] and "fr-spec k=2 map=64 +ctx=8 additive" in labels


def test_the_plan_is_frozen_and_takes_the_presets():
    plan = plan_bench()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.max_new_tokens = 1
    assert (plan.num_prompts, plan.max_new_tokens, plan.num_spec_tokens) == (
        DEFAULT.num_prompts, DEFAULT.max_new_tokens, DEFAULT.num_spec_tokens)
    quick = plan_bench(quick=True)
    assert (quick.num_prompts, quick.token_map_sizes, quick.exact_num_prompts) == (
        QUICK.num_prompts, QUICK.token_map_sizes, False)
    assert plan_bench(num_prompts=5).exact_num_prompts
    assert plan_bench(draft="none").draft is None and plan_bench(eagle="h").eagle_target is not None


@pytest.mark.parametrize("options, message", [
    (dict(max_new_tokens=0), "--max-new-tokens must be >= 1"),
    (dict(warmup_tokens=0), "--warmup-tokens must be >= 1"),
    (dict(token_map=["a"], counts="b"), "either --token-map files or --counts"),
    (dict(tree_shapes="chain-2"), "give --eagle HEAD too"),
    (dict(engine="vllm", context_rows=(4,)), "--context-rows runs on frspec's own engine"),
    (dict(engine="vllm", ignore_eos=True), "--ignore-eos runs on frspec's own engine"),
    (dict(engine="vllm", batch_sizes=(0,)), "--batch-sizes must be positive"),
    (dict(engine="vllm", eagle="h", tree_shapes="static-2x2"), "drafts chains only"),
    (dict(num_spec_tokens=(0,)), "must be >= 1"),
])
def test_bad_plans_are_refused_before_anything_loads(options, message):
    with pytest.raises(FrspecError, match=message):
        plan_bench(**options)


def test_a_preset_count_is_capped_at_the_dataset_and_an_explicit_one_is_not(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(2)))
    assert [p.id for p in plan_bench(quick=True, dataset=str(data)).prompts()] == ["0", "1"]  # quick asks for 3
    with pytest.raises(FrspecError, match="only 2"):
        plan_bench(dataset=str(data), num_prompts=3).prompts()


def test_mtp_plans_rows_drafted_by_the_targets_own_mtp_layers():
    """--mtp takes the EAGLE slot with the target's MTP layers: its rows are mtp / mtp+fr-spec (`--eagle mtp`
    plans the same drafter, labelled eagle)."""
    cli = _from_cli("--quick", "--target", "t", "--mtp", "--tree-shapes", "chain-2", "--no-progress")
    python = plan_bench(quick=True, target="t", mtp=True, tree_shapes="chain-2", progress=False,
                        sampling=SamplingParams(seed=0))  # the command line's default seed
    assert dataclasses.replace(cli, command="") == python
    assert (python.eagle, python.eagle_target, python.head_kind) == ("mtp", "t", "mtp")
    labels = [m.label for m in python.methods()]
    assert "mtp chain-2" in labels and "mtp+fr-spec chain-2 map=32768" in labels
    assert not any(label.startswith("eagle") for label in labels)
    old = plan_bench(quick=True, target="t", eagle="mtp", tree_shapes="chain-2")
    assert old.head_kind == "eagle" and "eagle chain-2" in [m.label for m in old.methods()]
    for options, message in ((dict(mtp=True, eagle="h"), "give --mtp or --eagle HEAD, not both"),
                             (dict(mtp=True, engine="vllm"), "MTP rows run on frspec's own engine")):
        with pytest.raises(FrspecError, match=message):
            plan_bench(**options)
