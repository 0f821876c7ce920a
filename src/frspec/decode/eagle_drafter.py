"""EagleDrafter: drafting token trees with an EAGLE head from the target's own hidden states.

Alignment (as in EAGLE): head position t reads the pair (token x_{t+1}, target hidden h_t) and predicts x_{t+2}.
The target computes h_t when it processes x_t, so the head always trails the target by one token:

    committed  x_0 ... x_{n-2} x_{n-1}        x_{n-1} is pending: the target has not run it yet
    target     h_0 ... h_{n-2}                (from the prefill and from each verification)
    head       pairs t = 0 .. n-2             the last pair (x_{n-1}, h_{n-2}) gives the root's logits

Tree nodes below the root are paired with the head's own features at their parent. After drafting the head's
cache is cut back to the committed pairs; the next verification hands over the target's hidden states of the
accepted path (`observe_target`), which pair with the accepted tokens at the next `propose`. No extra target
forward is ever needed. The head is shared, never modified: this drafter's FR-Spec restriction is its own DraftVocab.
"""

from __future__ import annotations

import torch

from frspec.decode.drafter import Drafter
from frspec.decode.kv_cache import cache_length, truncate_cache
from frspec.decode.sampling import SamplingParams
from frspec.decode.timing import now
from frspec.decode.token_tree import TokenTree, expansion_inputs
from frspec.decode.tree_growth import KeepDrafting, grow_tree
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError
from frspec.models.attention import check_arbitrary_masks
from frspec.models.eagle import EagleHead
from frspec.vocab.token_map import TokenMap


class EagleDrafter(Drafter):
    """Drafts trees (chains included) with an EAGLE-1/2 or EAGLE-3 head, optionally through an FR-Spec token map."""

    kind = "eagle"

    def __init__(self, head: EagleHead, num_target_layers: int, token_map: TokenMap | None = None,
                 context_rows: int = 0, context_budget: str = "fixed", ranked: bool = False):
        """`context_rows` > 0 makes the vocabulary context-aware (vocab/context_vocab.py), as for a draft model:
        up to that many rows for the request's prompt and accepted tokens that the head can score (an EAGLE-3
        head's d2t vocabulary bounds them), within the map's k rows ("fixed") or added to them ("additive"). `ranked`:
        the map is a frequency ranking and the head serves every size (vocab/ranked_vocab.py)."""
        super().__init__()
        self.head = head
        # FR-Spec: only the map's rows (and, context-aware, the request's) of the head's LM head are scored.
        self.vocab = head.draft_vocab(token_map, context_rows, context_budget, ranked)
        self.device = head.embed_tokens.weight.device
        # Indices of the target's `hidden_states` output the head reads; the engine asks the target for just these.
        self.target_hidden_layers: list[int] = head.target_layer_ids(num_target_layers)
        self.cache = head.new_cache()
        # Target states for the positions after those the head has consumed: head features already computed
        # (`_features`), then the target's raw hidden-state tuples, turned into features when they are consumed so
        # that the cost (EAGLE-3's fc) is counted where it is spent.
        self._features: torch.Tensor | None = None
        self._hidden: list[tuple] = []

    @property
    def version(self) -> int:
        return self.head.version

    @property
    def weights(self) -> torch.nn.Module:
        return self.head

    def check_shape(self, shape: TreeShape) -> None:
        # The head runs every level of a draft, chains included, under a tree mask.
        check_arbitrary_masks(self.head.config, "the EAGLE head")

    def reset(self) -> None:
        super().reset()
        self.cache = self.head.new_cache()
        self._features, self._hidden = None, []

    @torch.inference_mode()
    def prefill(self, context: torch.Tensor, window: int | None = None) -> None:
        """Run the head over the prompt's pairs (x_{t+1}, h_t), t < L - 1, once the target's prefill states have
        been observed; the last prompt state pairs with the first generated token in the first `propose`. No window
        (`prompt_windows` is empty): the head reads the target's state at every prompt position."""
        if window is not None:
            raise FrspecError(f"an {self.kind.upper()} head reads the whole prompt (the target's state at every "
                              f"position), not a {window}-token window")
        self._begin_request(context)
        features = self._take_features()
        if features is None:
            return
        m = context.shape[1] - 1
        if m > 0:
            positions = torch.arange(m, device=self.device)[None]
            self.head(context[:, 1:].to(self.device), features[:, :m], positions, cache=self.cache)
        self._features = features[:, m:]

    def observe_target(self, hidden_states, rows: torch.Tensor | None = None) -> None:
        """Take the target's hidden states (its `hidden_states` output) at `rows` (default all) of its last forward,
        in sequence order: the next positions after those already seen."""
        self._hidden.append(tuple(None if h is None else h if rows is None else h[:, rows.to(h.device)]
                                  for h in hidden_states))

    def _take_features(self) -> torch.Tensor | None:
        """Head features [1, q, H] for all observed positions not consumed yet (None if there are none)."""
        parts = [] if self._features is None else [self._features]
        if self._hidden:
            merged = [None if layer[0] is None else torch.cat(layer, dim=1) for layer in zip(*self._hidden)]
            parts.append(self.head.features_from_target(merged))
        self._features, self._hidden = None, []
        return torch.cat(parts, dim=1) if parts else None

    @torch.inference_mode()
    def propose(
        self, context: torch.Tensor, shape: TreeShape, sampling: SamplingParams, generator: torch.Generator | None,
        keep_drafting: KeepDrafting | None = None,
    ) -> TokenTree:
        """Draft a tree of `shape` rooted at the pending token context[0, -1]."""
        start = now(self.device)
        n = context.shape[1]
        done = cache_length(self.cache)
        features = self._take_features()
        if features is None or done + features.shape[1] != n - 1:
            have = done + (0 if features is None else features.shape[1])
            raise ValueError(f"EAGLE drafter has target hidden states for {have} positions, needs {n - 1}")
        # Catch up on the committed pairs: tokens x_{done+1} .. x_{n-1} with h_done .. h_{n-2}.
        ids = context[:, done + 1 : n].to(self.device)
        self._add_request_tokens(ids)  # the tokens accepted since the last proposal, and the root
        positions = torch.arange(done, n - 1, device=self.device)[None]
        out = self.head(ids, features, positions, cache=self.cache)
        self.steps += 1
        node_features = {0: out[:, -1:]}
        cached: list[int] = []

        def expand(tree: TokenTree, nodes: list[int]) -> torch.Tensor:
            ids, pos, mask = expansion_inputs(tree, nodes, cached, n - 1, dtype=out.dtype, device=self.device)
            parents = torch.cat([node_features[tree.parents[i]] for i in nodes], dim=1)
            feats = self.head(ids, parents, pos, mask, self.cache)
            cached.extend(nodes)
            for j, node in enumerate(nodes):
                node_features[node] = feats[:, j : j + 1]
            self.steps += 1
            return self._logits(feats[0])

        root_logits = self._logits(out[0, -1:])[0]
        tree = grow_tree(int(context[0, n - 1]), root_logits, shape, expand, sampling, generator, vocab=self.vocab,
                         keep_drafting=keep_drafting)
        truncate_cache(self.cache, n - 1)  # drop the tree: accepted tokens come back paired with target states
        self.time_s += now(self.device) - start
        return tree

    def rollback(self, length: int) -> None:
        # The head's cache never holds more than the committed pairs (it trails the target by one token).
        truncate_cache(self.cache, max(length - 1, 0))

    def _head_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Draft logits over this drafter's vocabulary for head features (EAGLE-3's final norm included)."""
        return self.vocab.logits(self.head.lm_head_input(features))
