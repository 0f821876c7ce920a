"""DraftVocab as a pruned LM head (ported from the former PrunedLMHead tests), and the draft-model drafter's use of it."""

from __future__ import annotations

import pytest
import torch

from frspec.errors import FrspecError
from frspec.decode.draft_model import DraftModelDrafter
from frspec.decode.sampling import SamplingParams, logits_to_probs, make_generator
from frspec.decode.tree_shape import TreeShape
from frspec.vocab.draft_vocab import DraftVocab
from frspec.vocab.token_map import TokenMap

from tests.decode.spec_tiny import tiny_lm


def pruned_vocab(weight, ids, bias=None) -> DraftVocab:
    """The draft vocabulary keeping rows `ids` of `weight` (what PrunedLMHead was)."""
    ids = torch.as_tensor(ids, dtype=torch.long)
    return DraftVocab.build(weight, bias, TokenMap(ids, weight.shape[0]))

VOCAB = 128


def test_pruned_logits_are_the_full_logits_of_the_kept_rows_and_tied_weights_are_copied():
    model = tiny_lm("qwen2", VOCAB, tie=True, seed=0)
    embed = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight.data_ptr() == embed.data_ptr()  # really tied
    ids = torch.tensor([5, 99, 0, 17, 64])
    head = pruned_vocab(model.get_output_embeddings().weight, ids)
    hidden = torch.randn(3, 64, dtype=torch.float64)
    full = model.get_output_embeddings()(hidden)
    torch.testing.assert_close(head(hidden), full[:, ids], rtol=0, atol=1e-12)
    assert head.head.weight.is_contiguous() and head.head.weight.data_ptr() != embed.data_ptr()
    before = embed.clone()
    with torch.no_grad():
        head.head.weight.zero_()
    assert torch.equal(embed, before)
    assert head.to_target(torch.tensor([1, 4])).tolist() == [99, 64]
    assert head.size == 5


def test_bias_rows_follow_the_map():
    weight, bias = torch.randn(10, 4), torch.randn(10)
    ids = torch.tensor([7, 2])
    head = pruned_vocab(weight, ids, bias)
    x = torch.randn(4)
    torch.testing.assert_close(head(x), (weight @ x + bias)[ids])


@pytest.mark.parametrize("ids", [[0, 10], [-1], [], [3, 3]])  # duplicates would break sampling exactness
def test_bad_ids_are_refused(ids):
    with pytest.raises(FrspecError):
        pruned_vocab(torch.randn(10, 4), torch.tensor(ids, dtype=torch.long))


def test_drafter_with_a_map_never_runs_the_full_head_and_scores_only_the_last_position():
    model = tiny_lm("llama", VOCAB, seed=1)
    ids = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0))[:40]
    drafter = DraftModelDrafter(model, TokenMap(ids, VOCAB))
    full_calls, head_inputs = [], []
    model.get_output_embeddings().register_forward_hook(lambda m, i, o: full_calls.append(1))
    drafter.vocab.head.register_forward_hook(lambda m, i, o: head_inputs.append(tuple(i[0].shape)))
    context = torch.tensor([[1, 2, 3, 4, 5, 6]])
    drafter.reset()
    drafter.prefill(context[:, :5])
    with torch.inference_mode():
        draft = drafter.propose(context, TreeShape.chain(4), SamplingParams(), None)
    draft_ids = draft.tokens[1:]
    assert draft.is_chain and draft.tokens[0] == 6
    assert full_calls == [] and head_inputs == [(1, 64)] * 4
    assert set(draft_ids) <= set(ids.tolist())
    # Greedy drafting = the full model's argmax restricted to the map, token after token.
    seq = context[0].tolist()
    with torch.no_grad():
        for token in draft_ids:
            logits = model(torch.tensor([seq])).logits[0, -1]
            assert token == int(ids[logits[ids].argmax()])
            seq.append(token)
    assert drafter.steps == 4 and drafter.time_s >= drafter.lm_head_time_s > 0


def test_sampling_draft_distribution_is_the_softmax_over_the_map():
    model = tiny_lm("llama", VOCAB, seed=2)
    ids = torch.arange(0, VOCAB, 3)
    drafter = DraftModelDrafter(model, TokenMap(ids, VOCAB))
    drafter.reset()
    context = torch.tensor([[9, 8, 7]])
    drafter.prefill(context[:, :2])
    params = SamplingParams(temperature=0.7)
    with torch.inference_mode():
        draft = drafter.propose(context, TreeShape.chain(1), params, make_generator(0))
    with torch.no_grad():
        full = model(context).logits[0, -1]
    q = draft.child_probs[0]  # over the target vocabulary: zero outside the map
    torch.testing.assert_close(q[ids], logits_to_probs(full[ids], params), rtol=0, atol=1e-6)
    assert torch.equal(drafter.vocab.target_ids, ids) and float(q.sum() - q[ids].sum()) == 0.0
    assert draft.tokens[1] in ids.tolist()
