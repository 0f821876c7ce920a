"""The collected features as training examples: per document, token ids, target features and the training mask.

Documents are split deterministically into training and held-out sets (every n-th document is held out), and
grouped into optimizer steps of about `batch_tokens` tokens in an order that depends only on the seed and epoch,
so a resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from frspec.errors import FrspecError
from frspec.train.features import read_manifest
from frspec.vocab.token_map import rank_by_count


@dataclass
class Document:
    ids: torch.Tensor  # [T] long
    hidden: torch.Tensor  # [T, H] the target's features
    mask: torch.Tensor  # [T] bool: positions to train on


class FeatureDataset:
    """All documents of a features directory, held in memory (features are a few KB per token)."""

    def __init__(self, features_dir: str | Path):
        manifest = read_manifest(features_dir)
        if manifest is None or not manifest.get("shards"):
            raise FrspecError(f"no collected features in {features_dir}")
        self.manifest = manifest
        self.documents: list[Document] = []
        for shard in manifest["shards"]:
            path = Path(features_dir) / shard["file"]
            if not path.is_file():
                raise FrspecError(f"feature shard {path} is missing; delete {features_dir} to collect again")
            t = load_file(str(path))
            bounds = t["offsets"].tolist()
            for a, b in zip(bounds[:-1], bounds[1:]):
                self.documents.append(Document(t["input_ids"][a:b].long(), t["hidden"][a:b],
                                               t["loss_mask"][a:b].bool()))

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    def split(self, eval_every: int) -> tuple[list[int], list[int]]:
        """(training, held-out) document indices: every `eval_every`-th document is held out (0: none)."""
        n = len(self.documents)
        held = set(range(eval_every - 1, n, eval_every)) if eval_every > 0 and n >= 2 else set()
        return [i for i in range(n) if i not in held], sorted(held)

    def token_counts(self, indices: list[int]) -> torch.Tensor:
        """How often each id occurs in the training positions of these documents."""
        counts = torch.zeros(self.vocab_size, dtype=torch.long)
        for i in indices:
            d = self.documents[i]
            counts += torch.bincount(d.ids[d.mask], minlength=self.vocab_size)
        return counts


def epoch_batches(indices: list[int], lengths: list[int], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """The documents of one epoch, shuffled by (seed, epoch), grouped into batches of at least `batch_tokens`
    tokens (the last one may be smaller)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = [indices[i] for i in torch.randperm(len(indices), generator=g).tolist()]
    batches, current, tokens = [], [], 0
    for i in order:
        current.append(i)
        tokens += lengths[i]
        if tokens >= batch_tokens:
            batches.append(current)
            current, tokens = [], 0
    if current:
        batches.append(current)
    return batches


def loss_vocab_ids(counts: torch.Tensor, k: int | None, always: list[int] = ()) -> torch.Tensor | None:
    """The ids the token loss is computed over: the k most frequent in training (plus `always`), or None (all)."""
    if k is None or k >= counts.numel():
        return None
    if k < 1:
        raise FrspecError(f"--loss-vocab must be at least 1, got {k}")
    ranked = rank_by_count(counts)[:k].tolist()
    extra = [i for i in always if i not in set(ranked)]
    ids = ranked[: k - len(extra)] + extra if extra else ranked
    return torch.tensor(sorted(ids), dtype=torch.long)
