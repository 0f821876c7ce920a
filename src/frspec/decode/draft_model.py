"""DraftModelDrafter: an independent small causal LM drafting chains (token by token) or trees (with tree masks).

Its prefill is the drafter's own cost of a request before it drafts anything: a forward over the whole prompt, paid
again for every request. Given a window of W tokens, it reads only the prompt's first W/2 tokens (the chat template's
opening, the system prompt and, in prompts that carry one, the instruction before a document: "continue this list
in German", "answer from this text") and its last W/2, at consecutive positions, as if the prompt had been that
short. A proposal from less context may be accepted less often, never wrongly: the target verifies every proposal
against its own full context. The controller picks the window a request's tokens can win back (decode/controller.py,
`drafter_prefill_tokens`). (Measured before choosing the halves, the 0.5B Qwen2.5-Coder drafter's teacher-forced
agreement with its target's greedy answers on two German/Spanish continuation prompts of ~620 tokens: 0.98 reading
the whole prompt, 0.51 with a window of 256 that kept only the first 32 or 64 tokens, which cut the instruction, 0.96
keeping the first 128; on held-out code 0.87 whole and 0.88-0.90 windowed; on long-input QA of ~4k tokens, whose
answers copy the document, 0.86-0.92 whole and 0.44-0.50 windowed.)
"""

from __future__ import annotations

import torch

from frspec.decode.drafter import Drafter
from frspec.decode.hybrid_target import is_hybrid
from frspec.decode.kv_cache import (
    cache_length, enable_rollback, new_cache, sliding_layers_keep_everything, truncate_cache,
)
from frspec.decode.sampling import SamplingParams
from frspec.decode.timing import now
from frspec.decode.token_tree import TokenTree, check_tree_support, expansion_inputs
from frspec.decode.tree_growth import KeepDrafting, add_children, grow_tree, pick_probability
from frspec.decode.tree_shape import TreeShape
from frspec.errors import FrspecError
from frspec.models.loading import check_context_length, vocab_size_of
from frspec.models.quant import parse_quant, quantize_linear
from frspec.vocab.context_vocab import build_draft_vocab
from frspec.vocab.token_map import TokenMap


# The windows the controller may choose among (`DraftModelDrafter.prefill`), each halving the one before's prefill.
PROMPT_WINDOWS = (2048, 1024, 512, 256)


def _check_plain_logits(model: torch.nn.Module) -> None:
    # The drafter computes logits as head(base(x)) (soft-capped, see `_softcap`); models that scale logits after
    # the head would draft from a different distribution than they define.
    config = model.config
    for attr in ("logit_scale", "logits_scaling"):
        if getattr(config, attr, None) not in (None, 1, 1.0):
            raise FrspecError(f"draft models with {attr} are not supported (logits are not head(hidden))")
    if model.base_model is model:
        raise FrspecError(f"{type(model).__name__} does not expose a base model to run without its LM head")


def _softcap(model: torch.nn.Module) -> float | None:
    """The model's final logit soft-cap (Gemma 2: 30; Gemma 3 ships none), applied as cap * tanh(logits / cap)
    after the head. It is elementwise, so the capped logits of a map's rows are the full head's at those rows."""
    cap = getattr(model.config, "final_logit_softcapping", None)
    return float(cap) if cap else None


class DraftModelDrafter(Drafter):
    """An independent draft causal LM, optionally restricted to a token map (FR-Spec).

    The drafter runs the model's base (no head), then its DraftVocab's head on the positions it drafts from; with a
    token map only the map's k rows are ever multiplied. The model itself is not modified.
    """

    kind = "draft"
    prompt_windows = PROMPT_WINDOWS
    late_prefill = True

    def __init__(self, model: torch.nn.Module, token_map: TokenMap | None = None, context_rows: int = 0,
                 context_budget: str = "fixed", ranked: bool = False, head_quant: str | None = None):
        """`context_rows` > 0 makes the vocabulary context-aware (vocab/context_vocab.py): besides the map's
        rows, up to that many rows for the request's prompt and generated tokens, within the map's k rows
        (`context_budget="fixed"`) or added to them ("additive"). `ranked`: the map is a frequency ranking and
        the head serves every map size, chosen per step (vocab/ranked_vocab.py). `head_quant` ("int4", "int8")
        quantizes the vocabulary's head once its rows are selected (a context-aware one stays float: its rows change
        per request; a ranked one is packed once, whole, every size its first rows); load a quantized draft with its
        head float (load_model(..., quantize_head=False)) for that."""
        super().__init__()
        _check_plain_logits(model)
        if is_hybrid(model):
            # Its recurrent state cannot be cut back after a rejected draft (transformers' crop only rewinds the
            # convolution window), so it would draft from a state that saw rejected tokens.
            raise FrspecError("draft models with linear-attention layers (Qwen3-Next, Qwen3.5) are not supported: "
                              "draft a hybrid target with its MTP layers (--mtp) or a full-attention draft model")
        full_head = model.get_output_embeddings()
        if getattr(full_head, "weight", None) is None:
            raise FrspecError(f"{type(model).__name__} has no linear LM head to draft with")
        self.model = model
        self.base = model.base_model
        self.softcap = _softcap(model)
        self.device = next(model.parameters()).device
        vocab_size = vocab_size_of(model)
        if token_map is not None:  # a cheap assert for a drafter built directly (build_drafter checked the map)
            token_map.check_vocab_size(vocab_size, "the draft model")
        self.vocab = build_draft_vocab(full_head.weight, getattr(full_head, "bias", None), token_map,
                                       vocab_size=vocab_size, context_rows=context_rows,
                                       context_budget=context_budget, ranked=ranked)
        if parse_quant(head_quant) is not None:
            self.vocab.quantize_head(lambda linear: quantize_linear(linear, head_quant))
        self.cache = new_cache(model)

    @property
    def weights(self) -> torch.nn.Module:
        return self.model

    def check_request_lengths(self, prompt_tokens: int, max_new_tokens: int) -> None:
        check_context_length(self.model, prompt_tokens, max_new_tokens, "the draft model")

    def check_shape(self, shape: TreeShape) -> None:
        if shape.kind != "chain":
            check_tree_support(self.model, "the draft model")

    def reset(self) -> None:
        super().reset()
        self.cache = new_cache(self.model)
        self.skipped = 0

    def prefill(self, context: torch.Tensor, window: int | None = None) -> None:
        """With `window`, a prompt longer than it is read as its first `window // 2` tokens and the rest of the window
        from its end (module docstring); the tokens between are left out of this request's drafter cache, which then
        holds `skipped` fewer tokens than the context (what `propose` and `rollback` count with)."""
        self._begin_request(context)
        length = context.shape[1]
        if window is not None and length > window:
            if window < 2:
                raise FrspecError(f"a drafter prompt window reads the prompt's start and end: 2 tokens or more, "
                                  f"not {window}")
            head, self.skipped = window // 2, length - window
            context = torch.cat([context[:, :head], context[:, head + self.skipped :]], dim=1)
        self.base(input_ids=context.to(self.device), cache=self.cache, use_cache=True)
        enable_rollback(self.cache)

    def propose(
        self, context: torch.Tensor, shape: TreeShape, sampling: SamplingParams, generator: torch.Generator | None,
        keep_drafting: KeepDrafting | None = None,
    ) -> TokenTree:
        start = now(self.device)
        inputs = context[:, cache_length(self.cache) + self.skipped :].to(self.device)
        if inputs.shape[1] == 0:
            raise ValueError("propose() needs at least one token the drafter has not processed")
        self._add_request_tokens(inputs)  # the tokens accepted since the last proposal, and the root
        root = int(context[0, -1])
        if shape.kind == "chain":
            tree = self._chain(root, inputs, shape.depth, sampling, generator, keep_drafting)
        else:
            tree = self._tree(root, inputs, context.shape[1] - self.skipped, shape, sampling, generator)
        self.time_s += now(self.device) - start
        return tree

    def _chain(self, root: int, inputs, depth: int, sampling, generator, keep_drafting) -> TokenTree:
        """Draft up to `depth` tokens one after another with the model's own causal mask (no tree mask needed),
        fewer where `keep_drafting` says stop.

        Each token is chosen by `add_children`, the rule trees use too (one child per node)."""
        tree, node = TokenTree.from_root(root), 0
        for level in range(1, depth + 1):
            hidden = self.base(input_ids=inputs, cache=self.cache, use_cache=True).last_hidden_state[:, -1]
            self.steps += 1
            # LM-head time is the head alone, as for trees; choosing the child counts as drafting time.
            logits = self._logits(hidden)[0]
            parent, node = node, add_children(tree, node, logits, 1, sampling, generator, self.vocab)[0]
            if keep_drafting is not None and not keep_drafting(pick_probability(tree, parent, node, logits, sampling)):
                break
            inputs = torch.tensor([[tree.tokens[node]]], device=self.device)
        # The last drafted token is not fed to the model: it is only needed if all drafts are accepted, and then
        # the next propose() feeds it together with the target's bonus token.
        return tree

    def _tree(self, root: int, inputs, n: int, shape: TreeShape, sampling, generator) -> TokenTree:
        """Draft a branching tree: each level of new nodes in one forward under a tree mask (`n`: the entries the
        cache holds once it has caught up to the root)."""
        # Catch up to the root (the pending token); the tree's nodes then follow in the cache.
        root_hidden = self.base(input_ids=inputs, cache=self.cache, use_cache=True).last_hidden_state[0, -1:]
        self.steps += 1
        cached: list[int] = []

        def expand(tree: TokenTree, nodes: list[int]) -> torch.Tensor:
            ids, pos, mask = expansion_inputs(tree, nodes, cached, n, dtype=root_hidden.dtype, device=self.device,
                                              config=self.model.config, cache=self.cache)
            hidden = self.base(input_ids=ids, position_ids=pos, attention_mask=mask, cache=self.cache, use_cache=True)
            cached.extend(nodes)
            self.steps += 1
            return self._logits(hidden.last_hidden_state[0])

        # Sliding-window layers: the cached nodes must not push prefix keys out of what attention is handed.
        with sliding_layers_keep_everything(self.cache):
            tree = grow_tree(root, self._logits(root_hidden)[0], shape, expand, sampling, generator,
                             vocab=self.vocab)
        # Forget the tree: rejected nodes must go, and accepted ones are cheaper to re-run with the next tokens
        # than to pick out of the cache.
        truncate_cache(self.cache, n)
        return tree

    def rollback(self, length: int) -> None:
        truncate_cache(self.cache, length - self.skipped)

    def _capped(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.softcap is None else torch.tanh(logits / self.softcap) * self.softcap

    def _head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The draft LM head over this drafter's vocabulary, soft-capped like the model's own."""
        return self._capped(self.vocab.logits(hidden))
