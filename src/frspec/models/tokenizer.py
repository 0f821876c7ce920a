"""Loading tokenizers from every place our models come from (their identity, which keeps maps and counts from being
mixed, is frspec/vocab/tokenizer_identity.py).

`load_tokenizer(spec)` accepts:
  - a hub id or a local directory (anything `AutoTokenizer.from_pretrained` takes);
  - a `.gguf` file: the tokenizer embedded in a GGUF model;
  - a tiktoken `.model` file laid out like Llama-3's (BPE ranks followed by 256 special tokens).

GGUF and tiktoken conversions take tens of seconds, so the converted tokenizer is saved once under
`$FRSPEC_CACHE/tokenizers/` (default `~/.cache/frspec`) keyed by the source file's name, size and mtime.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from frspec.errors import FrspecError
from frspec.models import loading
from frspec.paths import cache_dir

# Llama-3's tiktoken layout (llama_models/llama3/tokenizer.py): the named special tokens come right after the BPE
# ranks, then reserved ones fill up to 256.
LLAMA3_NUM_SPECIAL_TOKENS = 256
LLAMA3_NAMED_SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
]
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The Meta-Llama-3-Instruct chat template, so that chat corpora render exactly as the instruct model sees them.
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def load_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    """Load a tokenizer from a hub id, a local directory, a `.gguf` file, a Llama-3-style tiktoken `.model` file,
    or a default-model name (e.g. "qwen2.5-coder-1.5b-instruct", prepared on first use).

    The returned tokenizer's `name_or_path` is `spec` itself, so identities and error messages name what the user
    typed rather than a cache directory.
    """
    spec = str(spec)
    path = Path(spec).expanduser()
    if loading.is_default_model_name(spec):
        # Every prepared default model's cache directory holds its tokenizer.
        path = Path(loading.resolve_model_dir(spec))
    if path.suffix == ".gguf" or path.suffix == ".model":
        if not path.is_file():
            raise FrspecError(f"tokenizer file not found: {spec}")
        convert = _convert_gguf if path.suffix == ".gguf" else _convert_tiktoken
        tok = _load_cached(path, convert)
    else:
        # Hub ids are "name" or "org/name"; anything else that does not exist was meant as a local path.
        if not path.exists() and (spec.startswith((".", "/", "~")) or spec.count("/") > 1):
            raise FrspecError(f"tokenizer not found: {spec!r} is neither a directory, a .gguf/.model file nor a hub id")
        try:
            tok = AutoTokenizer.from_pretrained(str(path) if path.is_dir() else spec)
        except Exception as e:  # hub errors, missing files and parse errors all mean "cannot use this spec"
            where = "directory" if path.is_dir() else "tokenizer"
            first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise FrspecError(f"cannot load {where} {spec!r}: {first_line}") from e
    tok.name_or_path = spec
    return tok


def _load_cached(path: Path, convert) -> PreTrainedTokenizerBase:
    stat = path.stat()
    key = f"{path.stem}-{stat.st_size}-{stat.st_mtime_ns}"
    cached = cache_dir() / "tokenizers" / key
    if (cached / "tokenizer_config.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(cached))
        except Exception:
            shutil.rmtree(cached, ignore_errors=True)  # a corrupt cache entry is rebuilt, not fatal
    tok = convert(path)
    # Save beside the final location and rename, so a concurrent or interrupted run never sees half a cache entry.
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cached.parent))
    try:
        tok.save_pretrained(str(tmp))
        os.replace(tmp, cached)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process won the race, or the cache is read-only
    return tok


def _convert_gguf(path: Path) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:
        raise FrspecError(f"cannot read a tokenizer from GGUF file {str(path)!r}: {e}") from e


def _convert_tiktoken(path: Path) -> PreTrainedTokenizerBase:
    from transformers.convert_slow_tokenizer import TikTokenConverter

    try:
        from tiktoken.load import load_tiktoken_bpe

        num_ranks = len(load_tiktoken_bpe(str(path)))
        specials = LLAMA3_NAMED_SPECIAL_TOKENS + [
            f"<|reserved_special_token_{2 + i}|>"
            for i in range(LLAMA3_NUM_SPECIAL_TOKENS - len(LLAMA3_NAMED_SPECIAL_TOKENS))
        ]
        backend = TikTokenConverter(
            vocab_file=str(path), pattern=LLAMA3_PATTERN, extra_special_tokens=specials
        ).converted()
    except Exception as e:
        raise FrspecError(f"cannot read {str(path)!r} as a tiktoken BPE file: {e}") from e
    if backend.token_to_id("<|begin_of_text|>") != num_ranks:
        raise FrspecError(f"{str(path)!r}: special tokens did not land right after the {num_ranks} BPE ranks")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        chat_template=LLAMA3_CHAT_TEMPLATE,
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )
