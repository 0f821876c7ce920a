"""Fixed logit tables over a tiny vocabulary: the 'models' of the fixed-logit distribution tests.

Target and drafter are tables indexed by (depth, token): the logits after a node at `depth` whose token is `token`.
So the target's distribution of the 2nd emitted token depends on the 1st (a real joint distribution), and a
drafted node's children are scored by the table row of that node.

The drafter scores through a real `DraftVocab` built from an LM-head weight whose columns are those tables (a
one-hot hidden state picks the context), in three variants:
  full  every target id is a head row;
  map   FR-Spec: a token map of MAP_SIZE ids, some likely target tokens deliberately left out;
  d2t   an EAGLE-3-style head with its own reduced vocabulary (head_to_target, shuffled order) composed with a map.

The sampling settings filter hard on both sides: top-k removes half the target vocabulary and part of every draft
vocabulary (also of the mapped ones), top-p removes more, so zero-probability outcomes exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from frspec.vocab.draft_vocab import DraftVocab
from frspec.vocab.token_map import TokenMap

from tests.lossless.decode_adapter import SamplingParams
from tests.lossless.lossless_reference import joint_two_tokens, reference_probs


V = 10
DEPTHS = 3  # table rows for nodes at depth 0 (root), 1 and 2
ROOT = 0
PARAMS = SamplingParams(temperature=0.8, top_k=5, top_p=0.95)
MAP_IDS = [3, 1, 7, 0, 5, 9, 2]  # leaves out 4, 6 and 8, each likely somewhere under the target
HEAD_IDS = [6, 1, 3, 9, 0, 8, 5, 2]  # the d2t head's own vocabulary (target id of each head row)
VARIANTS = ("full", "map", "d2t")


@dataclass(frozen=True)
class Problem:
    target_logits: torch.Tensor  # [DEPTHS, V, V]: logits after (depth, token)
    draft_logits: torch.Tensor  # [DEPTHS, V, V]: the drafter's, over target ids (a head row reads its id's column)

    def target_at(self, depth: int, token: int) -> torch.Tensor:
        return self.target_logits[depth, token]

    @staticmethod
    def hidden_at(depth: int, token: int) -> torch.Tensor:
        return _ONE_HOT[depth * V + token]

    def draft_vocab(self, variant: str) -> DraftVocab:
        contexts = self.draft_logits.reshape(DEPTHS * V, V)  # [context, target id]
        if variant == "full":
            return DraftVocab.build(contexts.T.contiguous(), vocab_size=V)
        if variant == "map":
            return DraftVocab.build(contexts.T.contiguous(), token_map=TokenMap(MAP_IDS, V), vocab_size=V)
        if variant == "d2t":
            head_ids = torch.tensor(HEAD_IDS)
            weight = contexts.T[head_ids].contiguous()  # head row r scores target id HEAD_IDS[r]
            return DraftVocab.build(weight, token_map=TokenMap(MAP_IDS, V), head_to_target=head_ids, vocab_size=V)
        raise ValueError(variant)

    @cached_property
    def reference_joint(self) -> np.ndarray:
        """P(x1, x2) of the target alone, by transformers' processors (lossless_reference.py)."""
        t = PARAMS
        first = reference_probs(self.target_logits[0, ROOT], t.temperature, t.top_k, t.top_p)
        second = reference_probs(self.target_logits[1], t.temperature, t.top_k, t.top_p)  # [x1, x2]
        return joint_two_tokens(first, second)

    @cached_property
    def reference_second(self) -> np.ndarray:
        t = PARAMS
        return reference_probs(self.target_logits[1], t.temperature, t.top_k, t.top_p)


_ONE_HOT = torch.eye(DEPTHS * V, dtype=torch.float64)


def make_problem(seed: int = 0, agreement: float = 1.0) -> Problem:
    """Random tables; the drafter is the target plus noise (`agreement` scales how much it agrees)."""
    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(DEPTHS, V, V, generator=gen) * 1.1
    draft = agreement * target + torch.randn(DEPTHS, V, V, generator=gen) * 1.2
    return Problem(target.double(), draft.double())
