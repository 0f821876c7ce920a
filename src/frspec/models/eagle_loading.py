"""Loading published EAGLE heads (EAGLE-1/2 and EAGLE-3 releases) for a given target model.

A head is a directory (local, or a hub id fetched with huggingface_hub) with `config.json` and weights in
`model.safetensors`, `pytorch_model.bin`, or sharded versions of either with an index file. Tensor names are
those of the EAGLE project's releases:

    EAGLE-1/2  fc.weight [H, 2H] (+ fc.bias), layers.{i}.self_attn.{q,k,v,o}_proj.*, layers.{i}.mlp.*,
               layers.{i}.post_attention_layernorm.weight, layers.{i>0}.input_layernorm.weight,
               embed_tokens.weight (optional: otherwise the target's embedding is shared)
    EAGLE-3    fc.weight [H, 3H_target], midlayer.{self_attn,mlp}.*, midlayer.{input_layernorm,hidden_norm,
               post_attention_layernorm}.weight, norm.weight, lm_head.weight [Vd, H], d2t [Vd], t2d [V],
               embed_tokens.weight (optional)

The head must fit the target: same hidden size (EAGLE-3: fc reads 3 x the target's), same vocabulary, and an
EAGLE-3 head with a reduced draft vocabulary needs its d2t map. Anything else is refused with a FrspecError.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig, PreTrainedModel, Qwen2Config

from frspec.errors import FrspecError
from frspec.models.attention import ARBITRARY_MASK_ATTENTION
from frspec.models.eagle import Eagle2Head, Eagle3Head, EagleHead
from frspec.models.loading import vocab_size_of

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Config keys that describe the checkpoint rather than the layer; the layer config must not inherit them.
_NON_LAYER_KEYS = ("architectures", "auto_map", "model_type", "transformers_version", "torch_dtype", "dtype",
                   "_name_or_path", "quantization_config")


def load_eagle_head(source: str | os.PathLike, target: PreTrainedModel) -> EagleHead:
    """Load an EAGLE-1/2 or EAGLE-3 head from a local directory or hub id, checked against and placed like `target`.

    The head shares the target's embedding (and, for EAGLE-1/2, its LM head) unless the checkpoint has its own.
    """
    directory = resolve_head_dir(source)
    config = _read_config(directory)
    state = read_head_weights(directory)
    return build_head(config, state, target, str(source))


def eagle_version(source: str | os.PathLike) -> int:
    """3 for an EAGLE-3 checkpoint, 2 for an EAGLE-1/2 one (as `load_eagle_head` would build it), without a target."""
    directory = resolve_head_dir(source)
    return 3 if is_eagle3(_read_config(directory), read_head_weights(directory)) else 2


def resolve_head_dir(source: str | os.PathLike) -> Path:
    """A local directory with config.json: `source` itself, or the hub snapshot of the repo id `source`."""
    spec = str(source)
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            raise FrspecError(f"EAGLE head {spec!r} is a file; expected a directory with config.json and weights")
        if not (path / "config.json").is_file():
            raise FrspecError(f"EAGLE head directory {spec!r} has no config.json")
        return path
    if spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        raise FrspecError(f"EAGLE head not found: {spec!r} is neither a directory nor a hub id like org/name")
    from huggingface_hub import snapshot_download

    patterns = ["config.json", "*.safetensors", "*.bin", "*.index.json"]
    try:
        return Path(snapshot_download(spec, allow_patterns=patterns, local_files_only=True))
    except Exception:
        pass  # not cached yet
    try:
        return Path(snapshot_download(spec, allow_patterns=patterns))
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise FrspecError(f"cannot fetch EAGLE head {spec!r} from the Hugging Face hub: {first}") from e


def read_head_weights(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory (single file or index + shards), on the CPU."""
    for name in _WEIGHT_FILES:
        index = directory / f"{name}.index.json"
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (ValueError, KeyError, TypeError) as e:
                raise FrspecError(f"bad checkpoint index {index}: {e}") from e
            state = {}
            for shard in shards:
                state.update(_read_weight_file(directory / shard))
            return state
        if (directory / name).is_file():
            return _read_weight_file(directory / name)
    raise FrspecError(f"no EAGLE weights in {directory}: expected model.safetensors or pytorch_model.bin")


def _read_weight_file(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise FrspecError(f"checkpoint shard {path} is missing")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path), device="cpu")
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        raise FrspecError(f"cannot read EAGLE weights {path}: {type(e).__name__}: {e}") from e
    if not isinstance(state, dict):
        raise FrspecError(f"{path} does not hold a state dict")
    return state


def _read_config(directory: Path) -> dict:
    try:
        config = json.loads((directory / "config.json").read_text())
    except ValueError as e:
        raise FrspecError(f"{directory / 'config.json'} is not valid JSON: {e}") from e
    if not isinstance(config, dict):
        raise FrspecError(f"{directory / 'config.json'} is not a JSON object")
    return config


def is_eagle3(config: dict, state: dict[str, torch.Tensor]) -> bool:
    """EAGLE-3 checkpoints have a midlayer (or a layer with a hidden_norm), a d2t map or a draft vocabulary."""
    marks = ("midlayer." in k or k.endswith("hidden_norm.weight") or k == "d2t" for k in state)
    archs = " ".join(config.get("architectures") or [])
    return any(marks) or "draft_vocab_size" in config or "Eagle3" in archs


def build_head(config: dict, state: dict[str, torch.Tensor], target: PreTrainedModel, what: str) -> EagleHead:
    """Construct the head a checkpoint (config.json as a dict, tensors by name) describes, check it fits `target`,
    load its tensors, and place it on the target's device and dtype, ready for inference."""
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}  # saved by old transformers
    if is_eagle3(config, state):
        # Some conversions name EAGLE-3's single layer like a regular stack.
        state = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in state.items()}
        head = _build_eagle3(config, state, target, what)
    else:
        head = _build_eagle2(config, state, target, what)
    _load_tensors(head, state, what)
    embed = target.get_input_embeddings().weight
    head.to(device=embed.device, dtype=embed.dtype)
    head.eval().requires_grad_(False)
    return head


def _build_eagle2(config: dict, state: dict, target: PreTrainedModel, what: str) -> Eagle2Head:
    fc = _need(state, "fc.weight", what)
    hidden = int(target.config.hidden_size)
    if tuple(fc.shape) != (hidden, 2 * hidden):
        raise FrspecError(
            f"EAGLE head {what} does not fit the target: its fc is {list(fc.shape)}, a target of hidden size "
            f"{hidden} needs [{hidden}, {2 * hidden}]"
        )
    vocab = vocab_size_of(target)
    _check_vocab(config, vocab, what)
    layer_ids = {int(k.split(".")[1]) for k in state if k.startswith("layers.") and k.split(".")[1].isdigit()}
    if 0 not in layer_ids:
        raise FrspecError(f"EAGLE head {what} has no decoder layer weights (layers.0.*)")
    num_layers = max(layer_ids) + 1
    family = Qwen2Config if getattr(target.config, "model_type", "") == "qwen2" else LlamaConfig
    layer_config = _layer_config(config, target, family, hidden, num_layers, state, "layers.0.")
    embed = _embedding(state, target, hidden, what)
    lm_head = target.get_output_embeddings()
    return Eagle2Head(layer_config, embed, lm_head, fc_bias="fc.bias" in state,
                      first_input_norm="layers.0.input_layernorm.weight" in state)


def _build_eagle3(config: dict, state: dict, target: PreTrainedModel, what: str) -> Eagle3Head:
    fc = _need(state, "fc.weight", what)
    lm_head = _need(state, "lm_head.weight", what)
    target_hidden = int(target.config.hidden_size)
    head_hidden = int(fc.shape[0])
    if fc.shape[1] != 3 * target_hidden:
        raise FrspecError(
            f"EAGLE-3 head {what} does not fit the target: its fc reads {fc.shape[1]} features, a target of hidden "
            f"size {target_hidden} gives 3 x {target_hidden} = {3 * target_hidden}"
        )
    vocab = vocab_size_of(target)
    _check_vocab(config, vocab, what)
    draft_vocab = int(lm_head.shape[0])
    if "d2t" not in state and draft_vocab != vocab:
        raise FrspecError(
            f"EAGLE-3 head {what} drafts over {draft_vocab} tokens but has no d2t map to the target's {vocab}"
        )
    d2t = state.get("d2t", torch.zeros(draft_vocab, dtype=torch.long)).to(torch.long)
    if d2t.shape != (draft_vocab,):
        raise FrspecError(f"EAGLE-3 head {what}: d2t has shape {list(d2t.shape)}, expected [{draft_vocab}]")
    ids = torch.arange(draft_vocab) + d2t
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise FrspecError(f"EAGLE-3 head {what}: d2t maps draft tokens outside the target's {vocab}-token vocabulary")
    if torch.unique(ids).numel() != draft_vocab:
        raise FrspecError(f"EAGLE-3 head {what}: d2t maps two draft tokens to one target token")
    t2d = state.get("t2d")
    if t2d is not None and t2d.shape != (vocab,):
        raise FrspecError(f"EAGLE-3 head {what}: t2d has {t2d.numel()} entries, the target vocabulary {vocab}")
    num_target_layers = int(target.config.num_hidden_layers)
    aux = _eagle3_option(config, "eagle_aux_hidden_state_layer_ids")
    if aux is None and num_target_layers < 3:
        raise FrspecError(f"EAGLE-3 needs a target with at least 3 layers, this one has {num_target_layers}")
    if aux is not None and (len(aux) != 3 or not all(0 <= int(i) <= num_target_layers for i in aux)):
        raise FrspecError(f"EAGLE-3 head {what}: bad eagle_aux_hidden_state_layer_ids {aux}")
    layer_config = _layer_config(config, target, LlamaConfig, head_hidden, 1, state, "midlayer.")
    embed = _embedding(state, target, head_hidden, what)
    norm_before_residual = _eagle3_option(config, "norm_before_residual")
    if norm_before_residual not in (None, True, False):
        raise FrspecError(
            f"EAGLE-3 head {what}: norm_before_residual must be true or false, got {norm_before_residual!r}"
        )
    head = Eagle3Head(layer_config, embed, draft_vocab, target_hidden, vocab, aux_layer_ids=aux,
                      norm_before_residual=bool(norm_before_residual))
    head.set_vocab_maps(d2t, None if t2d is None else t2d.to(torch.bool))
    return head


def _eagle3_option(config: dict, key: str):
    """An EAGLE-3 setting from the config's `eagle_config` (EAGLE's own layout) or its top level (speculators-format
    heads put them there); the two must agree when both are given."""
    nested = (config.get("eagle_config") or {}).get(key)
    top = config.get(key)
    if nested is not None and top is not None and nested != top:
        raise FrspecError(f"EAGLE-3 config gives {key} twice with different values: {top} and {nested}")
    return nested if nested is not None else top


def _layer_config(config: dict, target, family, hidden: int, num_layers: int, state: dict, prefix: str):
    """The decoder-layer config: the head's config.json, with the target's values for anything it leaves out."""
    values = {k: v for k, v in target.config.to_dict().items() if k not in _NON_LAYER_KEYS}
    if any(k in config for k in ("rope_theta", "rope_scaling", "rope_parameters")):
        values.pop("rope_parameters", None)  # the head's own RoPE settings win
    values.update({k: v for k, v in config.items() if k not in _NON_LAYER_KEYS})
    values.update(hidden_size=hidden, num_hidden_layers=num_layers)
    values.update(attention_bias=f"{prefix}self_attn.q_proj.bias" in state)
    q = state.get(f"{prefix}self_attn.q_proj.weight")
    k = state.get(f"{prefix}self_attn.k_proj.weight")
    heads = int(values.get("num_attention_heads", 0)) or 1
    if q is not None:
        values["head_dim"] = q.shape[0] // heads
        if k is not None:
            values["num_key_value_heads"] = k.shape[0] // values["head_dim"]
    gate = state.get(f"{prefix}mlp.gate_proj.weight")
    if gate is not None:
        values["intermediate_size"] = int(gate.shape[0])
    for drop in ("layer_types", "use_sliding_window", "max_window_layers"):
        values.pop(drop, None)
    try:
        layer_config = family(**values)
    except (TypeError, ValueError) as e:
        raise FrspecError(f"cannot read the EAGLE head's config: {e}") from e
    attn = getattr(target.config, "_attn_implementation", None)
    layer_config._attn_implementation = attn if attn in ARBITRARY_MASK_ATTENTION else "sdpa"
    return layer_config


def _embedding(state: dict, target: PreTrainedModel, hidden: int, what: str) -> nn.Embedding:
    shared = target.get_input_embeddings()
    own = state.pop("embed_tokens.weight", None)
    if own is None:
        if shared.weight.shape[1] != hidden:
            raise FrspecError(f"EAGLE head {what} has hidden size {hidden} but no embedding of its own")
        return shared
    if own.shape[0] != shared.weight.shape[0]:
        raise FrspecError(
            f"EAGLE head {what} embeds {own.shape[0]} tokens but the target's vocabulary has {shared.weight.shape[0]}"
        )
    if own.shape == shared.weight.shape and torch.equal(own.to(shared.weight.dtype), shared.weight.cpu()):
        return shared  # the usual case: a copy of the target's embedding; share it instead of holding two
    embed = nn.Embedding(own.shape[0], own.shape[1])
    embed.weight.data.copy_(own)
    return embed


def _check_vocab(config: dict, vocab: int, what: str) -> None:
    declared = config.get("vocab_size")
    if declared is not None and int(declared) != vocab:
        raise FrspecError(
            f"EAGLE head {what} was trained for a vocabulary of {declared} tokens but the target has {vocab}"
        )


def _need(state: dict, key: str, what: str) -> torch.Tensor:
    if key not in state:
        raise FrspecError(f"EAGLE head {what} has no {key!r} tensor; is it an EAGLE checkpoint?")
    return state[key]


def _load_tensors(head: EagleHead, state: dict, what: str) -> None:
    # Shared target modules (the embedding; EAGLE-1/2's LM head) and the FR-Spec copy are not in a checkpoint.
    shared = ("embed_tokens.",) + (("lm_head.",) if head.version == 2 else ())
    own = {k: v for k, v in head.state_dict().items() if not k.startswith(shared)}
    missing = sorted(set(own) - set(state) - {"d2t", "t2d"})  # validated and installed by _build_eagle3
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            parts.append(f"unexpected {', '.join(unexpected[:5])}{' ...' if len(unexpected) > 5 else ''}")
        raise FrspecError(f"EAGLE head {what} does not match its architecture: {'; '.join(parts)}")
    with torch.no_grad():
        for key, value in state.items():
            if key in ("d2t", "t2d"):
                continue  # installed by set_vocab_maps
            if own[key].shape != value.shape:
                raise FrspecError(
                    f"EAGLE head {what}: {key} has shape {list(value.shape)}, expected {list(own[key].shape)}"
                )
            own[key].copy_(value.to(own[key].dtype))
