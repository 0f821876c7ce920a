"""Gemma 3 (262,144-token vocabulary, scaled embeddings, sliding-window layers) as target and draft model, through
FR-Spec maps, DraftVocab and context rows; a soft-capped draft (Gemma 2's final_logit_softcapping) too.

Greedy fp32 output must be the target's own (transformers' generate). The tiny models keep the real vocabulary size
(hidden 16, so the 262k-row head is 16 MB) and a sliding window shorter than the generation, so the target's and the
draft's sliding-window caches are rolled back past their window. Chains, static trees and dynamic trees all run:
sliding-window layers get their own tree mask (models/attention.layer_masks), the target's sliding cache keeps the
accepted path by a gather (decode/kv_cache.keep_cache_entries) and the draft's sliding layers keep every entry while
a tree grows (kv_cache.sliding_layers_keep_everything).
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from tests.decode.spec_tiny import hf_greedy, noisy_copy

from frspec.decode.factory import build_generator
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError
from frspec.vocab.token_map import TokenMap

VOCAB = 262_144
PROMPT = [5, 900, 70_000, 262_000, 12, 4096]
NEW = 20


def tiny_gemma3(seed: int = 0, softcap: float | None = None, strength: float = 0.05) -> Gemma3ForCausalLM:
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=8, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=256,
        final_logit_softcapping=softcap, initializer_range=0.3, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        attn_implementation="sdpa",
    )
    model = Gemma3ForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():  # the context matters little: a noisy copy then agrees with the target often
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(strength)
            layer.mlp.down_proj.weight.mul_(strength)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model


@pytest.fixture(scope="module")
def target():
    return tiny_gemma3()


@pytest.fixture(scope="module")
def reference(target):
    return hf_greedy(target, PROMPT, NEW)


def _map_with(reference: list[int], k: int = 2048) -> TokenMap:
    """A k-id map holding most of the reference's tokens (as a corpus count would) and ids spread over the vocab."""
    keep = list(dict.fromkeys(reference[: len(reference) * 3 // 4]))
    spread = [i for i in range(0, VOCAB, VOCAB // k) if i not in keep]
    return TokenMap(keep + spread[: k - len(keep)], VOCAB)


SHAPES = {"chain": TreeShape.chain(4), "static": TreeShape.static(3, 2), "dynamic": TreeShape.dynamic(3, 2, 6)}


@pytest.mark.parametrize("vocab", ["none", "map", "map+context"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_gemma3_draft_and_target_greedy(target, reference, shape, vocab):
    draft = noisy_copy(target, 0.05, seed=1)
    embed_before = target.get_input_embeddings().weight.clone()
    kwargs = {} if vocab == "none" else {"token_map": _map_with(reference)}
    if vocab == "map+context":
        kwargs["context_rows"] = 16
    generator = build_generator(target, draft, tree=SHAPES[shape], **kwargs)
    out = generator.generate(input_ids=PROMPT, max_new_tokens=NEW, eos_token_ids=[])
    assert out.token_ids == reference
    assert 0 < sum(out.stats.accepted_per_position) < NEW - 1
    if vocab != "none":
        assert generator.drafter.vocab.size == 2048  # 2048 of 262,144 rows scored
    # tied embeddings: the drafter's pruned head is a copy, the models' embeddings are untouched
    assert torch.equal(target.get_input_embeddings().weight, embed_before)


def test_softcapped_draft_drafts_its_own_distribution():
    """A draft with final-logit soft-capping (Gemma 2's 30; 1.0 here so the cap bends every logit) must draft from its
    capped distribution: a draft identical to the target then proposes exactly the target's law and, sampling, has
    (almost) every draft accepted. Without the cap its q differs from p and many drafts are rejected."""
    from frspec.decode.sampling import SamplingParams

    target = tiny_gemma3(softcap=1.0)
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(4.0)  # logits well beyond the cap
    rates = {}
    for capped in (True, False):
        generator = build_generator(target, copy.deepcopy(target), num_spec_tokens=4)
        assert generator.drafter.softcap == 1.0
        if not capped:
            generator.drafter.softcap = None  # the negative control: the uncapped head
        out = generator.generate(input_ids=PROMPT, max_new_tokens=60, eos_token_ids=[],
                                 sampling=SamplingParams(temperature=1.0, seed=3))
        stats = out.stats
        rates[capped] = sum(stats.accepted_per_position) / sum(stats.proposed_per_position)
    assert rates[True] > 0.97 and rates[False] < 0.8, rates


def test_gemma3_tree_accepting_a_side_branch_gathers_the_sliding_cache():
    """A scripted tree whose correct child is the second one (so the accepted path is not a prefix of node order
    and the sliding-window cache layer is gathered, not cropped), at every step past the window: the output is
    still the target's own. The target is at full strength (its context matters), so a wrong gather or a wrong
    sliding mask changes its tokens."""
    from frspec.decode.drafter import Drafter
    from frspec.decode.token_tree import TokenTree
    from frspec.vocab.draft_vocab import DraftVocab

    strong = tiny_gemma3(seed=2, strength=1.0)
    reference = hf_greedy(strong, PROMPT, NEW)

    class SideBranch(Drafter):
        def __init__(self):
            super().__init__()
            self.vocab = DraftVocab.build(strong.get_output_embeddings().weight)
            self.device = torch.device("cpu")

        def prefill(self, context, window=None):
            pass

        def propose(self, context, shape, sampling, generator, keep_drafting=None):
            n = context.shape[1]
            tree = TokenTree.from_root(int(context[0, -1]))
            parent = 0
            for depth in range(min(shape.depth, len(reference) - (n - len(PROMPT)))):
                want = reference[n - len(PROMPT) + depth]
                tree.add_child(parent, (want + 1) % VOCAB)  # a wrong sibling first
                parent = tree.add_child(parent, want)
            return tree

        def rollback(self, length):
            pass

    generator = build_generator(strong, SideBranch(), tree=TreeShape.static(2, 2))
    out = generator.generate(input_ids=PROMPT, max_new_tokens=NEW, eos_token_ids=[])
    assert out.token_ids == reference
    assert sum(out.stats.accepted_per_position) > NEW // 2  # the side branches were accepted, hence gathered
