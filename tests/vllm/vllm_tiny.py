"""Tiny random-weight models for the vLLM tests, saved as HF directories vLLM loads, plus token maps and helpers
to start an in-process vLLM engine and look inside its drafter."""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from frspec.vocab.token_map import TokenMap
from tests.decode.spec_tiny import noisy_copy  # the engine tests' helpers
from tests.decode.spec_tiny import tiny_tokenizer as tokenizer

VOCAB = 96  # the model's vocabulary: more rows than the tokenizer's ids, as Qwen2.5's 151,936 vs 151,665
MAP_IDS = list(range(4, 44))  # a 40-token map; drafts from the full head land outside it often
PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [20], [30, 31, 32, 33, 34, 35, 36]]


def qwen2(seed: int, layers: int = 2, tie: bool = False) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tie,
                         max_position_embeddings=512, initializer_range=0.2, bos_token_id=None, eos_token_id=1)
    model = Qwen2ForCausalLM(config).float().eval()
    with torch.no_grad():  # peaked next-token distributions, so greedy decoding has no near-ties
        model.lm_head.weight.mul_(3.0)
    return model


@dataclass
class Tiny:
    root: Path
    target: str
    draft: str
    token_map: str
    wrong_vocab_map: str
    wrong_tokenizer_map: str
    eagle_target: str
    eagle_head: str  # EAGLE-1/2 layout, no LM head of its own: vLLM shares the target's
    eagle3_head: str  # EAGLE-3 layout with a reduced draft vocabulary (d2t)
    eagle3_target_ids: list[int]  # the EAGLE-3 head's draft vocabulary, as target ids
    mimo_target: str  # a MiMo checkpoint: a Qwen2-style target with one MTP layer (model.mtp_layers.0.*)
    glm_target: str  # a GLM-4.5 (Glm4Moe) checkpoint: MoE target, one MTP layer (model.layers.2.*, shared_head)


def save(model: torch.nn.Module, path: Path) -> str:
    model.save_pretrained(path)
    tokenizer().save_pretrained(path)
    return str(path)


def build_models(root: Path) -> Tiny:
    target = qwen2(0)
    draft = noisy_copy(target, 0.3, seed=1)
    TokenMap(MAP_IDS, VOCAB).save(root / "map.safetensors")
    TokenMap(MAP_IDS, VOCAB + 32).save(root / "map-wrong-vocab.safetensors")
    TokenMap(MAP_IDS, VOCAB, metadata={"tokenizer": {"name": "another-tokenizer", "vocab_hash": "0123456789abcdef"}}
             ).save(root / "map-wrong-tokenizer.safetensors")
    eagle_target = qwen2(2, layers=3)
    eagle3_ids = list(range(0, VOCAB, 2))  # even ids: half of them inside the map
    return Tiny(root, save(target, root / "target"), save(draft, root / "draft"), str(root / "map.safetensors"),
                str(root / "map-wrong-vocab.safetensors"), str(root / "map-wrong-tokenizer.safetensors"),
                save(eagle_target, root / "eagle-target"), write_eagle_head(root / "eagle", eagle3_ids=None),
                write_eagle_head(root / "eagle3", eagle3_ids=eagle3_ids), eagle3_ids,
                write_mimo_mtp(root / "mimo", seed=4), write_glm4_moe_mtp(root / "glm4-moe", seed=5))


HIDDEN, HEADS, KV_HEADS, FFN = 64, 2, 1, 128  # vLLM's CPU attention needs a head size of at least 32


def write_eagle_head(path: Path, eagle3_ids: list[int] | None, seed: int = 3) -> str:
    """A random EAGLE head in the published checkpoint layout (yuhuili/EAGLE-* for EAGLE-1/2, yuhuili/EAGLE3-* for
    EAGLE-3 with `eagle3_ids` as its draft vocabulary), with a Llama config, as vLLM's `eagle`/`eagle3` load it."""
    import json

    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    h, hd = HIDDEN, HIDDEN // HEADS

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=gen) * scale

    def layer(prefix, in_dim):
        return {f"{prefix}self_attn.q_proj.weight": rand(HEADS * hd, in_dim),
                f"{prefix}self_attn.k_proj.weight": rand(KV_HEADS * hd, in_dim),
                f"{prefix}self_attn.v_proj.weight": rand(KV_HEADS * hd, in_dim),
                f"{prefix}self_attn.o_proj.weight": rand(h, HEADS * hd),
                f"{prefix}mlp.gate_proj.weight": rand(FFN, h), f"{prefix}mlp.up_proj.weight": rand(FFN, h),
                f"{prefix}mlp.down_proj.weight": rand(h, FFN),
                f"{prefix}post_attention_layernorm.weight": 1.0 + rand(h, scale=0.1)}

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h, "intermediate_size": FFN,
              "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "num_hidden_layers": 1,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512, "hidden_act": "silu",
              "vocab_size": VOCAB, "torch_dtype": "float32"}
    if eagle3_ids is None:  # EAGLE-1/2: fc over [embedding, feature], layer 0 without input_layernorm
        tensors = {"fc.weight": rand(h, 2 * h), **layer("layers.0.", h)}
    else:
        ids = torch.tensor(eagle3_ids)
        t2d = torch.zeros(VOCAB, dtype=torch.bool)
        t2d[ids] = True
        tensors = {"fc.weight": rand(h, 3 * h), **layer("midlayer.", 2 * h),
                   "midlayer.input_layernorm.weight": 1.0 + rand(h, scale=0.1),
                   "midlayer.hidden_norm.weight": 1.0 + rand(h, scale=0.1), "norm.weight": 1.0 + rand(h, scale=0.1),
                   "lm_head.weight": rand(ids.numel(), h, scale=1.0), "d2t": ids - torch.arange(ids.numel()),
                   "t2d": t2d}
        config["draft_vocab_size"] = ids.numel()
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}  # the target's first three layers
    path.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def write_mimo_mtp(path: Path, seed: int) -> str:
    """A random MiMo checkpoint in the published layout (XiaomiMiMo/MiMo-7B-*): a Qwen2 model whose config names
    the MiMoForCausalLM architecture with `num_nextn_predict_layers`, and its MTP layer's weights stored beside the
    target's as `model.mtp_layers.0.*` (token/hidden layernorms, input_proj over [hidden, embedding], a Qwen2 decoder
    layer, final_layernorm). vLLM's `mtp` method loads that layer as MiMoMTPModel; transformers loads the target as
    Qwen2 (ignoring the MTP weights), which is the reference."""
    import json

    from safetensors.torch import load_file, save_file

    target = qwen2(seed)
    save(target, path)
    tensors = load_file(str(path / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed + 100)
    layer0 = {k[len("model.layers.0."):]: v for k, v in tensors.items() if k.startswith("model.layers.0.")}
    prefix = "model.mtp_layers.0."
    for name, value in layer0.items():  # a decoder layer of the target's shape, its own random weights
        noise = torch.randn(value.shape, generator=gen) * (0.05 if "layernorm" in name else 0.2)
        tensors[prefix + name] = (1.0 + noise) if "layernorm" in name else noise
    for name in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
        tensors[f"{prefix}{name}.weight"] = 1.0 + torch.randn(HIDDEN, generator=gen) * 0.05
    tensors[prefix + "input_proj.weight"] = torch.randn(HIDDEN, 2 * HIDDEN, generator=gen) * 0.2
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    config = json.loads((path / "config.json").read_text())
    config.update(architectures=["MiMoForCausalLM"], num_nextn_predict_layers=1)
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def write_glm4_moe_mtp(path: Path, seed: int) -> str:
    """A random GLM-4.5 checkpoint in the published layout (zai-org/GLM-4.5*): a Glm4Moe target (layer 0 dense,
    layer 1 MoE with 4 routed experts and a shared one) and its MTP layer stored as the next layer,
    `model.layers.2.*`: enorm, hnorm, eh_proj over [embedding, hidden], an MoE decoder layer, and `shared_head.norm`
    (vLLM shares the target's head as `shared_head.head`, and the layer normalises before it: the DeepSeek-V3 MTP
    layout). transformers loads the target alone (the MTP layer's weights are unexpected to it): the reference."""
    from safetensors.torch import load_file, save_file
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    torch.manual_seed(seed)
    config = Glm4MoeConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, moe_intermediate_size=32,
                           num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                           head_dim=HIDDEN // HEADS, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                           first_k_dense_replace=1, num_nextn_predict_layers=1, max_position_embeddings=512,
                           tie_word_embeddings=False, bos_token_id=None, eos_token_id=1, pad_token_id=0,
                           initializer_range=0.2)
    model = Glm4MoeForCausalLM(config).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    save(model, path)
    tensors = load_file(str(path / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed + 100)
    for name, value in list(tensors.items()):  # the MTP layer: an MoE layer of layer 1's shapes, its own weights
        if name.startswith("model.layers.1."):
            mtp_name = "model.layers.2." + name[len("model.layers.1."):]
            noise = torch.randn(value.shape, generator=gen)
            tensors[mtp_name] = (1.0 + 0.05 * noise if "norm" in name else torch.zeros_like(value)
                                 if "bias" in name else 0.2 * noise)
    for name in ("enorm", "hnorm", "shared_head.norm"):
        tensors[f"model.layers.2.{name}.weight"] = 1.0 + 0.05 * torch.randn(HIDDEN, generator=gen)
    tensors["model.layers.2.eh_proj.weight"] = 0.2 * torch.randn(HIDDEN, 2 * HIDDEN, generator=gen)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return str(path)


def hf_greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """The reference: transformers' greedy decoding of the target alone, fp32."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0)
        outs.append(out[0, len(prompt):].tolist())
    return outs


def start_llm(target: str, speculative_config: dict | None, token_map: str | None, enforce_eager: bool = True,
              **kwargs: Any):
    """An in-process vLLM engine, fp32, eager unless `enforce_eager=False` (vLLM's default: torch.compile);
    FR-Spec on iff `token_map` (set the way users do: the env var)."""
    from vllm import LLM

    if token_map is None:
        os.environ.pop("FRSPEC_TOKEN_MAP", None)
    else:
        os.environ["FRSPEC_TOKEN_MAP"] = token_map
    # No register() here: vLLM registered the plugin when this process made its first engine, perhaps without a map,
    # and the plugin must pick up a map set since then by itself, as it does for users.
    return LLM(model=target, dtype="float32", enforce_eager=enforce_eager, speculative_config=speculative_config,
               max_model_len=256, max_num_seqs=8, seed=0, distributed_executor_backend="uni", **kwargs)


def stop_llm(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    os.environ.pop("FRSPEC_TOKEN_MAP", None)


def frspec_head(drafter):
    """The drafter's one FR-Spec head (None without a map), as the worker's check left it."""
    heads = getattr(drafter, "frspec_heads", None)
    if heads is None:
        return None
    assert len(heads) == 1, heads
    return heads[0]


def model_runner(llm):
    return llm.collective_rpc(lambda self: self)[0].worker.model_runner


class Recorder:
    """Wraps the drafter's draft-token sampling and the rejection sampler, recording what passes through."""

    def __init__(self, llm):
        runner = model_runner(llm)
        self.drafter = runner.drafter
        self.drafts: list[torch.Tensor] = []  # every draft step's token ids
        self.sampled: list[tuple[torch.Tensor, torch.Tensor]] = []  # (hidden, probs) of probabilistic draft steps
        self.rejection_draft_probs: list[torch.Tensor] = []
        sample = self.drafter._sample_draft_tokens

        def sample_draft_tokens(hidden, sampling_metadata):
            ids, probs = sample(hidden, sampling_metadata)
            self.drafts.append(ids.clone())
            if probs is not None:
                self.sampled.append((hidden.clone(), probs.clone()))
            return ids, probs

        self.drafter._sample_draft_tokens = sample_draft_tokens
        sampler = runner.rejection_sampler
        forward = sampler.forward

        def rejection_forward(metadata, draft_probs, *args, **kwargs):
            if draft_probs is not None:
                self.rejection_draft_probs.append(draft_probs.clone())
            return forward(metadata, draft_probs, *args, **kwargs)

        sampler.forward = rejection_forward


def outside_rows(active: torch.Tensor | list[int]) -> torch.Tensor:
    """[VOCAB] True for the ids outside `active` (the target ids a draft step's head scored)."""
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[torch.as_tensor(active, dtype=torch.long)] = False
    return outside


def assert_handed_as_drafted(handed: list[torch.Tensor], drafted: dict[bytes, torch.Tensor]) -> None:
    """Every distribution the rejection sampler received is, bit for bit, one the drafter produced (`drafted`: its
    rows' bytes -> the ids outside the rows active when it was drafted), zero outside those rows."""
    rows = torch.cat(handed)
    torch.testing.assert_close(rows.sum(-1), torch.ones(rows.shape[0]))
    for row in rows:
        outside = drafted.get(row.numpy().tobytes())
        assert outside is not None, "each handed distribution is one the drafter produced, bit for bit"
        assert bool((row[outside] == 0).all())


def greedy_outputs(llm, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy token ids for `prompts`, batched in one generate call, every request running to `max_tokens`."""
    from vllm import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def sample_seeded(llm, recorder: "Recorder", prompts: list[list[int]], temperature: float) -> None:
    """16 tokens each for `prompts` at `temperature`, seeded, with what `recorder` sampled before cleared: its
    draft distributions are then this run's only."""
    from vllm import SamplingParams

    recorder.sampled.clear()
    sampled = SamplingParams(temperature=temperature, max_tokens=16, ignore_eos=True, seed=0)
    llm.generate([{"prompt_token_ids": p} for p in prompts], sampled, use_tqdm=False)
