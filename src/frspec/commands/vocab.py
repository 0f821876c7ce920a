"""`frspec vocab get|count|count-generations|merge|build|convert|info|coverage`: build, convert and inspect FR-Spec token maps.

Heavy imports (torch, transformers) happen inside the handlers so `frspec --help` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from frspec.commands.options import add_dtype, add_threads
from frspec.errors import FrspecError

FORMAT_CHOICES = ("frspec", "thunlp", "vllm-scores", "eagle3")
DOMAIN_CHOICES = ("chat", "code", "mix")  # frspec.vocab.shipped.DOMAINS, without importing torch for --help
TABLE_SIZES = (8192, 16384, 32768, 65536)


def register(subparsers: argparse._SubParsersAction) -> None:
    vocab = subparsers.add_parser(
        "vocab",
        help="build, convert and inspect FR-Spec token maps",
        description="Count a corpus, select its most frequent token ids, convert maps between engine formats and "
        "inspect their coverage.",
    )
    sub = vocab.add_subparsers(dest="vocab_command", metavar="SUBCOMMAND")
    sub.required = True

    p = sub.add_parser("get", help="write a map from the token counts shipped with frspec (offline)",
                       description=_get.__doc__)
    p.add_argument("name", nargs="?", help="the tokenizer: llama3.1, deepseek-v3, gemma3, qwen2.5 (see --list)")
    p.add_argument("--list", action="store_true", help="list the shipped counts and exit")
    p.add_argument("--size", type=int, metavar="K", help="ids to keep (e.g. 32768)")
    p.add_argument("--domain", choices=DOMAIN_CHOICES, default="chat",
                   help="rank by ShareGPT assistant turns, Python sources, or both weighted equally "
                        "(default: %(default)s)")
    p.add_argument("--format", choices=FORMAT_CHOICES, help="output format (default from the extension: .pt -> "
                   "thunlp, else frspec)")
    p.add_argument("--out", help="output map")
    p.add_argument("--vocab-size", type=int, help="the model's LM-head rows, when they differ from the tokenizer's "
                   "ids (DeepSeek-V3: 129280; Gemma-3-1B: 262144)")
    p.set_defaults(func=_get)

    p = sub.add_parser("count", help="count token ids over a corpus", description=_count.__doc__)
    p.add_argument("--tokenizer", required=True, help="hub id, tokenizer directory, .gguf file or tiktoken .model")
    p.add_argument("--input", required=True, nargs="+", action="extend", metavar="PATH",
                   help="files, directories or globs: .txt (plain text), .jsonl, .json (arrays, truncated ok)")
    p.add_argument("--out", required=True, help="output counts file (.safetensors)")
    p.add_argument("--field", help="JSON field to count: text, a list of texts, or chat messages "
                   "(default: detect conversations / messages / text)")
    p.add_argument("--assistant-only", action="store_true",
                   help="count only what the model generates in assistant turns (chat data)")
    p.add_argument("--add-special-tokens", action="store_true",
                   help="let the tokenizer add its special tokens (BOS...) to each plain-text document")
    p.add_argument("--vocab-size", type=int, help="model vocabulary size, when its LM head has more rows than "
                   "the tokenizer has ids")
    p.add_argument("--skip", type=int, default=0, help="skip the first N records (e.g. to hold them out)")
    p.add_argument("--limit", type=int, help="count at most N records")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_count)

    p = sub.add_parser("count-generations", help="count the token ids a model generates for calibration prompts",
                       description=_count_generations.__doc__)
    p.add_argument("--model", required=True, help="the target: default-model name, HF directory, .gguf or hub id")
    p.add_argument("--dataset", default="mtbench",
                   help="calibration prompts, any `frspec bench --dataset` (default: %(default)s)")
    p.add_argument("--field", default="prompt", help="JSONL field holding the prompt (default: %(default)s)")
    p.add_argument("--skip", type=int, default=0,
                   help="skip the dataset's first N prompts (hold out what the bench decodes: it takes the first "
                        "16 of code and long-qa) (default: %(default)s)")
    p.add_argument("--num-prompts", type=int, default=16, help="prompts to generate for (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens per answer (default: %(default)s)")
    p.add_argument("--out", required=True, help="output counts file (.safetensors), for `frspec vocab build` or "
                   "`frspec bench --counts`")
    add_dtype(p)
    add_threads(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_count_generations)

    p = sub.add_parser("merge", help="add up counts of several runs", description=_merge.__doc__)
    p.add_argument("counts", nargs="+", help="counts files of the same tokenizer")
    p.add_argument("--out", required=True, help="output counts file")
    p.set_defaults(func=_merge)

    p = sub.add_parser("build", help="select a token map from counts", description=_build.__doc__)
    p.add_argument("--counts", required=True, help="counts file from `frspec vocab count`")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--top-k", type=int, metavar="K", help="keep K ids")
    mode.add_argument("--keep-fraction", type=float, metavar="F", help="keep this fraction of the vocabulary")
    mode.add_argument("--coverage", type=float, metavar="C", help="smallest k covering at least C of the tokens")
    p.add_argument("--out", required=True, help="output map (.pt -> thunlp, else frspec unless --format)")
    p.add_argument("--format", choices=FORMAT_CHOICES, help="output format (default from the extension)")
    p.add_argument("--keep-text", action="append", default=[], metavar="TEXT",
                   help="also always keep the tokens of TEXT (needs --tokenizer); repeatable")
    p.add_argument("--tokenizer", help="the counts' tokenizer (checked against them; needed for --keep-text)")
    p.add_argument("--vocab-size", type=int, help="model vocabulary size the map must match")
    p.set_defaults(func=_build)

    p = sub.add_parser("convert", help="convert a map between formats", description=_convert.__doc__)
    p.add_argument("input", help="token map in any format")
    p.add_argument("output", help="output path")
    p.add_argument("--to", choices=FORMAT_CHOICES, help="output format (default from the extension)")
    p.add_argument("--from", dest="from_format", choices=FORMAT_CHOICES, help="input format (default: detect)")
    _map_context_args(p)
    p.set_defaults(func=_convert)

    p = sub.add_parser("info", help="describe a token map", description=_info.__doc__)
    p.add_argument("map", help="token map in any format")
    p.add_argument("--format", choices=FORMAT_CHOICES, help="input format (default: detect)")
    _map_context_args(p)
    p.set_defaults(func=_info)

    p = sub.add_parser("coverage", help="coverage curve of frequency-ranked vocabularies",
                       description=_coverage.__doc__)
    p.add_argument("--counts", required=True, help="counts that rank the ids")
    p.add_argument("--eval-counts", action="append", default=[], metavar="COUNTS",
                   help="held-out counts to measure coverage on (repeatable)")
    p.add_argument("--map", dest="maps", action="append", default=[], metavar="MAP",
                   help="also report the coverage of this map (repeatable)")
    p.add_argument("--sizes", type=int, nargs="+", default=[], metavar="K", help="extra k values for the table")
    p.add_argument("--plot", help="write the curve as a PNG with k on a log axis")
    p.add_argument("--title", help="plot title")
    p.set_defaults(func=_coverage)


def _map_context_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", help="tokenizer the map is for (checked; names its special tokens)")
    p.add_argument("--vocab-size", type=int, help="model vocabulary size the map must match (completes thunlp maps)")
    p.add_argument("--threshold", type=float, default=0.0, help="vllm-scores: keep ids scoring above this")


# -- handlers ----------------------------------------------------------------------------------------------------


def _get(args: argparse.Namespace) -> int:
    """Write a token map from the counts shipped with frspec, with no corpus, tokenizer or network: ids ranked by
    ShareGPT assistant turns (chat), Python sources (code) or both (mix), the tokenizer's special and chat-template
    tokens always kept. Prints the map's coverage on held-out chat and code next to the usual sizes."""
    from frspec.vocab.shipped import coverage_rows, domain_counts, load_shipped, resolve_name, shipped_metadata
    from frspec.vocab.shipped import shipped_names, with_vocab_size
    from frspec.vocab.token_map import TokenMap

    if args.list:
        print(f"{'name':<12} {'ids':>8}  {'chat tokens':>12}  {'code tokens':>12}  {'kept':>4}  tokenizer")
        for name in shipped_names():
            m = shipped_metadata(name)
            parts = m["parts"]
            print(f"{name:<12} {m['tokenizer']['vocab_size']:>8,}  {parts['chat']['tokens']:>12,}  "
                  f"{parts['code']['tokens']:>12,}  {len(m['keep_tokens']):>4}  {m['tokenizer_source']}")
        return 0
    missing = [flag for flag, value in (("NAME", args.name), ("--size", args.size), ("--out", args.out))
               if value is None]
    if missing:
        raise FrspecError(f"vocab get needs {', '.join(missing)} (or --list)")
    if args.size <= 0:
        raise FrspecError(f"--size must be a positive number of ids, got {args.size}")
    _check_out(args.out)
    name = resolve_name(args.name)
    parts = load_shipped(name)
    counts = domain_counts(parts, args.domain)
    if args.vocab_size is not None:
        counts = with_vocab_size(counts, args.vocab_size)
    if args.size > counts.vocab_size:
        raise FrspecError(f"--size {args.size} is larger than the {counts.vocab_size:,}-id vocabulary of {name}")
    token_map = TokenMap.from_counts(counts, top_k=args.size)
    token_map.metadata["shipped"] = {"name": name, "domain": args.domain}
    written = token_map.save(args.out, format=args.format)
    rows = coverage_rows(parts, args.domain, [*TABLE_SIZES, args.size], args.vocab_size)
    m = token_map.metadata
    print(f"{name} ({args.domain}): kept {token_map.k:,} of {token_map.vocab_size:,} ids "
          f"({100 * token_map.k / token_map.vocab_size:.1f}%), {m['forced']} special/template tokens forced")
    print(f"coverage       {'k':>8}  {'ranked on':>10}  {'held-out chat':>13}  {'held-out code':>13}")
    for k, cov in rows.items():
        mark = "  <- this map" if k == args.size else ""
        print(f"{'':15}{k:>8,}  {100 * cov['build']:>9.2f}%  {100 * cov['chat-heldout']:>12.2f}%  "
              f"{100 * cov['code-heldout']:>12.2f}%{mark}")
    print(f"wrote {args.out} ({written})")
    return 0


def _count(args: argparse.Namespace) -> int:
    """Count token ids over a corpus into a safetensors file: an int64 count for every id of the full vocabulary
    (added and special tokens included) plus metadata. Chat data (ShareGPT `conversations`, OpenAI `messages`) is
    rendered with the tokenizer's chat template."""
    from frspec.models.tokenizer import load_tokenizer
    from frspec.vocab.counting import count_corpus

    _check_out(args.out)
    if args.vocab_size is not None and args.vocab_size <= 0:
        raise FrspecError(f"--vocab-size must be positive, got {args.vocab_size}")
    tokenizer = load_tokenizer(args.tokenizer)
    counts = count_corpus(
        tokenizer,
        args.input,
        field=args.field,
        assistant_only=args.assistant_only,
        add_special_tokens=args.add_special_tokens,
        vocab_size=args.vocab_size,
        skip=args.skip,
        limit=args.limit,
        progress=not args.no_progress,
    )
    counts.save(args.out)
    m = counts.metadata
    rate = m["tokens"] / max(m["seconds"], 1e-9)
    print(
        f"counted {m['documents']:,} documents ({m['records']:,} records from {len(m['inputs'])} file(s)): "
        f"{m['tokens']:,} tokens, {counts.distinct:,} distinct ids of {counts.vocab_size:,}, "
        f"in {m['seconds']:.1f} s ({rate:,.0f} tokens/s)"
    )
    if m.get("chats_rejected_by_template"):
        print(f"  {m['chats_rejected_by_template']:,} conversations were rejected by the chat template and skipped")
    if m.get("dropped_messages"):
        print(f"  {m['dropped_messages']:,} messages with unknown roles were dropped")
    print(f"wrote {args.out}")
    return 0


def _count_generations(args: argparse.Namespace) -> int:
    """Count the token ids a model generates (greedy, the chat template applied) for calibration prompts of a
    bench dataset: a map ranked by the target's own output (VocabTrim) rather than by a chat corpus. Hold the
    benchmarked prompts out with --skip."""
    from frspec.bench.datasets import load_prompts
    from frspec.bench.generation_counts import count_generations
    from frspec.decode.factory import build_generator
    from frspec.models.loading import load_model, resolve_model_dir, set_threads, vocab_size_of
    from frspec.models.tokenizer import load_tokenizer

    _check_out(args.out)
    if args.skip < 0 or args.num_prompts < 1:
        raise FrspecError(f"--skip must be >= 0 and --num-prompts >= 1, got {args.skip} and {args.num_prompts}")
    if args.max_new_tokens < 1:
        raise FrspecError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    prompts = load_prompts(args.dataset, args.field, args.skip + args.num_prompts)[args.skip:]
    if len(prompts) < args.num_prompts:
        raise FrspecError(f"{args.dataset} has only {len(prompts) + args.skip} prompts, fewer than --skip + "
                          f"--num-prompts ({args.skip + args.num_prompts})")
    set_threads(args.threads)
    tokenizer = load_tokenizer(resolve_model_dir(args.model))
    model = load_model(args.model, dtype=args.dtype)
    counts = count_generations(build_generator(model, tokenizer=tokenizer), tokenizer, prompts,
                               args.max_new_tokens, vocab_size_of(model), progress=not args.no_progress)
    counts.metadata.update(model=str(args.model), dataset=str(args.dataset), skip=args.skip)
    counts.save(args.out)
    m = counts.metadata
    print(f"counted {m['tokens']:,} generated tokens of {m['documents']} prompts, {counts.distinct:,} distinct ids, "
          f"in {m['seconds']:.1f} s")
    print(f"wrote {args.out}")
    return 0


def _merge(args: argparse.Namespace) -> int:
    """Add up the counts of several runs (shards of one corpus). Counts of different tokenizers are refused."""
    from frspec.vocab.counts import TokenCounts, merge_counts

    _check_out(args.out)
    merged = merge_counts([TokenCounts.load(p) for p in args.counts])
    merged.save(args.out)
    print(f"merged {len(args.counts)} files: {merged.total:,} tokens, {merged.distinct:,} distinct ids -> {args.out}")
    return 0


def _build(args: argparse.Namespace) -> int:
    """Select the most frequent ids into a token map. EOS/EOT, every special and added token, the chat template's
    tokens and --keep-text tokens are always kept and count toward k. Ids are ordered by descending count."""
    from frspec.vocab.counts import TokenCounts
    from frspec.vocab.token_map import TokenMap

    _check_out(args.out)
    counts = TokenCounts.load(args.counts)
    if args.vocab_size is not None and args.vocab_size != counts.vocab_size:
        raise FrspecError(
            f"counts cover {counts.vocab_size} ids but --vocab-size is {args.vocab_size}; recount with --vocab-size"
        )
    keep: dict[str, int] = {}
    if args.keep_text and not args.tokenizer:
        raise FrspecError("--keep-text needs --tokenizer to tokenize the text")
    if args.tokenizer:
        tokenizer, identity = _tokenizer_and_identity(args.tokenizer)
        recorded = counts.metadata.get("tokenizer")
        if recorded and recorded.get("vocab_hash") != identity["vocab_hash"]:
            raise FrspecError(
                f"counts were made with tokenizer {recorded.get('name')!r}, not {args.tokenizer!r} "
                "(vocabularies differ)"
            )
        for text in args.keep_text:
            for i in tokenizer.encode(text, add_special_tokens=False):
                keep[str(tokenizer.convert_ids_to_tokens(i))] = int(i)
    token_map = TokenMap.from_counts(
        counts, top_k=args.top_k, keep_fraction=args.keep_fraction, coverage=args.coverage, keep=keep
    )
    written = token_map.save(args.out, format=args.format)
    m = token_map.metadata
    print(
        f"kept {token_map.k:,} of {token_map.vocab_size:,} ids ({100 * token_map.k / token_map.vocab_size:.1f}%), "
        f"covering {100 * m['coverage']:.2f}% of the {m['counted_tokens']:,} counted tokens"
    )
    print(
        f"forced {m['forced']} special/template/keep-text tokens; {m['forced_in']} of them would not have made "
        f"the top {token_map.k:,} by count"
    )
    print(f"wrote {args.out} ({written})")
    return 0


def _convert(args: argparse.Namespace) -> int:
    """Convert a token map between formats (thunlp, vllm-scores, eagle3, frspec). thunlp maps do not record the
    vocabulary size: give --vocab-size or --tokenizer to convert them to the other formats."""
    from frspec.vocab.formats import format_for_path

    _check_out(args.output)
    if Path(args.output).resolve() == Path(args.input).resolve():
        raise FrspecError("output would overwrite the input; choose another path")
    token_map = _load_map(args.input, args.from_format, args)
    written = token_map.save(args.output, format=args.to or format_for_path(args.output))
    print(f"converted {args.input} ({token_map.metadata['format']}, k={token_map.k:,}) -> {args.output} ({written})")
    if written == "eagle3" and token_map.metadata["format"] != "eagle3":
        print("  note: eagle3 stores kept ids sorted by id; the frequency order is not kept")
    return 0


def _info(args: argparse.Namespace) -> int:
    """Describe a token map: format, k, vocabulary size, tokenizer, coverage if known, special tokens kept."""
    token_map = _load_map(args.map, args.format, args)
    m = token_map.metadata
    ids = token_map.ids
    known = m.get("vocab_size_known", True)
    lines = [f"file        {args.map}", f"format      {m['format']}", f"k           {token_map.k:,}"]
    if known:
        lines.append(f"vocab size  {token_map.vocab_size:,} (keeps {100 * token_map.k / token_map.vocab_size:.2f}%)")
    else:
        lines.append(f"vocab size  unknown (not recorded by thunlp; ids reach {int(ids.max()):,})")
    tok = m.get("tokenizer")
    if tok:
        lines.append(f"tokenizer   {tok.get('name')} ({tok.get('vocab_size'):,} ids, vocab {tok.get('vocab_hash')})")
    if "coverage" in m:
        lines.append(f"coverage    {100 * m['coverage']:.2f}% of {m.get('counted_tokens', 0):,} counted tokens")
    if "selection" in m:
        sel = m["selection"]
        lines.append(f"selection   {sel['mode']} = {sel['value']}")
    src = m.get("source") or {}
    if src:
        lines.append(
            f"source      {src.get('documents', '?'):,} documents, {src.get('tokens', '?'):,} tokens"
            + (", assistant turns only" if src.get("assistant_only") is True else "")
        )
    order = "by id (eagle3 keeps no frequency order)" if m["format"] == "eagle3" else "as stored (frequency order)"
    lines.append(f"order       {order}; first ids {ids[:8].tolist()}")
    kept = {t: i for t, i in (m.get("kept_tokens") or {}).items()}
    tokenizer = getattr(args, "_tokenizer", None)
    if tokenizer is not None:
        from frspec.vocab.special_tokens import keep_token_ids

        kept = keep_token_ids(tokenizer)
    if kept:
        in_map = set(ids.tolist())
        present = [f"{t}={i}" for t, i in kept.items() if i in in_map]
        missing = [f"{t}={i}" for t, i in kept.items() if i not in in_map]
        lines.append(f"special     {len(present)} of {len(kept)} kept: {_shorten(present)}")
        if missing:
            lines.append(f"MISSING     {len(missing)} special tokens not in the map: {_shorten(missing)}")
    elif tokenizer is None:
        lines.append("special     unknown (pass --tokenizer to check which special tokens are kept)")
    print("\n".join(lines))
    return 0


def _coverage(args: argparse.Namespace) -> int:
    """Print the coverage curve (k -> share of tokens covered by the k most frequent ids) as a table, optionally
    measured on held-out counts and plotted with k on a log axis."""
    from frspec.vocab.tokenizer_identity import same_tokenizer
    from frspec.vocab.counts import TokenCounts
    from frspec.vocab.coverage import coverage_curve, map_coverage, plot_coverage, table_sizes
    from frspec.vocab.token_map import TokenMap

    if args.plot:
        _check_out(args.plot)
    ranking = TokenCounts.load(args.counts)
    evals = [(p, TokenCounts.load(p)) for p in args.eval_counts]
    for path, ev in evals:
        a, b = ranking.metadata.get("tokenizer"), ev.metadata.get("tokenizer")
        if ev.vocab_size != ranking.vocab_size or (a and b and not same_tokenizer(a, b)):
            raise FrspecError(f"{path} was counted with another tokenizer or vocabulary than {args.counts}")
    curves = {_label(args.counts): coverage_curve(ranking.counts)}
    for i, (path, ev) in enumerate(evals, 2):
        label = _label(path)
        curves[label if label not in curves else f"{label} #{i}"] = coverage_curve(ranking.counts, ev.counts)
    sizes = table_sizes(ranking.vocab_size, args.sizes)
    labels = list(curves)
    width = max(12, *(len(lb) for lb in labels))
    print(f"ranked by {args.counts} ({ranking.total:,} tokens, {ranking.distinct:,} distinct ids)")
    print(f"{'k':>8}  {'% vocab':>7}  " + "  ".join(f"{lb:>{width}}" for lb in labels))
    for k in sizes:
        row = "  ".join(f"{100 * float(curves[lb][k - 1]):>{width - 1}.2f}%" for lb in labels)
        print(f"{k:>8,}  {100 * k / ranking.vocab_size:>6.2f}%  {row}")
    maps = {}
    for path in args.maps:
        token_map = TokenMap.load(path, vocab_size=ranking.vocab_size)
        shares = [map_coverage(token_map.ids, c.counts) for c in [ranking] + [ev for _, ev in evals]]
        cells = "  ".join(f"{lb}: {100 * s:.2f}%" for lb, s in zip(labels, shares))
        print(f"map {path} (k={token_map.k:,}): {cells}")
        maps[f"{Path(path).name} (k={token_map.k:,})"] = token_map.k
    if args.plot:
        title = args.title or "Token coverage of frequency-ranked vocabularies"
        plot_coverage(curves, args.plot, title=title, maps=maps)
        print(f"wrote {args.plot}")
    return 0


# -- helpers -----------------------------------------------------------------------------------------------------


def _check_out(path: str) -> None:
    parent = Path(path).expanduser().resolve().parent
    if Path(path).is_dir():
        raise FrspecError(f"output {path} is a directory")
    if parent.exists() and not parent.is_dir():
        raise FrspecError(f"cannot write {path}: {parent} is not a directory")


def _tokenizer_and_identity(spec: str):
    from frspec.models.tokenizer import load_tokenizer
    from frspec.vocab.tokenizer_identity import tokenizer_identity

    tokenizer = load_tokenizer(spec)
    return tokenizer, tokenizer_identity(tokenizer)


def _load_map(path: str, format: str | None, args: argparse.Namespace):
    """Load a map and check it against --tokenizer / --vocab-size, recording the tokenizer when the map lacks one."""
    from frspec.vocab.token_map import TokenMap

    if args.vocab_size is not None and args.vocab_size <= 0:
        raise FrspecError(f"--vocab-size must be positive, got {args.vocab_size}")
    identity = None
    if args.tokenizer:
        tokenizer, identity = _tokenizer_and_identity(args.tokenizer)
        args._tokenizer = tokenizer
    vocab_size = args.vocab_size
    if vocab_size is None and identity is not None and _is_thunlp(path, format):
        vocab_size = identity["vocab_size"]  # thunlp maps record no size: the tokenizer's completes them
    token_map = TokenMap.load(path, format=format, vocab_size=vocab_size, threshold=args.threshold)
    if identity is not None:
        token_map.check_tokenizer(identity, args.vocab_size)
        if not token_map.metadata.get("tokenizer"):
            token_map.metadata["tokenizer"] = identity
        if not token_map.metadata.get("kept_tokens"):
            from frspec.vocab.special_tokens import keep_token_ids

            token_map.metadata["kept_tokens"] = keep_token_ids(tokenizer)
    return token_map


def _is_thunlp(path: str, format: str | None) -> bool:
    from frspec.vocab.formats import detect_format

    return (format or detect_format(path)) == "thunlp"


def _label(path: str) -> str:
    return Path(path).name.removesuffix(".safetensors")


def _shorten(items: list[str], limit: int = 12) -> str:
    return ", ".join(items[:limit]) + (f", ... (+{len(items) - limit})" if len(items) > limit else "")
