"""The engine on a CUDA device (scripts/gpu_checks.sh runs these; without CUDA they skip): greedy identity against
the target alone for every drafter (MTP included) and draft shape, the sampling tests' device paths, and the
int4/int8 kernels' CUDA dispatch. Tiny models built in-process, fp32 (TF32 off) so greedy identity is exact on the device."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import frspec.decode.verify as verify
from frspec.decode.factory import build_generator
from frspec.decode.sampling import SamplingParams
from frspec.models import quant_kernels as K
from frspec.models.quant import Int4Linear, Int8Linear, quantize_int4, quantize_int8, quantize_linear
from frspec.models.quant import quantize_model
from tests.decode.eagle_tiny import mostly_bigram
from tests.decode.spec_tiny import noisy_copy, sharpen, tiny_lm
from tests.decode.test_engine_sampling import chi_square_pvalue, exact_marginals, map_without_top_tokens
from tests.decode.test_engine_trees import KINDS, SHAPES, drafter_args
from tests.lossless.test_map_schedule import FLAT, k_every_step  # noqa: F401 (k_every_step: a fixture)
from tests.lossless.test_map_schedule import _ranking as schedule_ranking
from tests.lossless.test_map_schedule import drafters as schedule_drafters

# FRSPEC_CUDA_TESTS_DEVICE=cpu dry-runs this file on a machine without CUDA (the kernels then are the CPU ones).
DEV = torch.device(os.environ.get("FRSPEC_CUDA_TESTS_DEVICE", "cuda"))
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(DEV.type == "cuda" and not torch.cuda.is_available(),
                                                   reason="needs a CUDA device")]
VOCAB = 256
PROMPT = [5, 17, 99, 3, 42, 8]


@pytest.fixture(autouse=True, scope="module")
def _exact_fp32():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    """transformers' own greedy generate, on the model's device."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def to_device(args: dict) -> dict:
    return {k: (v.to(DEV) if isinstance(v, nn.Module) else v) for k, v in args.items()}


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def target(request):
    return mostly_bigram(tiny_lm(request.param, VOCAB, layers=2, seed=0, dtype=torch.float32))


@pytest.mark.parametrize("shape", [*SHAPES, "chain-k"])
@pytest.mark.parametrize("kind", ["vanilla", *KINDS])
def test_greedy_identity_on_cuda(target, kind, shape):
    if kind == "vanilla" and shape != "chain-k":
        pytest.skip("vanilla decoding drafts no shape")
    args = {} if kind == "vanilla" else to_device(drafter_args(kind, target))  # built on the CPU, then moved
    model = _on_device(target)
    shape_args = dict(tree=SHAPES[shape]) if shape != "chain-k" else {} if kind == "vanilla" else dict(num_spec_tokens=4)
    generator = build_generator(model, **shape_args, **args)
    ref = greedy_reference(model, PROMPT, 24)
    out = generator.generate(input_ids=PROMPT, max_new_tokens=24, eos_token_ids=[])
    assert out.token_ids == ref, (kind, shape)
    if kind != "vanilla":
        assert out.stats.draft_steps > 0


# -- sampling on the device: the CPU tests' chi-square check of the first decode step's marginals -------------------

SAMPLING_VOCAB = 16
SAMPLING_PROMPT = [3, 1, 4]
NEW = 4
RUNS = 1200
T1 = SamplingParams(temperature=1.0)
FILTERED = SamplingParams(temperature=0.8, top_k=10, top_p=0.9)


@pytest.fixture(scope="module")
def sampling_models():
    target = sharpen(tiny_lm("llama", SAMPLING_VOCAB, hidden=32, layers=1, seed=0, dtype=torch.float32), 2.0)
    return target, noisy_copy(target, 0.3, seed=1)


def device_pvalue(target_cpu, generator, params) -> tuple[float, object]:
    """Sample on the device, compare with the exact marginals enumerated on the CPU copy of the same weights."""
    from frspec.decode.stats import GenerationStats

    exact = exact_marginals(target_cpu, SAMPLING_PROMPT, NEW, params)
    counts = torch.zeros(NEW, SAMPLING_VOCAB, dtype=torch.float64)
    stats = []
    for seed in range(RUNS):
        sampling = SamplingParams(params.temperature, params.top_k, params.top_p, seed=seed)
        out = generator.generate(input_ids=SAMPLING_PROMPT, max_new_tokens=NEW, sampling=sampling, eos_token_ids=[])
        counts[torch.arange(NEW), torch.tensor(out.token_ids)] += 1
        stats.append(out.stats)
    return min(chi_square_pvalue(counts[j], exact[j]) for j in range(1, NEW)), GenerationStats.aggregate(stats)


def _on_device(model):
    import copy

    return copy.deepcopy(model).to(DEV)


def test_draft_sampling_follows_target_on_cuda(sampling_models):
    target, draft = sampling_models
    p, stats = device_pvalue(target, build_generator(_on_device(target), _on_device(draft), num_spec_tokens=3), T1)
    assert p > 1e-3
    assert all(0.05 < r < 0.95 for r in stats.acceptance_rate_per_position[:2])


@pytest.mark.parametrize("params", [T1, FILTERED], ids=["t1", "filtered"])
def test_frspec_sampling_follows_target_on_cuda(sampling_models, params):
    target, draft = sampling_models
    token_map = map_without_top_tokens(target, params)
    generator = build_generator(_on_device(target), _on_device(draft), token_map, num_spec_tokens=3)
    p, stats = device_pvalue(target, generator, params)
    assert p > 1e-3
    assert 0 < sum(stats.accepted_per_position) < sum(stats.proposed_per_position)


def test_the_device_check_rejects_a_wrong_acceptance_rule(sampling_models, monkeypatch):
    target, draft = sampling_models
    monkeypatch.setattr(verify, "_residual", lambda p, r: p)  # resample from p instead of max(p - q, 0)
    generator = build_generator(_on_device(target), _on_device(draft), map_without_top_tokens(target, T1),
                                num_spec_tokens=3)
    p, _ = device_pvalue(target, generator, T1)
    assert p < 1e-6


def test_sampling_a_tree_on_cuda_passes_the_device_to_every_draw():
    """Every random draw in decode/ is made on the model's device (step.py's generator, the verifier's torch.rand):
    sampling chains and trees on the device runs."""
    from frspec.decode.tree_shape import TreeShape

    target = tiny_lm("llama", VOCAB, seed=3).to(DEV)
    draft = tiny_lm("llama", VOCAB, seed=4).to(DEV)
    for shape in (TreeShape.chain(3), TreeShape.static(2, 2), TreeShape.dynamic(3, 2, 4)):
        out = build_generator(target, draft, tree=shape).generate(
            input_ids=PROMPT, max_new_tokens=12, sampling=SamplingParams(temperature=1.0, seed=0), eos_token_ids=[])
        assert len(out.token_ids) == 12 and out.stats.draft_steps > 0


# -- int4 / int8 on CUDA ----------------------------------------------------------------------------------------------


def test_int4_dispatches_to_the_cuda_kernel_and_matches_its_weights():
    torch.manual_seed(0)
    lin = nn.Linear(1536, 64, bias=True).to(DEV, torch.bfloat16)
    q = quantize_linear(lin, "int4")
    assert isinstance(q, Int4Linear) and q.kernel == (K.CUDA_INT4 if DEV.type == "cuda" else K.CPU_INT4)
    x = torch.randn(3, 1536, device=DEV)
    ref = nn.functional.linear(x, quantize_int4(lin.weight, 32).dequantize().to(DEV), lin.bias.float())
    torch.testing.assert_close(q(x.bfloat16()).float(), ref, atol=0.1, rtol=0.02)


def test_int8_on_cuda_takes_the_dequantized_path_exactly():
    torch.manual_seed(0)
    lin = nn.Linear(256, 48, bias=False).to(DEV)
    q = quantize_linear(lin, "int8")
    assert isinstance(q, Int8Linear) and q.kernel == K.int8_kernel(DEV.type, torch.float32)
    x = torch.randn(5, 256, device=DEV)
    torch.testing.assert_close(q(x), x @ quantize_int8(lin.weight).dequantize().to(DEV).t(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_speculative_output_equals_the_quantized_targets_own_on_cuda(quant):
    from frspec.vocab.token_map import TokenMap

    def tiny():  # hidden 128: a multiple of the CUDA int4 kernel's 32-column groups and 16 x inner tiles
        return tiny_lm("llama", VOCAB, hidden=128, seed=0, dtype=torch.bfloat16).to(DEV)

    target = quantize_model(tiny(), quant)
    draft = quantize_model(noisy_copy(tiny(), 0.05, seed=1), quant, head=False)
    token_map = TokenMap(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(5))[:128], VOCAB)
    for prompt in ([3, 9, 27], [100, 5, 6, 7, 200, 1, 2]):
        ref = build_generator(target).generate(input_ids=prompt, max_new_tokens=16, eos_token_ids=[]).token_ids
        for tm in (None, token_map):
            spec = build_generator(target, draft, tm, num_spec_tokens=3, draft_head_quant=quant)
            assert not isinstance(spec.drafter.vocab.head, torch.nn.Linear)  # the head was packed at construction
            assert spec.generate(input_ids=prompt, max_new_tokens=16, eos_token_ids=[]).token_ids == ref


# -- MTP drafting on the device: each family's tiny checkpoint (tests/decode/mtp_tiny.py) ---------------------------

MTP_VOCAB = 96
MTP_PROMPT = [5, 9, 13, 2, 7, 40, 3]


@pytest.fixture(scope="module")
def mtp_checkpoints(tmp_path_factory):
    from tests.decode.mtp_tiny import FAMILIES, save_mtp_checkpoint

    root = tmp_path_factory.mktemp("mtp-cuda")
    return {family: save_mtp_checkpoint(root / family, family, vocab=MTP_VOCAB) for family in FAMILIES}


@pytest.mark.parametrize("shape", ["chain", "static", "dynamic"])
@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe", "qwen3_next", "qwen3_5", "mimo"])
def test_mtp_greedy_identity_on_cuda(mtp_checkpoints, family, shape):
    from frspec.decode.tree_shape import TreeShape
    from frspec.models.mtp import load_mtp_head
    from frspec.vocab.token_map import TokenMap
    from tests.decode.mtp_tiny import load_target

    target = load_target(mtp_checkpoints[family])
    head = load_mtp_head(target, mtp_checkpoints[family])
    target, head = target.to(DEV), head.to(DEV)
    tree = {"chain": TreeShape.chain(3), "static": TreeShape.static(3, 2), "dynamic": TreeShape.dynamic(3, 2, 6)}[shape]
    reference = greedy_reference(target, MTP_PROMPT, 24)
    token_map = TokenMap(list(range(0, MTP_VOCAB, 2)) + list(range(1, MTP_VOCAB // 2, 2)), MTP_VOCAB)
    for tm in (None, token_map):
        generator = build_generator(target, eagle=head, tree=tree, token_map=tm)
        out = generator.generate(input_ids=MTP_PROMPT, max_new_tokens=24, eos_token_ids=[])
        assert out.token_ids == reference, (family, shape, tm is not None)
        assert out.stats.accepted_per_position[0] > 0


# -- the controller on the device: the map size changing every step, and `auto` on this device's own costs --------

SCHEDULE_VOCAB = 128
SCHEDULE_PROMPTS = ([5, 17, 99, 3, 42, 8], [1, 2, 3], [77, 12, 60, 9, 101, 33, 4, 90])


@pytest.fixture(scope="module")
def schedule_target():
    return mostly_bigram(tiny_lm("llama", SCHEDULE_VOCAB, hidden=32, layers=2, seed=0, dtype=torch.float32))


@pytest.mark.parametrize("name", ["draft-chain", "draft-dynamic", "eagle3-d2t-chain"])
def test_greedy_identity_with_k_changing_every_step_on_cuda(schedule_target, k_every_step, name):
    """The ranked head's size changes at every step (and a chain's length, plain steps included): the device's
    output is still the target's own greedy output, token for token."""
    import copy

    # The drafters are built on a copy: an EAGLE head shares the target's embedding, and moving it moves that too.
    target = copy.deepcopy(schedule_target)
    drafter = to_device(schedule_drafters(target)[name])
    target = target.to(DEV)
    generator = build_generator(target, token_map=schedule_ranking(), token_map_size="auto", costs=FLAT,
                                recalibrate_costs=False, **drafter)
    used = k_every_step(generator)
    accepted = 0
    for prompt in SCHEDULE_PROMPTS:
        out = generator.generate(input_ids=prompt, max_new_tokens=24, eos_token_ids=[])
        assert out.token_ids == greedy_reference(target, prompt, 24), (name, prompt)
        accepted += sum(out.stats.accepted_per_position)
    assert accepted > 0, "no draft was ever accepted: the identity check would be vacuous"
    assert len(used) > 6 and all(a != b for a, b in zip(used, used[1:]))


def test_auto_measures_this_devices_costs_and_stays_lossless_on_cuda(schedule_target, tmp_path, monkeypatch):
    """No length and no size given: the controller's costs are measured here, on the device (their provenance names
    it), rescaled between requests from the forwards the engine times on it (synchronised: decode/timing.py), and
    whatever it then chooses, the output is the target's own. The log shows what it chose and how it rescaled."""
    monkeypatch.setenv("FRSPEC_CACHE", str(tmp_path))
    target = _on_device(schedule_target)
    draft = _on_device(noisy_copy(schedule_target, 0.05, seed=1))
    auto = build_generator(target, draft, schedule_ranking())
    assert auto.controller is not None and len(auto.controller.sizes) > 1
    assert auto.costs.provenance["device"].startswith(DEV.type)
    for prompt in SCHEDULE_PROMPTS:
        out = auto.generate(input_ids=prompt, max_new_tokens=24, eos_token_ids=[])
        assert out.token_ids == greedy_reference(target, prompt, 24), prompt
        print(f"auto on {auto.costs.provenance['machine']}: depths {out.stats.chosen_depth_histogram}, "
              f"sizes {sorted(set(out.stats.chosen_map_sizes))}, "
              f"rescaled {auto.costs.provenance.get('recalibrated')}")
    assert sum(auto.timings.samples().values()) > 0  # every decode forward was timed
