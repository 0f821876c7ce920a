"""Token trees: what a drafter proposes in one speculative step, and how a model reads it in one forward.

A tree's node 0 is the root: the last committed token, which the target has not run yet. Every other node is a
drafted token whose parent is an earlier node (parents[i] < i), so node order is a topological order and a node's
path from the root is found by walking parents. Siblings are kept in the order they were drafted, which the
sampling verifier relies on (see verify.py). A chain (plain speculative decoding) is a tree of width 1.

The target reads all nodes in one forward: each node attends to the committed prefix and to its own ancestors
(`attention_mask`), at position prefix + depth (`position_ids`). A chain needs neither: the model's own causal
mask and positions are exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from frspec.errors import FrspecError
from frspec.models.attention import additive_mask, check_arbitrary_masks, layer_masks


@dataclass
class TokenTree:
    """Nodes of a draft tree, root first. Grown with `add_child`; read with the tensor views and helpers below.

    `child_probs[u]` (over the target vocabulary) is the draft distribution u's children were sampled from,
    without replacement, in sibling order. A node absent from it had its children chosen deterministically (top-k or
    argmax). Verification uses this to know which proposal each sibling came from.
    """

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    child_probs: dict[int, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def from_root(cls, token: int) -> TokenTree:
        return cls(tokens=[int(token)], parents=[-1], depths=[0])

    @classmethod
    def from_parents(cls, tokens: Sequence[int], parents: Sequence[int]) -> TokenTree:
        """Build a tree from flat lists (parents[0] must be -1, every other parent an earlier node)."""
        if len(tokens) != len(parents) or not tokens:
            raise FrspecError("a token tree needs one parent per token and at least a root")
        if int(parents[0]) != -1:
            raise FrspecError("a token tree's node 0 is its root and must have parent -1")
        tree = cls.from_root(int(tokens[0]))
        for tok, par in zip(list(tokens)[1:], list(parents)[1:]):
            tree.add_child(int(par), int(tok))
        return tree

    @classmethod
    def chain(cls, root_token: int, drafts: Sequence[int]) -> TokenTree:
        """The tree of plain speculative decoding: root -> drafts[0] -> drafts[1] -> ..."""
        n = len(drafts)
        return cls(tokens=[int(root_token)] + [int(t) for t in drafts], parents=list(range(-1, n)),
                   depths=list(range(n + 1)))

    def add_child(self, parent: int, token: int) -> int:
        """Append a drafted token under `parent`; returns the new node's index."""
        if not 0 <= parent < len(self.tokens):
            raise FrspecError(f"parent {parent} is not a node of this {len(self.tokens)}-node tree")
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.depths.append(self.depths[parent] + 1)
        return len(self.tokens) - 1

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_drafts(self) -> int:
        return len(self.tokens) - 1

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    @property
    def is_chain(self) -> bool:
        """True when every node's parent is the node before it (no branching): causal order is tree order."""
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def children(self, node: int) -> list[int]:
        """Children of `node` in the order they were drafted."""
        return [i for i in range(node + 1, len(self.parents)) if self.parents[i] == node]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root down to `node`, both included."""
        path = []
        while node != -1:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def ancestor_mask(self) -> torch.Tensor:
        """Bool [n, n]: [i, j] is True when node j is node i or one of its ancestors."""
        n = len(self.tokens)
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            if self.parents[i] >= 0:
                mask[i] = mask[self.parents[i]]
            mask[i, i] = True
        return mask

    def tokens_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.tensor(self.tokens, dtype=torch.long, device=device)

    def position_ids(self, offset: int, nodes: Sequence[int] | None = None, device: torch.device | str = "cpu"):
        """LongTensor [1, q]: the positions of `nodes` (default: all) when the root sits at position `offset`."""
        nodes = range(len(self.tokens)) if nodes is None else nodes
        return torch.tensor([[offset + self.depths[i] for i in nodes]], dtype=torch.long, device=device)

    def visibility(self, past_len: int, query_nodes: Sequence[int] | None = None,
                   key_nodes: Sequence[int] | None = None) -> torch.Tensor:
        """Bool [q, past_len + len(key_nodes)]: which keys each of `query_nodes` may see.

        The key axis is the cache as the model will see it: `past_len` committed entries, then the tree nodes in
        `key_nodes` order (the order they were written to the cache; default all nodes in index order, which is
        also the default query). A query may see every committed entry and its own ancestors, itself included.
        """
        query_nodes = list(range(len(self.tokens))) if query_nodes is None else list(query_nodes)
        key_nodes = list(range(len(self.tokens))) if key_nodes is None else list(key_nodes)
        anc = self.ancestor_mask()
        tree_part = anc[torch.tensor(query_nodes, dtype=torch.long)][:, torch.tensor(key_nodes, dtype=torch.long)]
        return torch.cat([torch.ones(len(query_nodes), past_len, dtype=torch.bool), tree_part], dim=1)

    def attention_mask(
        self,
        past_len: int,
        query_nodes: Sequence[int] | None = None,
        key_nodes: Sequence[int] | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        """Additive mask [1, 1, q, past_len + len(key_nodes)] for a forward over `query_nodes` (see `visibility`)."""
        return additive_mask(self.visibility(past_len, query_nodes, key_nodes), dtype=dtype, device=device)

    def model_masks(self, config, cache, past_len: int, root_position: int, query_nodes: Sequence[int] | None = None,
                    key_nodes: Sequence[int] | None = None, dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu"):
        """The mask argument a model with this `config` and `cache` takes for a forward over `query_nodes`: the
        additive mask, or with sliding-window layers (Gemma 2/3) one per layer type (models/attention.layer_masks).
        The committed entries sit at positions 0..past_len-1 and node i at root_position + depth i."""
        query_nodes = list(range(len(self.tokens))) if query_nodes is None else list(query_nodes)
        key_nodes = list(range(len(self.tokens))) if key_nodes is None else list(key_nodes)
        depths = torch.tensor(self.depths, dtype=torch.long)
        key_positions = torch.cat([torch.arange(past_len), root_position + depths[key_nodes]])
        return layer_masks(config, cache, self.visibility(past_len, query_nodes, key_nodes),
                           root_position + depths[query_nodes], key_positions, dtype=dtype, device=device)


def expansion_inputs(
    tree: TokenTree,
    nodes: Sequence[int],
    cached_nodes: Sequence[int],
    past_len: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    config=None,
    cache=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, position_ids, attention_mask) for a drafter running `nodes` of a tree it is growing.

    The drafter's cache holds `past_len` committed entries, the last of which is the root, then the tree nodes in
    `cached_nodes` (in the order it ran them). Each new node sees the committed entries and its cached ancestors.
    With the model's `config` and `cache`, the mask is in the form that model takes (per layer type with
    sliding-window layers, TokenTree.model_masks); without, the additive mask.
    """
    ids = torch.tensor([[tree.tokens[i] for i in nodes]], dtype=torch.long, device=device)
    positions = tree.position_ids(past_len - 1, nodes, device=device)
    keys = list(cached_nodes) + list(nodes)
    if config is None:
        mask = tree.attention_mask(past_len, nodes, keys, dtype=dtype, device=device)
    else:
        mask = tree.model_masks(config, cache, past_len, past_len - 1, nodes, keys, dtype=dtype, device=device)
    return ids, positions, mask


def check_tree_support(model, what: str = "the model") -> None:
    """Refuse models that cannot read a tree in one forward (see models/attention.py): every layer must be full or
    sliding-window attention, run by an implementation that applies a 4D mask as given (eager, sdpa, packed sdpa)."""
    check_arbitrary_masks(model.config, what)
