"""Drafters: what proposes tokens for the target to verify.

A drafter sees the accepted context and proposes draft tokens; the engine verifies them and then tells the drafter
how much of the context survived (`rollback`). The drafter never decides acceptance and never sees the target.

`Drafter` is the interface the engine codes against; `DraftModelDrafter` drafts a chain or a token tree with an
independent small causal LM, optionally through an FR-Spec `PrunedLMHead`. Tree drafting (several candidates per
position, `propose_tree`) fits the same life cycle: reset -> prefill -> (propose or propose_tree -> rollback)*.
Drafters that read the target's hidden states (EAGLE, spec/eagle_drafter.py) name them in `target_hidden_layers`
and receive them through `observe_target`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from frspec.errors import FrspecError
from frspec.models.loading import vocab_size_of
from frspec.spec.cache import cache_length, enable_rollback, new_cache, truncate_cache
from frspec.spec.pruned_head import PrunedLMHead
from frspec.spec.sampling import SamplingParams, logits_to_probs, sample
from frspec.spec.timing import now
from frspec.spec.tree import TokenTree, TreeShape, check_tree_support, expansion_inputs, grow_tree
from frspec.vocab.token_map import TokenMap


@dataclass
class Draft:
    """A chain of proposed tokens and, when sampling, the distributions they were drawn from.

    `probs[i]` is the draft distribution q at position i over `support` (target ids of its columns; None means
    column j is target id j). Ids outside the support have q = 0. `indices[i]` is the column `token_ids[i]` was
    drawn from, so q(token_ids[i]) = probs[i, indices[i]]. Greedy drafts carry no probabilities.
    """

    token_ids: torch.Tensor  # [n] target-vocabulary ids
    indices: torch.Tensor  # [n] columns of probs
    probs: torch.Tensor | None = None  # [n, m]
    support: torch.Tensor | None = None  # [m]

    def __len__(self) -> int:
        return int(self.token_ids.numel())


class Drafter:
    """The interface between the engine and anything that drafts.

    Life cycle per request: `reset()`, `prefill(prompt)`, then repeatedly `propose(context, n, ...)` followed by
    `rollback(length)`. `context` is always the full accepted sequence [1, length] (prompt and generated tokens,
    ending with the token the target has not processed yet); a drafter feeds itself whatever suffix its own cache
    lacks. Subclasses keep the counters up to date: `time_s` (time spent in `propose`), `lm_head_time_s` (the
    vocabulary-sized part of it) and `steps` (drafter forwards in `propose`).
    """

    vocab_size: int  # the vocabulary the proposed ids belong to; must equal the target's
    # Indices into the target's `hidden_states` output that the drafter reads (None: it reads none). The engine
    # then asks the target for them in every forward and hands them over through `observe_target`.
    target_hidden_layers: list[int] | None = None
    device: torch.device  # where proposals are computed; must be the target's device

    def __init__(self) -> None:
        self.time_s = 0.0
        self.lm_head_time_s = 0.0
        self.steps = 0

    def reset(self) -> None:
        """Forget any previous request: empty caches, zero counters."""
        self.time_s = 0.0
        self.lm_head_time_s = 0.0
        self.steps = 0

    def prefill(self, context: torch.Tensor) -> None:
        """Process the prompt [1, L] before the first proposal (timed by the engine as prefill, not drafting)."""
        raise NotImplementedError

    def propose(
        self, context: torch.Tensor, num_tokens: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        """Propose `num_tokens` tokens continuing `context` [1, length]."""
        raise NotImplementedError

    def propose_tree(
        self, context: torch.Tensor, shape: TreeShape, sampling: SamplingParams, generator: torch.Generator | None
    ) -> TokenTree:
        """Propose a token tree of `shape` whose root is the pending token context[0, -1] (see spec/tree.py)."""
        raise FrspecError(f"{type(self).__name__} cannot draft token trees")

    def observe_target(self, hidden_states, rows: torch.Tensor | None = None) -> None:
        """Receive the target's hidden states (its `hidden_states` output) at `rows` of its last forward (default
        all), for the positions that follow those already observed. Only called if `target_hidden_layers` is set."""

    def rollback(self, length: int) -> None:
        """Keep only state for the first `length` tokens of the context (the rest was rejected or is new)."""
        raise NotImplementedError


def check_token_map(token_map: TokenMap, vocab_size: int, what: str, tokenizer=None) -> None:
    """Refuse a map built for another vocabulary: its size must be the model's (LM-head rows) and, given the
    tokenizer, the map must have been made with it (`TokenMap.check_tokenizer`)."""
    token_map.check_vocab_size(vocab_size, what)
    if tokenizer is not None:
        from frspec.models.tokenizer import tokenizer_identity

        token_map.check_tokenizer(tokenizer_identity(tokenizer), vocab_size)


def _check_plain_logits(model: torch.nn.Module) -> None:
    # The drafter computes logits as head(base(x)); models that scale or soft-cap logits after the head would draft
    # from a different distribution than they define.
    config = model.config
    for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(config, attr, None) not in (None, 1, 1.0):
            raise FrspecError(f"draft models with {attr} are not supported (logits are not head(hidden))")
    if model.base_model is model:
        raise FrspecError(f"{type(model).__name__} does not expose a base model to run without its LM head")


class DraftModelDrafter(Drafter):
    """An independent draft causal LM proposing a chain or a tree, optionally restricted to a token map (FR-Spec).

    The drafter runs the model's base (no head), then applies the head to the last position only; with a token map
    the head is a `PrunedLMHead`, so only the map's k rows are ever multiplied and drafted indices are mapped back
    to target ids. The model itself is not modified.
    """

    def __init__(self, model: torch.nn.Module, token_map: TokenMap | None = None):
        super().__init__()
        _check_plain_logits(model)
        full_head = model.get_output_embeddings()
        if getattr(full_head, "weight", None) is None:
            raise FrspecError(f"{type(model).__name__} has no linear LM head to draft with")
        self.model = model
        self.base = model.base_model
        self.vocab_size = vocab_size_of(model)
        self.device = next(model.parameters()).device
        self.token_map = token_map
        if token_map is not None:
            check_token_map(token_map, self.vocab_size, "the draft model")
            self.head: torch.nn.Module = PrunedLMHead(full_head.weight, token_map.ids, getattr(full_head, "bias", None))
            self.support: torch.Tensor | None = self.head.ids
        else:
            self.head = full_head
            self.support = None
        self.cache = new_cache(model)

    def reset(self) -> None:
        super().reset()
        self.cache = new_cache(self.model)

    def prefill(self, context: torch.Tensor) -> None:
        self.base(input_ids=context.to(self.device), cache=self.cache, use_cache=True)
        enable_rollback(self.cache)

    def propose(
        self, context: torch.Tensor, num_tokens: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        start = now(self.device)
        inputs = context[:, cache_length(self.cache) :].to(self.device)
        if inputs.shape[1] == 0:
            raise ValueError("propose() needs at least one token the drafter has not processed")
        indices, probs = [], []
        for _ in range(num_tokens):
            hidden = self.base(input_ids=inputs, cache=self.cache, use_cache=True).last_hidden_state[:, -1]
            head_start = now(self.device)
            logits = self.head(hidden)  # [1, k or V]
            if sampling.is_greedy:
                idx = logits.argmax(-1)
            else:
                q = logits_to_probs(logits, sampling)
                idx = sample(q, generator)
                probs.append(q)
            self.lm_head_time_s += now(self.device) - head_start
            indices.append(idx)
            inputs = self._to_target(idx).view(1, 1)
        # The last drafted token is not fed to the model: it is only needed if all drafts are accepted, and then
        # the next propose() feeds it together with the target's bonus token.
        index_t = torch.cat(indices)
        draft = Draft(
            token_ids=self._to_target(index_t),
            indices=index_t,
            probs=torch.cat(probs) if probs else None,
            support=self.support,
        )
        self.steps += num_tokens
        self.time_s += now(self.device) - start
        return draft

    def propose_tree(
        self, context: torch.Tensor, shape: TreeShape, sampling: SamplingParams, generator: torch.Generator | None
    ) -> TokenTree:
        check_tree_support(self.model, "the draft model")
        start = now(self.device)
        n = context.shape[1]
        inputs = context[:, cache_length(self.cache) :].to(self.device)
        if inputs.shape[1] == 0:
            raise ValueError("propose_tree() needs at least one token the drafter has not processed")
        # Catch up to the root (the pending token) as in propose(); the tree's nodes then follow in the cache.
        root_hidden = self.base(input_ids=inputs, cache=self.cache, use_cache=True).last_hidden_state[0, -1:]
        self.steps += 1
        cached: list[int] = []

        def expand(tree: TokenTree, nodes: list[int]) -> torch.Tensor:
            ids, pos, mask = expansion_inputs(tree, nodes, cached, n, dtype=root_hidden.dtype, device=self.device)
            hidden = self.base(input_ids=ids, position_ids=pos, attention_mask=mask, cache=self.cache, use_cache=True)
            cached.extend(nodes)
            self.steps += 1
            return self._timed_head(hidden.last_hidden_state[0])

        tree = grow_tree(
            int(context[0, -1]), self._timed_head(root_hidden)[0], shape, expand, sampling, generator,
            draft_to_target=self.support, vocab_size=self.vocab_size,
        )
        # Forget the tree: rejected nodes must go, and accepted ones are cheaper to re-run with the next tokens
        # than to pick out of the cache.
        truncate_cache(self.cache, n)
        self.time_s += now(self.device) - start
        return tree

    def rollback(self, length: int) -> None:
        truncate_cache(self.cache, length)

    def _timed_head(self, hidden: torch.Tensor) -> torch.Tensor:
        head_start = now(self.device)
        logits = self.head(hidden)
        self.lm_head_time_s += now(self.device) - head_start
        return logits

    def _to_target(self, idx: torch.Tensor) -> torch.Tensor:
        return idx if self.support is None else self.support[idx]
