"""Greedy identity at scale, in fp32: every method and shape emits exactly transformers' greedy `generate` tokens on
PROMPTS random prompts, plus long generations (LONG tokens) where a drifting cache would show.

Tiny fp32 models (hidden 32, 2 layers). A mismatch is reported with its position and the target's top-2 logit margin
there; fp32 near-ties (margin below NEAR_TIE) would be reported separately as such, but none occur in these runs,
so any mismatch fails.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from frspec.vocab.token_map import TokenMap

from tests.decode.eagle_tiny import mostly_bigram, oracle_eagle2_head, oracle_eagle3_head
from tests.decode.spec_tiny import hf_greedy, noisy_copy, tiny_lm
from tests.lossless.decode_adapter import TreeShape, build_generator

VOCAB = 128
PROMPTS = 100
NEW = 20
LONG = 2_000
NEAR_TIE = 1e-4

CHAIN, STATIC, DYNAMIC = TreeShape.chain(3), TreeShape.static(2, 2), TreeShape.dynamic(depth=3, topk=3, budget=8)


@pytest.fixture(scope="module")
def target():
    model = mostly_bigram(tiny_lm("llama", VOCAB, hidden=32, layers=2, seed=0, dtype=torch.float32))
    model.config.max_position_embeddings = LONG + 64
    return model


@pytest.fixture(scope="module")
def prompts_and_refs(target):
    gen = torch.Generator().manual_seed(2026)
    prompts = [torch.randint(0, VOCAB, (int(n),), generator=gen).tolist()
               for n in torch.randint(1, 13, (PROMPTS,), generator=gen)]
    return prompts, [hf_greedy(target, p, NEW) for p in prompts]


def _map() -> TokenMap:
    return TokenMap(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(5))[: VOCAB // 2], VOCAB)


def methods(target) -> dict:
    """name -> build_generator keyword arguments (one entry per method x shape)."""
    draft = noisy_copy(target, 0.05, seed=1)
    e2, e3 = oracle_eagle2_head(target), oracle_eagle3_head(target, draft_ids=torch.arange(0, VOCAB, 2))
    e3_full = oracle_eagle3_head(target)
    return {
        "vanilla": {},
        "draft-chain": dict(draft=draft, num_spec_tokens=3),
        "draft+map-chain": dict(draft=draft, token_map=_map(), num_spec_tokens=3),
        "draft-static": dict(draft=draft, tree=STATIC),
        "draft+map-dynamic": dict(draft=draft, token_map=_map(), tree=DYNAMIC),
        "eagle2-chain": dict(eagle=e2, tree=CHAIN),
        "eagle2-static": dict(eagle=e2, tree=STATIC),
        "eagle2+map-dynamic": dict(eagle=e2, token_map=_map(), tree=DYNAMIC),
        "eagle3-chain": dict(eagle=e3_full, tree=CHAIN),
        "eagle3-d2t-static": dict(eagle=e3, tree=STATIC),
        "eagle3-d2t+map-dynamic": dict(eagle=e3, token_map=_map(), tree=DYNAMIC),
    }


def _mismatch(target, prompt, got, want) -> str:
    i = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b) if got[: len(want)] != want else len(want)
    with torch.no_grad():
        logits = target(torch.tensor([prompt + want[:i]])).logits[0, -1].double()
    top = torch.topk(logits, 2).values
    margin = float(top[0] - top[1])
    kind = "fp32 near-tie" if margin < NEAR_TIE else "MISMATCH"
    return f"{kind} at generated position {i}: got {got[i:i + 3]}, want {want[i:i + 3]}, top-2 margin {margin:.3g}"


_SHARED: dict = {}  # what forked workers inherit: the target, the prompts and references, the methods


def _check_method(name: str) -> tuple[list[str], int]:
    target, prompts, refs, kwargs = _SHARED["target"], _SHARED["prompts"], _SHARED["refs"], _SHARED["methods"][name]
    torch.set_num_threads(1)
    generator = build_generator(target, **kwargs)
    failures, accepted = [], 0
    for prompt, ref in zip(prompts, refs):
        out = generator.generate(input_ids=prompt, max_new_tokens=NEW, eos_token_ids=[])
        if out.token_ids != ref:
            failures.append(f"{name}, prompt {prompt}: {_mismatch(target, prompt, out.token_ids, ref)}")
        accepted += sum(out.stats.accepted_per_position)
    return failures, accepted


def test_greedy_identity_on_100_prompts_per_method(target, prompts_and_refs):
    prompts, refs = prompts_and_refs
    _SHARED.update(target=target, prompts=prompts, refs=refs, methods=methods(target))
    names = list(_SHARED["methods"])
    with mp.get_context("fork").Pool(2) as pool:  # two cores: methods split over two processes
        results = dict(zip(names, pool.map(_check_method, names)))
    failures = [f for fs, _ in results.values() for f in fs]
    assert not failures, "\n".join(failures[:10])
    for name, (_, accepted) in results.items():
        if name != "vanilla":
            assert accepted > 0, f"{name} never had a draft accepted: the identity check would be vacuous"


@pytest.fixture(scope="module")
def long_reference(target):
    prompt = [7, 3, 99, 12]
    ref = hf_greedy(target, prompt, LONG)
    assert len(set(ref[-500:])) > 3, "the reference should not have collapsed into a short loop"
    return prompt, ref


@pytest.mark.lossless_heavy
@pytest.mark.parametrize("name", ["draft+map-chain", "eagle2-static", "eagle3-d2t+map-dynamic"])
def test_long_generations_stay_identical(target, long_reference, name):
    prompt, ref = long_reference
    out = build_generator(target, **methods(target)[name]).generate(input_ids=prompt, max_new_tokens=LONG,
                                                                    eos_token_ids=[])
    assert out.token_ids == ref, _mismatch(target, prompt, out.token_ids, ref)
