"""Collecting the target's hidden states over a corpus into safetensors shards, resumably.

    FEATURES_DIR/manifest.json        settings, and per shard: tokens, documents, corpus records consumed
    FEATURES_DIR/shard-00000.safetensors
        input_ids [N] int32, loss_mask [N] uint8, hidden [N, H] (the target's final-normed last hidden state,
        what its LM head reads), offsets [D+1] int64 (document d is rows offsets[d]:offsets[d+1])

A shard is written only at a record boundary and the manifest after it, so an interrupted collection restarts
after the last complete shard and skips exactly the records that shard already holds.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from frspec.errors import FrspecError
from frspec.io import atomic_path
from frspec.vocab.chat import ChatRenderer
from frspec.vocab.corpus import Corpus
from frspec.train.sequences import Sequence, document_sequence, regenerate_chat

MANIFEST = "manifest.json"
# Settings that change what the features are; resuming with different ones would mix two datasets.
SETTINGS = ("target", "inputs", "field", "assistant_only", "regenerate", "max_seq_len", "hidden_size", "vocab_size")


@dataclass
class CollectOptions:
    field: str | None = None
    assistant_only: bool = False
    regenerate: bool = False
    regenerate_max_new_tokens: int = 256
    max_seq_len: int = 1024
    max_tokens: int | None = None
    shard_tokens: int = 1 << 14
    progress: bool = True


def read_manifest(features_dir: str | Path) -> dict | None:
    path = Path(features_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise FrspecError(f"{path} is not valid JSON: {e}; delete {features_dir} to collect again") from e


def _write_manifest(features_dir: Path, manifest: dict) -> None:
    with atomic_path(features_dir / MANIFEST) as tmp:
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")


class _PlainRenderer:
    """Stands in for a ChatRenderer when the tokenizer has no chat template and the data is plain text."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer


@torch.inference_mode()
def target_features(target: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    """The target's last hidden state after its final norm, [T, H], for one sequence of ids [T]."""
    device = target.get_input_embeddings().weight.device
    out = target.base_model(input_ids=ids.view(1, -1).to(device), use_cache=False)
    return out.last_hidden_state[0]


def collect_features(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    inputs: list[str],
    features_dir: str | Path,
    target_name: str,
    options: CollectOptions,
) -> dict:
    """Run the target over the corpus and store its features in shards under `features_dir`; return the manifest.

    Continues an earlier, interrupted collection with the same settings; a finished one is returned as is.
    """
    features_dir = Path(features_dir)
    corpus = Corpus.from_inputs(inputs, field=options.field)
    settings = {
        "target": target_name,
        "inputs": [str(p) for p in corpus.files],
        "field": options.field,
        "assistant_only": options.assistant_only,
        "regenerate": options.regenerate,
        "max_seq_len": options.max_seq_len,
        "hidden_size": int(target.config.hidden_size),
        "vocab_size": int(target.get_output_embeddings().weight.shape[0]),
    }
    manifest = read_manifest(features_dir)
    if manifest is not None:
        changed = [k for k in SETTINGS if manifest.get(k) != settings[k]]
        if changed:
            raise FrspecError(
                f"features in {features_dir} were collected with other settings ({', '.join(changed)}); "
                "delete that directory or pass --regenerate-features to collect again"
            )
        enough = options.max_tokens is not None and manifest["tokens"] >= options.max_tokens
        if manifest.get("complete") and (enough or manifest.get("exhausted")):
            return manifest
    else:
        manifest = {**settings, "shards": [], "tokens": 0, "documents": 0, "records": 0, "seconds": 0.0}
    manifest["complete"] = False
    features_dir.mkdir(parents=True, exist_ok=True)

    renderer = ChatRenderer(tokenizer) if getattr(tokenizer, "chat_template", None) else None
    base = corpus.skip = manifest["records"]
    buffer: list[tuple[Sequence, torch.Tensor]] = []
    buffered_tokens = 0
    buffered_record = manifest["records"]  # records fully held by shards plus the buffer
    start = time.perf_counter() - manifest["seconds"]
    total = options.max_tokens if options.max_tokens is not None else None
    bar = tqdm(total=total, initial=min(manifest["tokens"], total or manifest["tokens"]), unit="tok",
               unit_scale=True, desc="collecting features", disable=not options.progress)

    def flush() -> None:
        nonlocal buffer, buffered_tokens
        if not buffer:
            return
        name = f"shard-{len(manifest['shards']):05d}.safetensors"
        lengths = torch.tensor([0] + [len(s.ids) for s, _ in buffer])
        tensors = {
            "input_ids": torch.tensor([i for s, _ in buffer for i in s.ids], dtype=torch.int32),
            "loss_mask": torch.tensor([m for s, _ in buffer for m in s.mask], dtype=torch.uint8),
            "hidden": torch.cat([h for _, h in buffer]).contiguous(),
            "offsets": torch.cumsum(lengths, 0),
        }
        with atomic_path(features_dir / name) as tmp:
            save_file(tensors, str(tmp))
        manifest["shards"].append({"file": name, "tokens": buffered_tokens, "documents": len(buffer)})
        manifest["tokens"] += buffered_tokens
        manifest["documents"] += len(buffer)
        manifest["records"] = buffered_record
        manifest["seconds"] = round(time.perf_counter() - start, 3)
        _write_manifest(features_dir, manifest)
        buffer, buffered_tokens = [], 0

    exhausted = True
    try:
        for doc in corpus:
            # corpus.records counts the records read so far, the current one included.
            if base + corpus.records != buffered_record:
                if buffered_tokens >= options.shard_tokens:
                    flush()
                if options.max_tokens is not None and manifest["tokens"] + buffered_tokens >= options.max_tokens:
                    exhausted = False
                    break
                buffered_record = base + corpus.records
            if options.regenerate and not isinstance(doc, str):
                doc = regenerate_chat(target, tokenizer, doc, options.regenerate_max_new_tokens)
            if renderer is None and not isinstance(doc, str):
                renderer = ChatRenderer(tokenizer)  # raises the user-facing "no chat template" error
            seq = document_sequence(renderer or _PlainRenderer(tokenizer), doc, options.assistant_only, options.max_seq_len)
            if seq is None:
                continue
            hidden = target_features(target, torch.tensor(seq.ids)).to("cpu")
            buffer.append((seq, hidden))
            buffered_tokens += len(seq.ids)
            bar.update(len(seq.ids))
            bar.set_postfix(docs=f"{manifest['documents'] + len(buffer):,}",
                            rate=f"{(manifest['tokens'] + buffered_tokens) / (time.perf_counter() - start):.0f}/s",
                            refresh=False)
        flush()
    finally:
        bar.close()
    if manifest["tokens"] == 0:
        raise FrspecError("the corpus gave no training tokens (empty, or nothing left after --assistant-only)")
    manifest.update(complete=True, exhausted=exhausted, seconds=round(time.perf_counter() - start, 3))
    _write_manifest(features_dir, manifest)
    return manifest
