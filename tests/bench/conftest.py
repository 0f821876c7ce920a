"""Tiny real-architecture models and a word-level tokenizer with a chat template, saved to temp dirs, so the
benchmark runs end to end in seconds without any real model."""

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

VOCAB = 320
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Compose an engaging travel blog post about a recent trip, with cultural experiences and must-see sights.",
    "Write a python function that returns the sum of a list of numbers, and explain how it works.",
    "The quick brown fox jumps over the lazy dog; what is the reasoning behind each step of the math?",
]


def make_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE of VOCAB ids (Qwen-style, so it reloads as a Qwen2 tokenizer from a model directory)."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS * 10, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_model(seed: int, layers: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=2,
    )
    # Untied: with tied random embeddings the model mostly repeats its input token, which makes a poor test.
    return Qwen2ForCausalLM(config).eval()



@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """(target_dir, draft_dir): HF directories with weights, config and tokenizer.

    The draft is the target's first layer plus its embeddings and norm, so it agrees with the target often but not
    always, as a real draft model does.
    """
    root = tmp_path_factory.mktemp("tiny_models")
    tok = make_tokenizer()
    target = make_model(seed=0, layers=2)
    draft = make_model(seed=1, layers=1)
    state = {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.1.")}
    draft.load_state_dict(state, strict=False)
    dirs = []
    for name, model in (("target", target), ("draft", draft)):
        path = root / name
        model.save_pretrained(path)
        tok.save_pretrained(path)
        dirs.append(path)
    return tuple(dirs)
