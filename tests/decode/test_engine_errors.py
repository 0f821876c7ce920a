"""Bad input is a clear FrspecError before any generation work."""

from __future__ import annotations

import pytest
import torch

from frspec.errors import FrspecError
from frspec.decode.draft_model import DraftModelDrafter
from frspec.decode.engine import SpeculativeGenerator
from frspec.decode.factory import build_generator
from frspec.decode.sampling import SamplingParams
from frspec.decode.tree_shape import TreeShape
from frspec.vocab.token_map import TokenMap

from tests.decode.spec_tiny import tiny_lm, tiny_tokenizer

VOCAB = 128


@pytest.fixture(scope="module")
def models():
    return tiny_lm("llama", VOCAB, seed=0), tiny_lm("llama", VOCAB, seed=1)


def _no_forward(model):
    def boom(*a, **k):
        raise AssertionError("a forward ran before the input was validated")

    model.forward = boom
    return model


def test_token_map_for_another_vocabulary_size(models):
    target, draft = models
    with pytest.raises(FrspecError, match="vocabulary of 200 ids but the target model has 128"):
        build_generator(target, draft, TokenMap([1, 2, 3], 200))
    with pytest.raises(FrspecError, match="draft model"):
        DraftModelDrafter(draft, TokenMap([1, 2, 3], 64))


def test_token_map_ids_out_of_range():
    with pytest.raises(FrspecError, match="out of range"):
        TokenMap([1, 2, VOCAB], VOCAB)


def test_token_map_made_with_another_tokenizer():
    tok = tiny_tokenizer()
    target = tiny_lm("llama", len(tok), seed=0)
    token_map = TokenMap([1, 2], len(tok), metadata={"tokenizer": {"name": "other", "vocab_hash": "0123456789abcdef"}})
    with pytest.raises(FrspecError, match="tokenizer"):
        build_generator(target, target, token_map, tokenizer=tok)


@pytest.mark.parametrize("k", [0, -1, 2.5, True])
def test_num_spec_tokens_below_one(models, k):
    target, draft = models
    with pytest.raises(FrspecError, match="num_spec_tokens"):
        build_generator(target, draft, num_spec_tokens=k)
    with pytest.raises(FrspecError, match="num_spec_tokens"):
        SpeculativeGenerator(target, None, tree=TreeShape.chain(k))  # the chain refuses its length itself


def test_a_chain_length_and_a_tree_together_are_refused_not_one_silently_preferred(models):
    """One spelling of what to draft: num_spec_tokens=k is TreeShape.chain(k); both at once is a one-line error,
    as is a drafter without a shape or a controller."""
    target, draft = models
    for tree in (TreeShape.chain(3), TreeShape.static(2, 2)):
        with pytest.raises(FrspecError, match="not both") as error:
            build_generator(target, draft, num_spec_tokens=3, tree=tree)
        assert "\n" not in str(error.value)
    with pytest.raises(FrspecError, match="not both"):
        build_generator(target, draft, num_spec_tokens="auto", tree=TreeShape.chain(2))
    assert build_generator(target, draft, num_spec_tokens=3).shape == build_generator(
        target, draft, tree=TreeShape.chain(3)).shape == TreeShape.chain(3)
    with pytest.raises(FrspecError, match="shape"):
        SpeculativeGenerator(target, DraftModelDrafter(draft))


def test_target_draft_vocabulary_mismatch_before_any_work():
    target = _no_forward(tiny_lm("llama", VOCAB, seed=0))
    other = _no_forward(tiny_lm("qwen2", VOCAB + 8, seed=1))
    with pytest.raises(FrspecError, match="vocabularies differ"):
        build_generator(target, other, num_spec_tokens=2)
    with pytest.raises(FrspecError, match="vocabularies differ"):
        SpeculativeGenerator(target, DraftModelDrafter(other))


def test_token_map_without_a_draft(models):
    target, _ = models
    with pytest.raises(FrspecError, match="draft"):
        build_generator(target, None, TokenMap([1, 2], VOCAB))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(input_ids=[1, VOCAB]), "out of range"),
        (dict(input_ids=[-1, 2]), "out of range"),
        (dict(input_ids=[]), "empty"),
        (dict(input_ids=torch.zeros(2, 3, dtype=torch.long)), "one sequence"),
        (dict(input_ids=[0.5]), "integer"),
        (dict(), "exactly one"),
        (dict(prompt="hi", input_ids=[1]), "exactly one"),
        (dict(prompt="hi"), "tokenizer"),
        (dict(input_ids=[1], stop_strings=["x"]), "tokenizer"),
        (dict(input_ids=[1], max_new_tokens=-1), "max_new_tokens"),
        (dict(input_ids=[1], apply_chat_template=True), "text prompt"),
    ],
)
def test_bad_generate_arguments(models, kwargs, message):
    target, draft = models
    generator = build_generator(target, draft, num_spec_tokens=2)
    with pytest.raises(FrspecError, match=message):
        generator.generate(**kwargs)


def test_bad_sampling_params():
    with pytest.raises(FrspecError):
        SamplingParams(temperature=-1)
    with pytest.raises(FrspecError):
        SamplingParams(top_p=0)


def test_no_chat_template():
    tok = tiny_tokenizer()
    tok.chat_template = None
    target = tiny_lm("llama", len(tok), seed=0)
    with pytest.raises(FrspecError, match="chat template"):
        build_generator(target, tokenizer=tok).generate(prompt="hi", apply_chat_template=True)


def test_zero_new_tokens_is_an_empty_answer(models):
    target, draft = models
    out = build_generator(target, draft).generate(input_ids=[1, 2], max_new_tokens=0)
    assert out.token_ids == [] and out.stats.tokens == 0 and out.stats.target_forwards == 0
