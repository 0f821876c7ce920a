"""A tiny ChatML character tokenizer, a tiny random target and a small chat corpus, built in-process."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIALS = ["<unk>", "<eos>", "<|im_start|>", "<|im_end|>"]
CHARS = "abcdefghijklmnopqrstuvwxyz .,!?\n0123456789"
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
VOCAB = len(SPECIALS) + len(CHARS)
WORDS = "the cat sat on a mat and the dog ran to the park while birds sing songs".split()


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """One id per character, plus the chat specials."""
    vocab = {t: i for i, t in enumerate(SPECIALS + list(CHARS))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("(<\\|im_start\\|>|<\\|im_end\\|>|.|\\n)"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<|im_end|>",
                                   pad_token="<eos>", additional_special_tokens=["<|im_start|>"],
                                   chat_template=CHATML, clean_up_tokenization_spaces=False)


def tiny_target(family: str = "qwen2", seed: int = 0, hidden: int = 32, predictable: bool = False) -> torch.nn.Module:
    """A random 2-layer target over the tokenizer's vocabulary, fp32."""
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
                  initializer_range=0.2, eos_token_id=3)
    config = Qwen2Config(**common) if family == "qwen2" else LlamaConfig(**common)
    model = (Qwen2ForCausalLM if family == "qwen2" else LlamaForCausalLM)(config).eval()
    model.requires_grad_(False)
    if predictable:
        # Mostly a bigram model with peaked predictions, so a small head can learn it in a few steps.
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.1)
            layer.mlp.down_proj.weight.mul_(0.1)
        model.lm_head.weight.mul_(3.0)
    return model


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def write_chats(path: Path, n: int, seed: int = 0) -> Path:
    """ShareGPT-style conversations (human/gpt), one JSON array."""
    rng = random.Random(seed)
    records = [{"conversations": [{"from": "human", "value": sentence(rng, 3)},
                                  {"from": "gpt", "value": sentence(rng, 8)},
                                  {"from": "human", "value": sentence(rng, 2)},
                                  {"from": "gpt", "value": sentence(rng, 6)}]} for _ in range(n)]
    path.write_text(json.dumps(records))
    return path


def save_target_dir(path: Path, family: str = "qwen2") -> Path:
    """The tiny target and its tokenizer as a HF directory that `load_model` and `load_tokenizer` read."""
    tiny_target(family).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path
