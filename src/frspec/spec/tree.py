"""Token trees: what a drafter proposes in one speculative step, and how the target reads it in one forward.

A tree's node 0 is the root: the last committed token, which the target has not run yet. Every other node is a
drafted token whose parent is an earlier node (parents[i] < i), so node order is a topological order and a node's
path from the root is found by walking parents. Siblings are kept in the order they were drafted, which the
sampling verifier relies on (see tree_verify.py).

The target reads all nodes in one forward: each node attends to the committed prefix and to its own ancestors
(`attention_mask`), at position prefix + depth (`position_ids`). After verification only the accepted path's
cache entries are kept (`keep_cache_entries`).

Three shapes grow a tree from a drafter (`grow_tree`):
  chain    depth k, one child per node (plain speculative decoding with k drafted tokens);
  static   depth D, B children per node (a full B-ary tree, B + B^2 + ... + B^D drafted nodes);
  dynamic  EAGLE-2: per level, the `branching` best nodes by cumulative draft log-probability are expanded with
           their top-`branching` children; at the end the `budget` best drafted nodes are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from frspec.errors import FrspecError
from frspec.spec.sampling import SamplingParams, logits_to_probs, sample

# A static tree larger than this is almost surely a typo (branching 8, depth 6 = 299592 nodes).
MAX_TREE_NODES = 4096


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
        tree = cls.from_root(root_token)
        for tok in drafts:
            tree.add_child(len(tree) - 1, int(tok))
        return tree

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

    def attention_mask(
        self,
        past_len: int,
        query_nodes: Sequence[int] | None = None,
        key_nodes: Sequence[int] | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        """Additive mask [1, 1, q, past_len + len(key_nodes)] for a forward over `query_nodes`.

        The key axis is the cache as the model will see it: `past_len` committed entries, then the tree nodes in
        `key_nodes` order (the order they were written to the cache; default all nodes in index order, which is
        also the default query). A query may see every committed entry and its own ancestors, itself included.
        """
        query_nodes = list(range(len(self.tokens))) if query_nodes is None else list(query_nodes)
        key_nodes = list(range(len(self.tokens))) if key_nodes is None else list(key_nodes)
        anc = self.ancestor_mask()
        tree_part = anc[torch.tensor(query_nodes, dtype=torch.long)][:, torch.tensor(key_nodes, dtype=torch.long)]
        allowed = torch.cat([torch.ones(len(query_nodes), past_len, dtype=torch.bool), tree_part], dim=1)
        return additive_mask(allowed, dtype=dtype, device=device)


def expansion_inputs(
    tree: TokenTree,
    nodes: Sequence[int],
    cached_nodes: Sequence[int],
    past_len: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, position_ids, attention_mask) for a drafter running `nodes` of a tree it is growing.

    The drafter's cache holds `past_len` committed entries, the last of which is the root, then the tree nodes in
    `cached_nodes` (in the order it ran them). Each new node sees the committed entries and its cached ancestors.
    """
    ids = torch.tensor([[tree.tokens[i] for i in nodes]], dtype=torch.long, device=device)
    positions = tree.position_ids(past_len - 1, nodes, device=device)
    mask = tree.attention_mask(past_len, nodes, list(cached_nodes) + list(nodes), dtype=dtype, device=device)
    return ids, positions, mask


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Turn a bool [q, kv] visibility matrix into the 4D additive float mask HF attention takes (0 or -inf)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed.to(device=mask.device), float("-inf"))
    return mask[None, None]


def causal_mask(q_len: int, past_len: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """The ordinary causal mask [1, 1, q_len, past_len + q_len] for q_len new tokens after past_len cached ones."""
    allowed = torch.ones(q_len, past_len + q_len, dtype=torch.bool).tril(diagonal=past_len)
    return additive_mask(allowed, dtype=dtype, device=device)


def check_tree_support(model, what: str = "the model") -> None:
    """Refuse models with sliding-window or other non-full attention layers: a tree mask replaces the model's own
    mask in every layer, and dropping tree entries from a windowed cache is not supported."""
    kinds = set(getattr(model.config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        other = sorted(kinds - {"full_attention"})
        raise FrspecError(f"token trees need full attention in every layer, but {what} has {', '.join(other)} layers")


def keep_cache_entries(cache, start: int, keep: torch.Tensor | Sequence[int]) -> None:
    """In every layer of a DynamicCache, keep entries [0, start) and then only entries start + keep, in that order.

    After a tree forward the cache holds the committed prefix followed by one entry per tree node; keeping the
    accepted path's node slots makes it identical to a cache built by running that path alone (same keys, same
    positions), because each node was computed seeing exactly its ancestors.
    """
    keep = torch.as_tensor(keep, dtype=torch.long)
    for i, layer in enumerate(cache.layers):
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        if getattr(layer, "is_sliding", False) or not getattr(layer, "is_croppable", True):
            raise FrspecError(
                f"cache layer {i} ({type(layer).__name__}) cannot drop tree entries; trees need full-attention layers"
            )
        total = layer.keys.shape[-2]
        if keep.numel() and (int(keep.max()) >= total - start or int(keep.min()) < 0):
            raise ValueError(f"keep indices {keep.tolist()} out of range for {total - start} tree entries")
        idx = torch.cat([torch.arange(start), start + keep]).to(layer.keys.device)
        layer.keys = layer.keys.index_select(-2, idx)
        layer.values = layer.values.index_select(-2, idx)


@dataclass(frozen=True)
class TreeShape:
    """How big a draft tree is. Build with `chain`, `static` or `dynamic`.

    depth      the deepest drafted level (the number of drafted tokens on the longest path);
    branching  children per expanded node (static, chain = 1) or EAGLE-2's top-k (dynamic);
    budget     dynamic trees only: how many drafted nodes are kept in the end.
    """

    depth: int
    branching: int = 1
    budget: int | None = None

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise FrspecError(f"tree depth must be >= 1, got {self.depth}")
        if self.branching < 1:
            raise FrspecError(f"tree branching must be >= 1, got {self.branching}")
        if self.budget is not None and self.budget < 1:
            raise FrspecError(f"tree budget must be >= 1, got {self.budget}")
        if self.budget is None and self.static_size() > MAX_TREE_NODES:
            raise FrspecError(
                f"a static tree of depth {self.depth} and branching {self.branching} has {self.static_size()} "
                f"nodes (limit {MAX_TREE_NODES}); use a dynamic tree (--tree-budget) or a smaller tree"
            )

    @classmethod
    def chain(cls, num_spec_tokens: int) -> TreeShape:
        return cls(depth=num_spec_tokens, branching=1)

    @classmethod
    def static(cls, depth: int, branching: int) -> TreeShape:
        return cls(depth=depth, branching=branching)

    @classmethod
    def dynamic(cls, depth: int, topk: int, budget: int) -> TreeShape:
        return cls(depth=depth, branching=topk, budget=budget)

    @property
    def kind(self) -> str:
        if self.budget is not None:
            return "dynamic"
        return "chain" if self.branching == 1 else "static"

    def static_size(self) -> int:
        """Drafted nodes of the full tree (ignoring the budget)."""
        return sum(self.branching**d for d in range(1, self.depth + 1))

    @property
    def max_drafts(self) -> int:
        """An upper bound on drafted nodes per step, for sizing buffers and reporting."""
        return self.static_size() if self.budget is None else self.budget

    def describe(self) -> str:
        if self.kind == "chain":
            return f"chain(k={self.depth})"
        if self.kind == "static":
            return f"static(depth={self.depth}, branching={self.branching})"
        return f"dynamic(depth={self.depth}, topk={self.branching}, budget={self.budget})"


def tree_shape_from_options(depth: int | None, branching: int | None, budget: int | None) -> TreeShape | None:
    """The TreeShape for the CLI's --tree-depth / --tree-branching / --tree-budget (None: no options, no tree).

    depth alone is a chain of that depth; with branching B a static tree; with a budget an EAGLE-2 dynamic tree,
    whose branching (top-k per level) must then be given.
    """
    if depth is None:
        if branching is not None or budget is not None:
            raise FrspecError("--tree-branching and --tree-budget shape a tree: give --tree-depth too")
        return None
    if budget is not None:
        if branching is None:
            raise FrspecError("a dynamic tree (--tree-budget) needs --tree-branching, the top-k expanded per level")
        return TreeShape.dynamic(depth, branching, budget)
    return TreeShape.static(depth, 1 if branching is None else branching)


# expand(tree, nodes) runs the drafter on `nodes` (already in `tree`, their ancestors already seen by the drafter)
# and returns its logits at those nodes, [len(nodes), draft_vocab].
ExpandFn = Callable[[TokenTree, list[int]], torch.Tensor]


def grow_tree(
    root_token: int,
    root_logits: torch.Tensor,
    shape: TreeShape,
    expand: ExpandFn,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    draft_to_target: torch.Tensor | None = None,
    vocab_size: int | None = None,
) -> TokenTree:
    """Grow a draft tree of `shape` from the drafter's logits at the root.

    Draft logits are over the drafter's vocabulary; `draft_to_target` (draft index -> target id, e.g. a TokenMap's
    ids) maps them to target ids, identity when None. `vocab_size` is the target vocabulary size, needed to store
    sampled children's proposal distribution over target ids.

    Greedy params (and every dynamic tree) choose children deterministically: the top-`branching` draft tokens.
    Sampling params on chains and static trees draw children from the draft distribution without replacement,
    recording that distribution in `child_probs` for lossless verification.
    """
    tree = TokenTree.from_root(root_token)
    if shape.kind == "dynamic":
        _grow_dynamic(tree, root_logits, shape, expand, params, draft_to_target)
        return tree
    sampled = not params.is_greedy
    if sampled and vocab_size is None:
        raise ValueError("grow_tree needs vocab_size to record the draft distributions of sampled children")
    frontier, logits = [0], root_logits.reshape(1, -1)
    for level in range(1, shape.depth + 1):
        new_nodes = []
        for row, parent in enumerate(frontier):
            if sampled:
                probs = logits_to_probs(logits[row], params)
                picks = _sample_without_replacement(probs, shape.branching, generator)
                tree.child_probs[parent] = _to_target_vocab(probs, draft_to_target, vocab_size)
            else:
                picks = _topk_draft(logits[row], shape.branching)
            for draft_idx in picks:
                new_nodes.append(tree.add_child(parent, _target_id(draft_idx, draft_to_target)))
        if level == shape.depth or not new_nodes:
            break
        frontier, logits = new_nodes, expand(tree, new_nodes)
    return tree


def _grow_dynamic(tree, root_logits, shape, expand, params, draft_to_target) -> None:
    """EAGLE-2's tree: expand the best nodes per level, then keep the `budget` best of all drafted candidates.

    Candidates live in `tree` as they are drafted (the drafter must see expanded nodes as tree nodes); the final
    selection then rebuilds `tree` in place from the kept nodes, which stay in drafting order, so parents still
    precede children.
    """
    k = shape.branching
    scores = [0.0]
    frontier, logits = [0], root_logits.reshape(1, -1)
    for level in range(1, shape.depth + 1):
        logp = _ranking_logprobs(logits, params)
        cands = []  # (score, parent, draft index)
        for row, parent in enumerate(frontier):
            top = torch.topk(logp[row], min(k, logp.shape[-1]))
            for lp, idx in zip(top.values.tolist(), top.indices.tolist()):
                if lp != float("-inf"):
                    cands.append((scores[parent] + lp, parent, idx))
        new_nodes = []
        for score, parent, idx in cands:
            new_nodes.append(tree.add_child(parent, _target_id(idx, draft_to_target)))
            scores.append(score)
        if level == shape.depth or not new_nodes:
            break
        # Only the k best of the k*k candidates are expanded; the others may still be kept as leaves.
        ranked = sorted(new_nodes, key=lambda i: -scores[i])
        frontier = sorted(ranked[:k])
        logits = expand(tree, frontier)
    _keep_best(tree, scores, shape.budget)


def _keep_best(tree: TokenTree, scores: list[float], budget: int) -> None:
    # Cumulative log-probs never increase down a path, and ties go to the shallower (then earlier) node, so every
    # kept node's parent ranks before it: the kept set is closed under parents.
    order = sorted(range(1, len(tree)), key=lambda i: (-scores[i], tree.depths[i], i))
    kept = sorted(order[:budget])
    new_index = {0: 0}
    old = TokenTree(list(tree.tokens), list(tree.parents), list(tree.depths))
    tree.tokens, tree.parents, tree.depths = [old.tokens[0]], [-1], [0]
    for i in kept:
        if old.parents[i] not in new_index:
            raise AssertionError("dynamic tree selection dropped a kept node's parent")
        new_index[i] = tree.add_child(new_index[old.parents[i]], old.tokens[i])


def _ranking_logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The draft log-probabilities trees are ranked by: the distribution the drafter would sample from."""
    if params.is_greedy:
        return torch.log_softmax(logits.float(), dim=-1)
    return torch.log(logits_to_probs(logits, params))


def _topk_draft(logits: torch.Tensor, k: int) -> list[int]:
    return torch.topk(logits.float(), min(k, logits.shape[-1])).indices.tolist()


def _sample_without_replacement(probs: torch.Tensor, n: int, generator: torch.Generator | None) -> list[int]:
    # Sequential draws, each from the distribution renormalised over what is left: the verifier replays exactly
    # this sequence of proposals. Stops early if the support has fewer than n tokens.
    probs = probs.clone()
    picks = []
    for _ in range(n):
        if float(probs.sum()) <= 0.0:
            break
        idx = int(sample(probs, generator))
        picks.append(idx)
        probs[idx] = 0.0
    return picks


def _target_id(draft_idx: int, draft_to_target: torch.Tensor | None) -> int:
    return int(draft_idx) if draft_to_target is None else int(draft_to_target[draft_idx])


def _to_target_vocab(probs: torch.Tensor, draft_to_target: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    if draft_to_target is None:
        if probs.shape[-1] != vocab_size:
            raise ValueError(f"draft distribution has {probs.shape[-1]} entries, target vocabulary {vocab_size}")
        return probs
    full = torch.zeros(vocab_size, dtype=probs.dtype, device=probs.device)
    full[draft_to_target.to(probs.device)] = probs
    return full
