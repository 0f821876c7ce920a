"""MTP heads: the multi-token-prediction layers a checkpoint ships next to its target model, as drafting heads.

An MTP layer drafts like an EAGLE-1/2 head, from the target's own last hidden state and the next token:

    features = post_norm(block(eh_proj([enorm(embed(token)), hnorm(hidden)])))     (MiMo: [hnorm(h), enorm(e)])
    logits   = target_lm_head(features)                                            the shared head

`block` is one decoder layer of the target's own family (full attention; MoE where the family's MTP layer is MoE).
The layer itself is transformers' `MtpModel` (modeling_layers.py), which ties the embedding, rotary and LM head to the
target's modules (shared, never copied); transformers' own loading (`MtpModel.from_pretrained`) only finds layers
at the published full-size indices, so the weights are selected here, in each family's published layout, and
handed to transformers' converter (which also fuses per-expert MoE tensors):

    DeepSeek-V3, GLM-4.5   model.layers.{N+i}.{enorm,hnorm,eh_proj,shared_head.norm,<decoder layer>}, N = layers
    Qwen3-Next, Qwen3.5    mtp.{fc,pre_fc_norm_embedding,pre_fc_norm_hidden,norm,layers.{i}.<decoder layer>}
    MiMo                   model.mtp_layers.{i}.{token_layernorm,hidden_layernorm,input_proj,final_layernorm,<layer>}

Copies of the embedding and head some checkpoints carry inside the MTP layer (DeepSeek-V3's `shared_head.head`,
`embed_tokens`) are not loaded: the target's are the same matrices. FR-Spec on the shared head is a DraftVocab
(a pruned copy of the target's head rows), exactly as for an EAGLE head. `MtpHead` gives a drafter the EAGLE head
interface (models/eagle.py), so decode/mtp_drafter.py drafts chains and trees with the EAGLE drafting loop.
"""

from __future__ import annotations

import copy
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from frspec.errors import FrspecError
from frspec.models.attention import causal_mask
from frspec.models.eagle import EagleHead

SAFETENSORS_INDEX = "model.safetensors.index.json"
# Families whose MTP decoder layer is a transformers class we can instantiate from the target's own layers.
# MiMo keys are renamed into the DeepSeek layout (same parts, other names).
_MIMO_RENAMES = {"token_layernorm": "enorm", "hidden_layernorm": "hnorm", "input_proj": "eh_proj",
                 "final_layernorm": "shared_head.norm"}
# Copies of the target's embedding and head inside an MTP layer: the target's own modules are used instead.
_SHARED_COPIES = re.compile(r"\.(shared_head\.head|embed_tokens)\.")


@dataclass(frozen=True)
class MtpLayout:
    """Which published layout a checkpoint's MTP weights use, and how many MTP layers it has."""

    family: str  # "deepseek" (DeepSeek-V3, GLM-4.5), "qwen" (Qwen3-Next, Qwen3.5), "mimo"
    num_layers: int
    keys: tuple[str, ...]  # the checkpoint keys of the MTP weights


def checkpoint_keys(source: str | os.PathLike) -> dict[str, Path]:
    """Every tensor name in a local safetensors checkpoint directory, with the file that holds it."""
    source = Path(source)
    index = source / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {k: source / f for k, f in weight_map.items()}
    files = sorted(source.glob("*.safetensors"))
    if not files:
        raise FrspecError(f"{str(source)!r} has no safetensors weights to read MTP layers from")
    from safetensors import safe_open

    keys: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            keys.update({k: f for k in handle.keys()})
    return keys


def detect_mtp(source: str | os.PathLike, num_hidden_layers: int) -> MtpLayout | None:
    """The MTP layout of the checkpoint in `source` (a local directory), or None when it carries no MTP weights."""
    if not Path(source).is_dir():
        return None
    try:
        keys = list(checkpoint_keys(source))
    except FrspecError:
        return None
    qwen = [k for k in keys if k.startswith("mtp.")]
    if qwen:
        layers = {m.group(1) for k in qwen if (m := re.match(r"mtp\.layers\.(\d+)\.", k))}
        return MtpLayout("qwen", len(layers), tuple(qwen))
    mimo = [k for k in keys if k.startswith("model.mtp_layers.")]
    if mimo:
        layers = {k.split(".")[2] for k in mimo}
        return MtpLayout("mimo", len(layers), tuple(mimo))
    extra = [k for k in keys if (m := re.match(r"model\.layers\.(\d+)\.", k)) and int(m.group(1)) >= num_hidden_layers]
    if any(k.endswith(".eh_proj.weight") for k in extra):
        layers = {k.split(".")[2] for k in extra}
        return MtpLayout("deepseek", len(layers), tuple(extra))
    return None


def builtin_config(source: str | os.PathLike):
    """A transformers config for a checkpoint whose own model class is remote code but whose architecture
    transformers has: MiMo (model_type "mimo", `MiMoForCausalLM`) is Qwen2 plus MTP layers. None for any other."""
    path = Path(source) / "config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("model_type") != "mimo":
        return None
    from transformers import Qwen2Config

    return Qwen2Config(**{k: v for k, v in data.items() if k not in ("model_type", "architectures", "auto_map")})


class _TargetView:
    """What transformers' MtpModel reads from its main model, with our own copy of the config (the target's config
    is not modified) carrying the MTP fields it expects."""

    def __init__(self, target: nn.Module, config):
        self.config = config
        self._target = target
        self.lm_head = target.get_output_embeddings()

    def get_decoder(self):
        return self._target.get_decoder()

    def get_input_embeddings(self):
        return self._target.get_input_embeddings()


def _mtp_config(target: nn.Module, layout: MtpLayout):
    config = copy.deepcopy(target.config)
    text = config.get_text_config(decoder=True)
    text.num_mtp_layers = layout.num_layers
    if getattr(text, "layer_types", None) is not None:
        text.mtp_layer_types = ["full_attention"] * layout.num_layers  # every published MTP layer is full attention
    if getattr(text, "mlp_layer_types", None) is not None:
        text.mtp_mlp_layer_types = [text.mlp_layer_types[-1]] * layout.num_layers
    if layout.family == "mimo":
        text.mtp_hidden_states_first = True
    return config


def _renamed(key: str, layout: MtpLayout, num_hidden_layers: int) -> str:
    """A MiMo key in the DeepSeek layout transformers' converter reads; other layouts pass as they are."""
    if layout.family != "mimo":
        return key
    _, _, i, rest = key.split(".", 3)
    part, _, tail = rest.partition(".")
    return f"model.layers.{num_hidden_layers + int(i)}.{_MIMO_RENAMES.get(part, part)}.{tail}"


def load_mtp_model(target: nn.Module, source: str | os.PathLike, layout: MtpLayout | None = None) -> nn.Module:
    """transformers' MtpModel for `target` with the MTP weights read from the checkpoint directory `source`."""
    from safetensors import safe_open
    from transformers.core_model_loading import convert_and_load_state_dict_in_model
    from transformers.modeling_layers import MtpModel
    from transformers.modeling_utils import LoadStateDictConfig

    num_hidden = int(target.config.get_text_config(decoder=True).num_hidden_layers)
    layout = layout or detect_mtp(source, num_hidden)
    if layout is None:
        raise FrspecError(f"{str(source)!r} carries no MTP layers (no mtp.*, model.mtp_layers.* or extra layers)")
    param = next(target.parameters())
    view = _TargetView(target, _mtp_config(target, layout))
    try:
        mtp = MtpModel(view, layout.num_layers)
    except (ValueError, TypeError, AttributeError) as e:
        raise FrspecError(f"cannot build the MTP layers of {type(target).__name__}: {e}") from e
    mtp.to(dtype=param.dtype, device=param.device)
    files = checkpoint_keys(source)
    handles, state = {}, {}
    for key in layout.keys:
        if _SHARED_COPIES.search(key):
            continue
        f = files[key]
        if f not in handles:
            handles[f] = safe_open(str(f), framework="pt", device="cpu")
        state[_renamed(key, layout, num_hidden)] = handles[f].get_slice(key)
    info, _ = convert_and_load_state_dict_in_model(
        model=mtp, state_dict=state,
        load_config=LoadStateDictConfig(weight_mapping=mtp.get_weight_conversions(target), device_map=None,
                                        dtype=param.dtype),
    )
    missing = sorted(k for k in info.missing_keys if k not in ("embed_tokens.weight", "shared_head.weight"))
    unexpected = sorted(info.unexpected_keys)
    if missing or unexpected:
        what = f"missing {missing[:4]}" if missing else f"unexpected {unexpected[:4]}"
        raise FrspecError(f"the MTP weights in {str(source)!r} do not fit {type(target).__name__}'s layers: {what}")
    mtp.tie_with_main_model(view)  # the target's embedding, head and rotary, shared
    mtp.eval()
    mtp.requires_grad_(False)
    return mtp.to(device=param.device)


class MtpHead(EagleHead):
    """An MTP layer behind the EAGLE head interface (models/eagle.py): drafts from the target's final hidden state.

    Every depth of a draft runs MTP layer `depth_layer` (0: the first, as vLLM's MTP proposer does), recursively on
    its own features below the root, so a draft may be deeper than the number of MTP layers."""

    version = 2  # drafted like an EAGLE-1/2 head: target's last hidden state in, the target's LM head out

    def __init__(self, mtp: nn.Module, target: nn.Module, layout: MtpLayout, depth_layer: int = 0):
        lm_head = target.get_output_embeddings()
        if getattr(lm_head, "weight", None) is None:  # e.g. an int4/int8 head (models/quant.py) keeps it packed
            raise FrspecError(f"MTP drafting shares the target's LM head, but the target's head is "
                              f"{type(lm_head).__name__} without a float weight: load the target without --quant")
        super().__init__(mtp.config, target.get_input_embeddings(), mtp.rotary_emb, lm_head,
                         torch.arange(lm_head.weight.shape[0]))
        self.mtp = mtp
        self.layout = layout
        self.depth_layer = int(depth_layer)
        softcap = getattr(mtp.config, "final_logit_softcapping", None)
        if softcap or getattr(mtp.config, "logits_mup_width_multiplier", None) is not None:
            raise FrspecError("MTP heads whose logits are not the plain head(features) are not supported")

    @property
    def num_layers(self) -> int:
        return len(self.mtp.layers)

    def target_layer_ids(self, num_target_layers: int) -> list[int]:
        return [num_target_layers]  # the final-normed state the target's LM head reads

    def features_from_target(self, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
        return hidden_states[-1]

    def lm_head_input(self, features: torch.Tensor) -> torch.Tensor:
        return features  # MtpLayer already applied its post norm (DeepSeek's shared_head.norm, Qwen's mtp.norm)

    def forward(self, input_ids, hidden, position_ids, attention_mask=None, cache=None) -> torch.Tensor:
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)
        if attention_mask is None:
            past = cache.get_seq_length(self.depth_layer) if cache is not None else 0
            attention_mask = causal_mask(input_ids.shape[1], past, dtype=hidden.dtype, device=hidden.device)
        position_embeddings = None
        if self.rotary_emb is not None:
            position_embeddings = self.rotary_emb(hidden, position_ids)
        features = self.mtp.layers[self.depth_layer](
            embeds, hidden, position_embeddings=position_embeddings, attention_mask=attention_mask.to(hidden.dtype),
            position_ids=position_ids, cache=cache,
        )
        if getattr(self.mtp, "use_shared_post_norm", False):
            features = self.mtp.shared_post_norm(features)
        return features


def load_mtp_head(target: nn.Module, source: str | os.PathLike) -> MtpHead:
    """The MTP head of the checkpoint `source` (the target's own directory) for `target`."""
    num_hidden = int(target.config.get_text_config(decoder=True).num_hidden_layers)
    layout = detect_mtp(source, num_hidden)
    if layout is None:
        raise FrspecError(f"{str(source)!r} carries no MTP layers (no mtp.*, model.mtp_layers.* or extra layers)")
    return MtpHead(load_mtp_model(target, source, layout), target, layout)
