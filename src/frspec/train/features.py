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
from frspec.vocab.corpus import Corpus, Document, Message
from frspec.decode.stopping import default_eos_ids
from frspec.train.regenerate import first_exchange, generate_with_features
from frspec.train.sequences import Sequence, document_sequence

MANIFEST = "manifest.json"
# Settings that change what the features are; resuming with different ones would mix two datasets.
SETTINGS = ("target", "inputs", "field", "assistant_only", "regenerate", "regenerate_max_new_tokens", "max_seq_len",
            "hidden_size", "vocab_size")


@dataclass
class CollectOptions:
    field: str | None = None
    assistant_only: bool = False
    regenerate: bool = False
    regenerate_max_new_tokens: int = 256
    regenerate_batch: int = 16  # replies decoded together
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


class _ShardWriter:
    """Buffers (sequence, features) pairs and writes them as one shard plus the updated manifest."""

    def __init__(self, features_dir: Path, manifest: dict, start: float):
        self.features_dir, self.manifest, self.start = features_dir, manifest, start
        self.buffer: list[tuple[Sequence, torch.Tensor]] = []
        self.buffered_tokens = 0
        self.records = manifest["records"]  # corpus records fully held by the shards plus the buffer

    def add(self, seq: Sequence, hidden: torch.Tensor) -> None:
        self.buffer.append((seq, hidden))
        self.buffered_tokens += len(seq.ids)

    def rate(self) -> float:
        return (self.manifest["tokens"] + self.buffered_tokens) / max(time.perf_counter() - self.start, 1e-9)

    def flush(self) -> None:
        if not self.buffer:
            return
        manifest, buffer = self.manifest, self.buffer
        name = f"shard-{len(manifest['shards']):05d}.safetensors"
        lengths = torch.tensor([0] + [len(s.ids) for s, _ in buffer])
        tensors = {
            "input_ids": torch.tensor([i for s, _ in buffer for i in s.ids], dtype=torch.int32),
            "loss_mask": torch.tensor([m for s, _ in buffer for m in s.mask], dtype=torch.uint8),
            "hidden": torch.cat([h for _, h in buffer]).contiguous(),
            "offsets": torch.cumsum(lengths, 0),
        }
        with atomic_path(self.features_dir / name) as tmp:
            save_file(tensors, str(tmp))
        manifest["shards"].append({"file": name, "tokens": self.buffered_tokens, "documents": len(buffer)})
        manifest["tokens"] += self.buffered_tokens
        manifest["documents"] += len(buffer)
        manifest["records"] = self.records
        manifest["seconds"] = round(time.perf_counter() - self.start, 3)
        _write_manifest(self.features_dir, manifest)
        self.buffer, self.buffered_tokens = [], 0


def _record_groups(corpus: Corpus, size: int):
    """The corpus's documents in groups of `size` whole records, each with the count of records read through it
    (skipped ones included), so a shard can end exactly after a group."""
    group: list[Document] = []
    in_group, done = 0, corpus.skip
    for doc in corpus:
        record = corpus.skip + corpus.records  # corpus.records counts the current record too
        if record != done:
            if in_group >= size:
                yield done, group
                group, in_group = [], 0
            in_group, done = in_group + 1, record
        group.append(doc)
    if group:
        yield done, group


def _regenerated(target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, renderer: ChatRenderer,
                 chats: list[list[Message]], options: CollectOptions, stop_ids: set[int],
                 pad_id: int) -> list[tuple[Sequence, torch.Tensor]]:
    """Each chat's first exchange answered by the target itself (greedy), with the features of prompt + reply."""
    prompts = []
    for chat in chats:
        prompt = first_exchange(chat)
        if prompt is None:
            continue
        try:
            ids = tokenizer.encode(renderer.render(prompt, add_generation_prompt=True), add_special_tokens=False)
        except Exception:  # jinja raise_exception() for a role order the template rejects
            continue
        room = min(options.regenerate_max_new_tokens, options.max_seq_len - len(ids))
        if len(ids) >= 2 and room >= 1:
            prompts.append((ids, room))
    prompts.sort(key=lambda p: -len(p[0]))  # similar lengths together: less padding
    out = []
    for i in range(0, len(prompts), options.regenerate_batch):
        chunk = prompts[i : i + options.regenerate_batch]
        replies = generate_with_features(target, [p for p, _ in chunk], [r for _, r in chunk], stop_ids, pad_id)
        for (ids, _), (reply, hidden) in zip(chunk, replies):
            mask = [int(not options.assistant_only)] * len(ids) + [1] * len(reply)
            out.append((Sequence(ids + reply, mask), hidden))
    return out


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
        # Absent (None) without --regenerate, so manifests written before this setting existed still match.
        "regenerate_max_new_tokens": options.regenerate_max_new_tokens if options.regenerate else None,
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
    corpus.skip = manifest["records"]
    writer = _ShardWriter(features_dir, manifest, time.perf_counter() - manifest["seconds"])
    total = options.max_tokens if options.max_tokens is not None else None
    bar = tqdm(total=total, initial=min(manifest["tokens"], total or manifest["tokens"]), unit="tok",
               unit_scale=True, desc="regenerating replies" if options.regenerate else "collecting features",
               disable=not options.progress)
    stop_ids = default_eos_ids(target, tokenizer)  # where frspec's own greedy decoding of the target stops
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stop_ids, default=0)

    def sequences(docs: list[Document]) -> list[tuple[Sequence, torch.Tensor]]:
        nonlocal renderer
        if renderer is None and any(not isinstance(d, str) for d in docs):
            renderer = ChatRenderer(tokenizer)  # raises the user-facing "no chat template" error
        as_is = [d for d in docs if isinstance(d, str) or not options.regenerate]
        out = []
        for doc in as_is:
            seq = document_sequence(renderer or _PlainRenderer(tokenizer), doc, options.assistant_only,
                                    options.max_seq_len)
            if seq is not None:
                out.append((seq, target_features(target, torch.tensor(seq.ids)).to("cpu")))
        if options.regenerate:
            chats = [d for d in docs if not isinstance(d, str)]
            out += _regenerated(target, tokenizer, renderer, chats, options, stop_ids, pad_id)
        return out

    exhausted = True
    try:
        group = options.regenerate_batch if options.regenerate else 1
        for records_done, docs in _record_groups(corpus, group):
            for seq, hidden in sequences(docs):
                writer.add(seq, hidden)
                bar.update(len(seq.ids))
            writer.records = records_done
            bar.set_postfix(docs=f"{manifest['documents'] + len(writer.buffer):,}",
                            rate=f"{writer.rate():.0f}/s", refresh=False)
            if writer.buffered_tokens >= options.shard_tokens:
                writer.flush()
            if options.max_tokens is not None and manifest["tokens"] + writer.buffered_tokens >= options.max_tokens:
                exhausted = False
                break
        writer.flush()
    finally:
        bar.close()
    if manifest["tokens"] == 0:
        raise FrspecError("the corpus gave no training tokens (empty, or nothing left after --assistant-only)")
    manifest.update(complete=True, exhausted=exhausted, seconds=round(time.perf_counter() - writer.start, 3))
    _write_manifest(features_dir, manifest)
    return manifest
