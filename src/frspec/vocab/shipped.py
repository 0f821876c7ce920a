"""Token counts shipped with the package, one file per tokenizer, so a map for a common tokenizer needs no corpus,
no tokenizer and no network: `frspec vocab get NAME --size K`.

Each `shipped_counts/<name>.safetensors` holds four int32 tensors over the tokenizer's full vocabulary (one count
per id): `chat` and `code` (the build slices: ShareGPT assistant turns, Python sources) and `chat-heldout` and
`code-heldout` (disjoint slices, for coverage a map was not ranked on). The JSON metadata under `frspec_shipped`
records the tokenizer's identity, where it came from, the tokens every map must keep, and each slice's source.
scripts/build_shipped_counts.py writes these files and is how they are reproduced.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from frspec.errors import FrspecError
from frspec.vocab.counts import TokenCounts, mix_counts

SHIPPED_DIR = Path(__file__).resolve().parent / "shipped_counts"
SHIPPED_METADATA_KEY = "frspec_shipped"
PARTS = ("chat", "code", "chat-heldout", "code-heldout")
DOMAINS = ("chat", "code", "mix")
# A mixed map weighs chat and code equally, whatever their token totals.
MIX_WEIGHTS = {"chat": 0.5, "code": 0.5}


def shipped_names() -> list[str]:
    """Names of the shipped counts (`llama3.1`, `qwen2.5`, ...), sorted."""
    return sorted(p.name.removesuffix(".safetensors") for p in SHIPPED_DIR.glob("*.safetensors"))


def shipped_metadata(name: str) -> dict[str, Any]:
    """The file's metadata: tokenizer identity, source, keep_tokens, and per-part slice descriptions."""
    with _open(name) as f:
        return json.loads(f.metadata()[SHIPPED_METADATA_KEY])


def load_shipped(name: str) -> dict[str, TokenCounts]:
    """part -> TokenCounts for the four parts of NAME, each carrying the tokenizer identity and keep_tokens, so a
    map built from them keeps the special and chat-template tokens without the tokenizer at hand."""
    with _open(name) as f:
        meta = json.loads(f.metadata()[SHIPPED_METADATA_KEY])
        tensors = {part: f.get_tensor(part) for part in PARTS}
    common = {"tokenizer": meta["tokenizer"], "keep_tokens": meta["keep_tokens"], "shipped": name}
    return {part: TokenCounts(tensors[part].to(torch.int64), {**common, **meta["parts"][part]}) for part in PARTS}


def domain_counts(parts: dict[str, TokenCounts], domain: str) -> TokenCounts:
    """The build counts a map of `domain` is ranked by: chat, code, or their equal-weight mixture."""
    if domain not in DOMAINS:
        raise FrspecError(f"unknown domain {domain!r}; choose one of {', '.join(DOMAINS)}")
    if domain == "mix":
        return mix_counts([(parts[d], w) for d, w in MIX_WEIGHTS.items()])
    return parts[domain]


def resolve_name(name: str) -> str:
    """The shipped name NAME stands for (case and `-`/`_` ignored: `Llama3_1`, `gemma-3`), or a one-line error
    that lists what ships."""
    names = shipped_names()
    if not names:
        raise FrspecError(f"no shipped token counts found in {SHIPPED_DIR} (a broken install?)")
    wanted = _normal(name)
    for known in names:
        if _normal(known) == wanted:
            return known
    raise FrspecError(f"no shipped counts for {name!r}; shipped: {', '.join(names)} (see `frspec vocab get --list`)")


def shipped_for(identity: dict[str, Any]) -> str | None:
    """The shipped counts made with the tokenizer of `identity` (`tokenizer_identity`: same vocabulary hash), or
    None: what `frspec generate` ranks a drafter's head by when no map is given (issue 21's default)."""
    wanted = identity.get("vocab_hash")
    if not wanted:
        return None
    for name in shipped_names():
        try:
            if shipped_metadata(name).get("tokenizer", {}).get("vocab_hash") == wanted:
                return name
        except (FrspecError, KeyError, json.JSONDecodeError):
            continue
    return None


def default_ranking(identity: dict[str, Any], vocab_size: int, top_k: int = 65536):
    """A frequency ranking for a model whose tokenizer has shipped counts: the chat+code mix's top `top_k` ids
    as a TokenMap (with counts: the controller's coverage prior), or None when nothing ships for it."""
    from frspec.vocab.token_map import TokenMap

    name = shipped_for(identity)
    if name is None:
        return None
    counts = with_vocab_size(domain_counts(load_shipped(name), "mix"), vocab_size)
    token_map = TokenMap.from_counts(counts, top_k=min(int(top_k), int(vocab_size)))
    token_map.metadata["shipped"] = name
    return token_map


def _normal(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum() or c == ".").replace(".", "")


def _open(name: str):
    path = SHIPPED_DIR / f"{resolve_name(name)}.safetensors"
    try:
        return safe_open(str(path), framework="pt")
    except Exception as e:  # a truncated or damaged package file
        raise FrspecError(f"cannot read shipped counts {path}: {str(e).splitlines()[0] if str(e) else e}") from e


def with_vocab_size(counts: TokenCounts, vocab_size: int) -> TokenCounts:
    """The counts over a model's `vocab_size` LM-head rows: zero counts appended when the head has more rows than
    the tokenizer has ids (DeepSeek-V3: 129,280 rows, 128,815 ids), or trailing never-counted ids dropped when it
    has fewer (Gemma-3-1B: 262,144 rows; the tokenizer's id 262,144 is the image token). Refuses to drop an id
    that was counted or must be kept."""
    vocab_size = int(vocab_size)
    if vocab_size <= 0:
        raise FrspecError(f"--vocab-size must be positive, got {vocab_size}")
    n = counts.vocab_size
    meta = dict(counts.metadata)
    if vocab_size >= n:
        padded = torch.cat([counts.counts, torch.zeros(vocab_size - n, dtype=torch.int64)])
        return TokenCounts(padded, meta)
    dropped = counts.counts[vocab_size:]
    if bool((dropped > 0).any()):
        first = vocab_size + int(torch.nonzero(dropped)[0])
        raise FrspecError(f"--vocab-size {vocab_size} would drop id {first}, which occurs in the counts "
                          f"({n:,} ids); is this the right tokenizer?")
    keep = counts.keep_tokens
    meta["keep_tokens"] = {t: i for t, i in keep.items() if i < vocab_size}
    meta["dropped_keep_tokens"] = sorted(t for t, i in keep.items() if i >= vocab_size)
    return TokenCounts(counts.counts[:vocab_size].clone(), meta)


def coverage_rows(parts: dict[str, TokenCounts], domain: str, sizes: list[int],
                  vocab_size: int | None = None) -> dict[int, dict[str, float]]:
    """k -> {evaluation set: coverage} of the map `vocab get` writes at each size: on the counts it was ranked by
    (`build`) and on both held-out slices. Sizes a map cannot have (larger than the vocabulary) are left out."""
    from frspec.vocab.coverage import map_coverage
    from frspec.vocab.token_map import TokenMap

    build = domain_counts(parts, domain)
    evals = {"build": build, "chat-heldout": parts["chat-heldout"], "code-heldout": parts["code-heldout"]}
    if vocab_size is not None:
        build = with_vocab_size(build, vocab_size)
        evals = {label: with_vocab_size(c, vocab_size) for label, c in evals.items()}
    rows = {}
    for k in sorted(set(sizes)):
        if k > build.vocab_size:
            continue
        ids = TokenMap.from_counts(build, top_k=k).ids
        rows[k] = {label: map_coverage(ids, c.counts) for label, c in evals.items()}
    return rows
