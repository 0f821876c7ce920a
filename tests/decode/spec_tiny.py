"""Tiny randomly initialised causal LMs and a character tokenizer for the engine tests (built in-process)."""

from __future__ import annotations

import copy

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from frspec.vocab.token_map import TokenMap

SPECIALS = ["<unk>", "<eos>", "<|im_start|>", "<|im_end|>"]
CHARS = "abcdefghijklmnopqrstuvwxyz .,!?\n0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>{% endif %}"
)


def tiny_lm(
    family: str = "llama",
    vocab_size: int = 256,
    hidden: int = 64,
    layers: int = 2,
    tie: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> torch.nn.Module:
    """A random Llama or Qwen2 causal LM with no EOS configured (tests choose their stop ids explicitly)."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        # Larger than the default 0.02 so that random layers matter: with small weights a tied-embedding model
        # just repeats its last input token.
        initializer_range=0.2,
    )
    config = LlamaConfig(**common) if family == "llama" else Qwen2Config(**common)
    model = (LlamaForCausalLM if family == "llama" else Qwen2ForCausalLM)(config).to(dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def sharpen(model: torch.nn.Module, factor: float) -> torch.nn.Module:
    """Scale the LM head so the next-token distributions are peaked rather than near uniform."""
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(factor)
    return model


def noisy_copy(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """A draft that agrees with `model` often but not always: its weights plus Gaussian noise."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype).to(p.device) * scale * p.std().clamp(min=1e-3))
    return draft


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int, eos: int | None = None) -> list[int]:
    """The reference: transformers' own greedy generate."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character plus chat specials: 4 + len(CHARS) = 72 ids."""
    vocab = {t: i for i, t in enumerate(SPECIALS + list(CHARS))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("(.|\\n)"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        eos_token="<eos>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


TOKENIZER_VOCAB = len(SPECIALS) + len(CHARS)


def save_tiny_pair(root, model_type: str = "llama", vocab_size: int | None = None) -> int:
    """A tiny target (seed 0) and draft (seed 1) saved with the tiny tokenizer to root/"target" and root/"draft",
    fp32, as `frspec generate` loads them from a directory; returns their vocabulary size."""
    tok = tiny_tokenizer()
    vocab = vocab_size or len(tok)
    for name, seed in (("target", 0), ("draft", 1)):
        tiny_lm(model_type, vocab, seed=seed, dtype=torch.float32).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return vocab


def named_tiny_pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    """A tiny fp32 qwen2 target (seed 0) and drafter (seed 1) over 256 ids, named so that their step costs, timings
    and carried state are cached under FRSPEC_CACHE like real ones'."""
    target = tiny_lm("qwen2", 256, seed=0, dtype=torch.float32)
    draft = tiny_lm("qwen2", 256, hidden=32, seed=1, dtype=torch.float32)
    target.config._name_or_path, draft.config._name_or_path = "tiny-target", "tiny-draft"
    return target, draft


def named_pair_ranking() -> TokenMap:
    """A frequency ranking for the named tiny pair: its 128 highest ids, highest first."""
    return TokenMap(list(range(255, -1, -1))[:128], 256)
