"""EAGLE draft heads: one small decoder layer that drafts from the target's own hidden states.

EAGLE-1/2 (`Eagle2Head`; EAGLE-2 only changes how trees are drafted, not the head):
    features = layers(fc([embed(token), hidden]))          fc: 2H -> H, layer 0 without an input norm
    logits   = target_lm_head(features)                    embedding and LM head shared with the target
The hidden state paired with token x_{t+1} is the target's last hidden state (after its final norm) at position t,
or, further down a draft, the head's own features at the parent node.

EAGLE-3 (`Eagle3Head`):
    hidden   = fc(concat of 3 target layers' hidden states) 3H -> H, only for states that come from the target
    features = midlayer(embed(token), hidden)              attention reads [norm(embed), norm(hidden)] (2H wide)
    logits   = lm_head(norm(features))                     its own head over a draft vocabulary of size Vd
    target id of draft index i = i + d2t[i]

Both heads expose the same interface to a drafter: `target_layer_ids`, `features_from_target`, `forward`,
`lm_head_input` and `lm_head` (what the LM head reads, and the head itself), `head_to_target` (the target id of
each LM-head row: EAGLE-3's d2t composed, the identity for EAGLE-1/2) and `draft_vocab(token_map)`, which builds a
drafter's own DraftVocab (FR-Spec: only the map's rows are scored). A head is never modified by drafting, so
several drafters (with different maps) can share one. Loading published checkpoints is in eagle_loading.py.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig, Qwen2Config
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

from frspec.models.attention import causal_mask
from frspec.vocab.context_vocab import build_draft_vocab
from frspec.vocab.draft_vocab import DraftVocab
from frspec.vocab.token_map import TokenMap


class EagleHead(nn.Module):
    """What the two EAGLE heads share: rotary positions, the shared embedding, the LM head and its target ids."""

    version: int

    def __init__(self, layer_config, embed_tokens: nn.Embedding, rotary: nn.Module, lm_head: nn.Module,
                 draft_ids: torch.Tensor):
        super().__init__()
        self.config = layer_config
        self.hidden_size = int(layer_config.hidden_size)
        self.embed_tokens = embed_tokens
        self.rotary_emb = rotary
        # `lm_head` scores the head's whole draft vocabulary, whose row i is target id head_to_target[i].
        self.lm_head = lm_head
        self.register_buffer("head_to_target", draft_ids.to(torch.long), persistent=False)

    @property
    def draft_vocab_size(self) -> int:
        """Rows of the head's own LM head."""
        return int(self.head_to_target.numel())

    @property
    def target_vocab_size(self) -> int:
        return int(self.embed_tokens.num_embeddings)

    def draft_vocab(self, token_map: TokenMap | None = None, context_rows: int = 0,
                    context_budget: str = "fixed", ranked: bool = False) -> DraftVocab:
        """A new DraftVocab over this head's LM head, restricted to `token_map` when given (the head is untouched);
        with `context_rows` a ContextVocab (vocab/context_vocab.py) whose request rows are only tokens this head
        can score (EAGLE-3: its d2t vocabulary); with `ranked` a RankedVocab: the whole head in the map's rank
        order, its size chosen per step (vocab/ranked_vocab.py)."""
        return build_draft_vocab(self.lm_head.weight, getattr(self.lm_head, "bias", None), token_map,
                                 head_to_target=self.head_to_target, vocab_size=self.target_vocab_size,
                                 context_rows=context_rows, context_budget=context_budget, ranked=ranked)

    def new_cache(self) -> DynamicCache:
        return DynamicCache()

    def target_layer_ids(self, num_target_layers: int) -> list[int]:
        """Indices into the target's `hidden_states` output (0 = embeddings, i = input of layer i) this head needs."""
        raise NotImplementedError

    def features_from_target(self, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
        """The head's hidden input [B, T, H] from the target's `hidden_states` output (a tuple over layers)."""
        raise NotImplementedError

    def lm_head_input(self, features: torch.Tensor) -> torch.Tensor:
        """What the LM head reads for head features [..., H]."""
        raise NotImplementedError

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Logits over the head's whole draft vocabulary (row i is target id `head_to_target[i]`)."""
        return self.lm_head(self.lm_head_input(features))

    def _decode(self, embeds, hidden, position_embeddings, attention_mask, cache) -> torch.Tensor:
        raise NotImplementedError

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: DynamicCache | None = None,
    ) -> torch.Tensor:
        """Features [B, q, H] for tokens input_ids [B, q] paired with hidden [B, q, H] (target or head features).

        attention_mask: a 4D additive mask over the cache plus these q tokens (a tree mask); None means causal.
        """
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)
        if attention_mask is None:
            past = cache.get_seq_length() if cache is not None else 0
            attention_mask = causal_mask(input_ids.shape[1], past, dtype=hidden.dtype, device=hidden.device)
        position_embeddings = self.rotary_emb(hidden, position_ids)
        return self._decode(embeds, hidden, position_embeddings, attention_mask.to(hidden.dtype), cache)


class Eagle2Head(EagleHead):
    """EAGLE-1/2: fc([embed, hidden]) then decoder layer(s) of the target's family; the target's LM head."""

    version = 2

    def __init__(self, layer_config, embed_tokens: nn.Embedding, lm_head: nn.Linear, fc_bias: bool = True,
                 first_input_norm: bool = False):
        family_layer, family_rotary = _family_classes(layer_config)
        super().__init__(layer_config, embed_tokens, family_rotary(config=layer_config), lm_head,
                         torch.arange(lm_head.weight.shape[0]))
        h = self.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=fc_bias)
        self.layers = nn.ModuleList(family_layer(layer_config, i) for i in range(layer_config.num_hidden_layers))
        if not first_input_norm:
            # The published EAGLE layer 0 normalises nothing on the way in: fc's output goes straight to attention.
            self.layers[0].input_layernorm = nn.Identity()

    def target_layer_ids(self, num_target_layers: int) -> list[int]:
        return [num_target_layers]  # the last entry: the final-normed state the target's LM head reads

    def features_from_target(self, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
        return hidden_states[-1]

    def lm_head_input(self, features: torch.Tensor) -> torch.Tensor:
        return features  # the target's own LM head reads the features as they are

    def _decode(self, embeds, hidden, position_embeddings, attention_mask, cache):
        x = self.fc(torch.cat([embeds, hidden], dim=-1))
        for layer in self.layers:
            x = layer(x, attention_mask=attention_mask, cache=cache, use_cache=cache is not None,
                      position_embeddings=position_embeddings)
        return x


class Eagle3DecoderLayer(nn.Module):
    """EAGLE-3's layer: attention over [input_layernorm(embed), hidden_norm(hidden)] (2H wide), residual on hidden.

    `norm_before_residual` (a speculators / vLLM config flag): the residual is hidden_norm(hidden) instead of the
    raw hidden state."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool = False):
        super().__init__()
        self.norm_before_residual = bool(norm_before_residual)
        h = config.hidden_size
        self.self_attn = LlamaAttention(config, layer_idx=0)
        bias = bool(getattr(config, "attention_bias", False))
        for name in ("q_proj", "k_proj", "v_proj"):
            out = getattr(self.self_attn, name).out_features
            setattr(self.self_attn, name, nn.Linear(2 * h, out, bias=bias))
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)

    def forward(self, embeds, hidden, position_embeddings, attention_mask, cache):
        normed = self.hidden_norm(hidden)
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        attn, _ = self.self_attn(hidden_states=x, position_embeddings=position_embeddings,
                                 attention_mask=attention_mask, cache=cache)
        hidden = (normed if self.norm_before_residual else hidden) + attn
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(EagleHead):
    """EAGLE-3: fused low/mid/high target layers, one midlayer, own norm and LM head over a draft vocabulary."""

    version = 3

    def __init__(self, layer_config: LlamaConfig, embed_tokens: nn.Embedding, draft_vocab_size: int,
                 target_hidden_size: int, target_vocab_size: int, aux_layer_ids: Sequence[int] | None = None,
                 norm_before_residual: bool = False):
        h = int(layer_config.hidden_size)
        lm_head = nn.Linear(h, draft_vocab_size, bias=False)
        super().__init__(layer_config, embed_tokens, LlamaRotaryEmbedding(config=layer_config), lm_head,
                         torch.arange(draft_vocab_size))
        self.fc = nn.Linear(3 * target_hidden_size, h, bias=False)
        self.midlayer = Eagle3DecoderLayer(layer_config, norm_before_residual)
        self.norm = LlamaRMSNorm(h, eps=layer_config.rms_norm_eps)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(target_vocab_size, dtype=torch.bool))
        self.aux_layer_ids = None if aux_layer_ids is None else [int(i) for i in aux_layer_ids]

    def set_vocab_maps(self, d2t: torch.Tensor, t2d: torch.Tensor | None = None) -> None:
        """Install the draft -> target offsets (target id = i + d2t[i]); t2d is derived when not given."""
        d2t = d2t.to(dtype=torch.long, device=self.d2t.device)
        ids = torch.arange(d2t.numel(), device=d2t.device) + d2t
        if t2d is None:
            t2d = torch.zeros_like(self.t2d)
            t2d[ids] = True
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d.to(torch.bool))
        self.head_to_target = ids

    def target_layer_ids(self, num_target_layers: int) -> list[int]:
        if self.aux_layer_ids is not None:
            return list(self.aux_layer_ids)
        # EAGLE-3 reads the inputs of layers 2, N/2 and N-3 (low, middle, high features).
        return [2, num_target_layers // 2, num_target_layers - 3]

    def features_from_target(self, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
        num_layers = len(hidden_states) - 1
        picked = [hidden_states[i] for i in self.target_layer_ids(num_layers)]
        return self.fc(torch.cat(picked, dim=-1))

    def lm_head_input(self, features: torch.Tensor) -> torch.Tensor:
        return self.norm(features)

    def _decode(self, embeds, hidden, position_embeddings, attention_mask, cache):
        return self.midlayer(embeds, hidden, position_embeddings, attention_mask, cache)


def _family_classes(config) -> tuple[type, type]:
    if isinstance(config, Qwen2Config):
        return Qwen2DecoderLayer, Qwen2RotaryEmbedding
    return LlamaDecoderLayer, LlamaRotaryEmbedding
