"""The one decode step, and the prefill before it.

Invariant between steps: `buf[:, :length]` holds prompt and accepted tokens; the last of them ("pending") has not
been processed by the target yet, so the target cache covers `length - 1` tokens and the drafter's cache at most
that. A step:

    propose   the drafter drafts a token tree rooted at the pending token (a chain is a tree of width 1; vanilla
              decoding, or a step at the end of the token budget, is the root alone);
    forward   the target runs once over the tree's nodes: a chain through the model's plain causal path, a
              branching tree with a tree attention mask and tree positions;
    verify    the one verifier (verify.py) picks the accepted path and the target's next token;
    cache     the target cache keeps the accepted path (a crop when the path is a prefix of node order, which a
              chain's always is; a gather otherwise: kv_cache.py); a hybrid target's linear-attention layers take
              the states recorded at the path's last node (hybrid_target.py);
    hidden    a drafter that reads the target's hidden states gets those of the accepted path, from this same
              forward (no extra target forward);
    rollback  the drafter cuts its own state back to the new committed length.

The step returns what it did; the engine records it in the stats once it knows how many tokens survive EOS and
stop strings.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from frspec.decode.drafter import Drafter
from frspec.decode.hybrid_target import hybrid_target_forward, is_hybrid, keep_hybrid_path
from frspec.decode.kv_cache import enable_rollback, keep_path, new_cache
from frspec.decode.sampling import SamplingParams, make_generator
from frspec.decode.timing import now
from frspec.decode.token_tree import TokenTree
from frspec.decode.tree_growth import KeepDrafting
from frspec.decode.tree_shape import TreeShape
from frspec.decode.verify import verify


@dataclass
class DecodeState:
    """The running state of one generation."""

    buf: torch.Tensor  # [1, capacity] token ids: prompt, then accepted tokens
    length: int  # valid tokens in buf
    cache: object  # the target's KV cache
    sampling: SamplingParams
    generator: torch.Generator | None


@dataclass
class StepResult:
    """What one decode step did: the tokens it commits (accepted drafts, then one target token) and its counts."""

    tokens: list[int]
    drafted_depth: int  # depth of the proposed tree (0: the root alone)
    accepted: int  # accepted drafted tokens (tokens[:accepted] are drafts)
    draft_tokens: int  # drafted nodes the target verified
    target_time_s: float
    # What was verified, for the controller's expected acceptance (decode/acceptance.py): the tree, the target's
    # logits at its nodes, and the accepted path.
    tree: TokenTree | None = None
    target_logits: torch.Tensor | None = None
    path: list[int] | None = None


def start_state(
    target: torch.nn.Module, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams
) -> DecodeState:
    device = next(target.parameters()).device
    buf = torch.empty((1, len(prompt_ids) + max_new_tokens + 1), dtype=torch.long, device=device)
    buf[0, : len(prompt_ids)] = torch.tensor(prompt_ids, dtype=torch.long)
    generator = None if sampling.is_greedy else make_generator(sampling.seed, device)
    return DecodeState(buf, len(prompt_ids), new_cache(target), sampling, generator)


def prefill(target: torch.nn.Module, drafter: Drafter | None, state: DecodeState, hidden_layers,
            drafter_window: int | None = None) -> int:
    """Run the target over the prompt and choose the first token (`prefill_target`), then prime the drafter
    (`prefill_drafter`)."""
    first = prefill_target(target, drafter, state, hidden_layers)
    if drafter is not None:
        prefill_drafter(drafter, state, drafter_window)
    return first


def prefill_target(target: torch.nn.Module, drafter: Drafter | None, state: DecodeState, hidden_layers) -> int:
    """Run the target over the prompt and choose the first token (verifying the root-only tree); an EAGLE/MTP
    drafter (`hidden_layers` given) observes the target's hidden states."""
    n = state.length
    out = target(
        input_ids=state.buf[:, :n], cache=state.cache, use_cache=True, logits_to_keep=1,
        output_hidden_states=hidden_layers,
    )
    enable_rollback(state.cache)
    if hidden_layers is not None:
        drafter.observe_target(out.hidden_states)
    root = TokenTree.from_root(int(state.buf[0, n - 1]))
    first = verify(root, out.logits[0, -1:], state.sampling, state.generator).tokens[0]
    state.buf[0, n] = first
    state.length = n + 1
    return first


def prefill_drafter(drafter: Drafter, state: DecodeState, window: int | None = None) -> None:
    """Prime the drafter over the prompt, after `prefill_target` (over a window of it where given:
    Drafter.prefill)."""
    drafter.prefill(state.buf[:, : state.length - 1], window=window)


def decode_step(
    target: torch.nn.Module,
    drafter: Drafter | None,
    state: DecodeState,
    shape: TreeShape | None,
    hidden_layers: list[int] | None,
    remaining: int,
    keep_drafting: KeepDrafting | None = None,
) -> StepResult:
    """One speculative step (module docstring); `remaining` is how many tokens the request may still emit;
    `keep_drafting` may end a chain before its shape's depth (tree_growth.KeepDrafting)."""
    device = state.buf.device
    n = state.length
    past = n - 1  # the target cache holds everything but the pending token, the tree's root
    # Drafts beyond the token budget could never be emitted: draft at most remaining - 1 (the target adds one).
    # shape None with a drafter: a plain step inside a speculative request (the controller chose not to draft).
    depth = 0 if drafter is None or shape is None else min(shape.depth, remaining - 1)
    if depth >= 1:
        tree = drafter.propose(state.buf[:, :n], shape.with_depth(depth), state.sampling, state.generator,
                               keep_drafting)
        if shape.kind == "chain":
            depth = tree.max_depth  # it may have stopped early
    else:
        depth, tree = 0, TokenTree.from_root(int(state.buf[0, n - 1]))
    start = now(device)
    if is_hybrid(target):  # linear-attention layers: per-node states, restored below (hybrid_target.py)
        out, linear_states = hybrid_target_forward(target, tree, state.cache, past, hidden_layers)
    else:
        out, linear_states = _target_forward(target, tree, state.cache, past, hidden_layers), None
    target_time = now(device) - start
    verdict = verify(tree, out.logits[0], state.sampling, state.generator)
    if linear_states is not None:
        keep_hybrid_path(state.cache, past, verdict.path, linear_states)
    else:
        keep_path(state.cache, past, verdict.path)
    if hidden_layers is not None:
        drafter.observe_target(out.hidden_states, torch.tensor(verdict.path, device=device))
    new = verdict.tokens
    state.buf[0, n : n + len(new)] = torch.tensor(new, dtype=torch.long)
    state.length = n + len(new)
    if drafter is not None:
        drafter.rollback(state.length - 1)
    return StepResult(new, depth, verdict.num_accepted, tree.num_drafts, target_time, tree, out.logits[0],
                      verdict.path)


def _target_forward(target: torch.nn.Module, tree: TokenTree, cache, past: int, hidden_layers):
    """The target over every tree node, appending them to `cache` after its `past` entries."""
    param = next(target.parameters())
    kwargs = {}
    if hidden_layers is not None:
        kwargs["output_hidden_states"] = hidden_layers
    if not tree.is_chain:
        # Each node sees the committed prefix and its own ancestors, at position past + depth.
        kwargs["attention_mask"] = tree.model_masks(target.config, cache, past, past, dtype=param.dtype,
                                                    device=param.device)
        kwargs["position_ids"] = tree.position_ids(past, device=param.device)
    return target(input_ids=tree.tokens_tensor(param.device)[None], cache=cache, use_cache=True, **kwargs)
