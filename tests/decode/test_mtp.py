"""MTP drafting and hybrid targets, end to end on tiny checkpoints in each family's published layout (mtp_tiny.py).

Greedy fp32 output must be token for token the target's own greedy output (transformers' generate on the target
alone) for every family x shape (chain, static tree, dynamic tree) x vocabulary (full head, an FR-Spec map, a map
with context rows). Qwen3-Next and Qwen3.5 targets are hybrid (Gated DeltaNet layers): they also exercise
decode/hybrid_target.py. Drafts must be accepted and rejected, or the identity would test nothing.
"""

from __future__ import annotations

import pytest
import torch

from tests.decode.mtp_tiny import FAMILIES, HYBRID_FAMILIES, as_qwen3_5_release, load_target, save_mtp_checkpoint
from tests.decode.spec_tiny import hf_greedy

from frspec.decode.drafter import Drafter
from frspec.decode.factory import build_generator
from frspec.decode.mtp_drafter import MtpDrafter, mtp_drafter_for
from frspec.decode.token_tree import TokenTree
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError
from frspec.models.mtp import detect_mtp, load_mtp_head
from frspec.vocab.draft_vocab import DraftVocab
from frspec.vocab.token_map import TokenMap

VOCAB = 96
PROMPT = [5, 9, 13, 2, 7, 40, 3]
NEW = 24
SHAPES = {"chain": TreeShape.chain(4), "static": TreeShape.static(3, 2), "dynamic": TreeShape.dynamic(3, 2, 6)}
MAPS = ("none", "map", "map+context")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp")
    return {family: save_mtp_checkpoint(root / family, family, vocab=VOCAB) for family in FAMILIES}


@pytest.fixture(scope="module")
def loaded(checkpoints):
    """(target, MTP head, target-alone greedy reference) per family."""
    out = {}
    for family, path in checkpoints.items():
        target = load_target(path)
        out[family] = (target, load_mtp_head(target, path), hf_greedy(target, PROMPT, NEW))
    return out


def _map_kwargs(kind: str) -> dict:
    if kind == "none":
        return {}
    token_map = TokenMap(list(range(0, VOCAB, 2)) + list(range(1, VOCAB // 2, 2)), VOCAB)  # 72 of 96 ids
    return {"token_map": token_map, **({"context_rows": 8} if kind == "map+context" else {})}


@pytest.mark.parametrize("vocab", MAPS)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("family", FAMILIES)
def test_mtp_greedy_is_the_targets_greedy(loaded, family, shape, vocab):
    target, head, reference = loaded[family]
    generator = build_generator(target, eagle=head, tree=SHAPES[shape], **_map_kwargs(vocab))
    assert isinstance(generator.drafter, MtpDrafter)
    assert generator.method == ("mtp" if vocab == "none" else "mtp+fr-spec")
    out = generator.generate(input_ids=PROMPT, max_new_tokens=NEW, eos_token_ids=[])
    assert out.token_ids == reference
    accepted = out.stats.accepted_per_position
    assert accepted[0] > 0, "some drafts must be accepted"
    assert sum(accepted) < NEW - 1, "some drafts must be rejected"


@pytest.mark.parametrize("family", FAMILIES)
def test_recursive_mtp_drafts_deeper_than_its_layers(loaded, family):
    """One MTP layer drafting 5 deep: depths beyond the first are accepted too."""
    target, head, reference = loaded[family]
    assert head.num_layers == 1
    out = build_generator(target, eagle=head, num_spec_tokens=5).generate(input_ids=PROMPT, max_new_tokens=NEW,
                                                                           eos_token_ids=[])
    assert out.token_ids == reference
    assert out.stats.accepted_per_position[1] > 0


@pytest.mark.parametrize("shape", ["chain", "static"])
def test_qwen3_5_released_multimodal_layout(checkpoints, loaded, tmp_path, shape):
    """Qwen3.5 ships as a multimodal checkpoint (text weights under model.language_model., mtp.* beside them):
    loaded as its causal LM, drafted by its MTP layer, still the target's own output."""
    _, _, reference = loaded["qwen3_5"]
    path = as_qwen3_5_release(checkpoints["qwen3_5"], tmp_path / "release")
    target = load_target(path)
    out = build_generator(target, eagle=load_mtp_head(target, path), tree=SHAPES[shape]
                          ).generate(input_ids=PROMPT, max_new_tokens=NEW, eos_token_ids=[])
    assert out.token_ids == reference and out.stats.accepted_per_position[0] > 0


def test_layout_detection_and_shared_head(checkpoints, loaded):
    expected = {"deepseek_v3": "deepseek", "glm4_moe": "deepseek", "qwen3_next": "qwen", "qwen3_5": "qwen",
                "mimo": "mimo"}
    for family, path in checkpoints.items():
        target, head, _ = loaded[family]
        layout = detect_mtp(path, target.config.num_hidden_layers)
        assert (layout.family, layout.num_layers) == (expected[family], 1)
        assert head.lm_head is target.get_output_embeddings()  # shared, not copied
    target, head, _ = loaded["deepseek_v3"]
    before = target.get_output_embeddings().weight.clone()
    drafter = mtp_drafter_for(target, head, token_map=TokenMap(list(range(10)), VOCAB))
    assert drafter.vocab.size == 10 and drafter.vocab.head.weight.data_ptr() != before.data_ptr()
    assert torch.equal(target.get_output_embeddings().weight, before)  # FR-Spec pruned a copy


def test_checkpoint_without_mtp_is_refused(tmp_path):
    from tests.decode.spec_tiny import tiny_lm

    model = tiny_lm("qwen2", VOCAB, dtype=torch.float32)
    model.save_pretrained(tmp_path)
    assert detect_mtp(tmp_path, model.config.num_hidden_layers) is None
    with pytest.raises(FrspecError, match="carries no MTP layers"):
        load_mtp_head(model, tmp_path)


class _ScriptedDrafter(Drafter):
    """Proposes trees whose correct prefix has a chosen length: the target's greedy continuation for the first
    `depths[step]` tokens, then a wrong token (and, for trees, the correct token as a second child, so the
    accepted path is not a prefix of node order)."""

    def __init__(self, target, reference: list[int], depths: list[int], tree: bool):
        super().__init__()
        self.vocab = DraftVocab.build(target.get_output_embeddings().weight)
        self.device = torch.device("cpu")
        self.reference, self.depths, self.tree, self.step = reference, depths, tree, 0

    def prefill(self, context, window=None):
        self.prompt_len = context.shape[1]

    def propose(self, context, shape, sampling, generator, keep_drafting=None):
        done = context.shape[1] - self.prompt_len  # generated tokens committed so far (the root included)
        good = min(self.depths[self.step % len(self.depths)], shape.depth)
        self.step += 1
        truth = self.reference[done : done + shape.depth]
        tree, node = TokenTree.from_root(int(context[0, -1])), 0
        for d in range(min(shape.depth, len(truth))):
            wrong = (truth[d] + 1) % VOCAB
            if d < good:
                if self.tree:
                    tree.add_child(node, wrong)  # a rejected sibling first
                node = tree.add_child(node, truth[d])
            else:
                tree.add_child(node, wrong)
                break
        return tree

    def rollback(self, length):
        pass


@pytest.fixture(scope="module")
def strong_hybrids(tmp_path_factory):
    """Hybrid targets at full strength (not made mostly bigram), so a wrong linear-attention state changes tokens."""
    root = tmp_path_factory.mktemp("hybrid")
    return {f: load_target(save_mtp_checkpoint(root / f, f, vocab=VOCAB, context_scale=1.0)) for f in HYBRID_FAMILIES}


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_hybrid_target_restores_state_at_every_depth(strong_hybrids, family, tree):
    """Drafts rejected at every depth 0..4 (and fully accepted): every restore of the linear-attention states runs,
    and the output is still the target's own."""
    target = strong_hybrids[family]
    reference = hf_greedy(target, PROMPT, 40)
    drafter = _ScriptedDrafter(target, reference, depths=[0, 1, 2, 3, 4], tree=tree)
    generator = build_generator(target, drafter, tree=TreeShape.static(4, 2) if tree else TreeShape.chain(4))
    out = generator.generate(input_ids=PROMPT, max_new_tokens=40, eos_token_ids=[])
    assert out.token_ids == reference
    proposed, accepted = out.stats.proposed_per_position, out.stats.accepted_per_position
    assert all(p > a > 0 for p, a in zip(proposed, accepted)), (proposed, accepted)  # rejections at each depth


def test_hybrid_draft_model_is_refused_in_one_line(strong_hybrids):
    target = strong_hybrids["qwen3_5"]
    with pytest.raises(FrspecError, match="linear-attention layers"):
        build_generator(target, strong_hybrids["qwen3_next"])
