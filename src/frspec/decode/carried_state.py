"""What a generator's requests carry to its next ones, kept between processes beside the cached step costs.

The controller learns per kind of request (sampling setting, class of prompt length, common tokens or not) how its
drafts are accepted and what drafting saved against what it expected (`controller.carry_worth`), how the drafter's
confidence predicts acceptance (`carried_confidence`), and how long answers run (decode/answer_lengths.py). Within one
process that carries from request to request; `frspec generate` is one request per process, so without this every
call started as a kind's first request, and a kind's first request finds out its acceptance by prefilling its drafter
where drafting pays at acceptance's upper bound. Measured on the AVX2-only EPYC with the int4 pair at temperature
1.0 (`7c32359`): three `frspec generate` calls on one MT-Bench question each prefilled the drafter (0.49-0.51 s),
drafted once and decoded plainly after, 0.95-0.96x vanilla every call.

So a generator whose costs are cached loads what was carried when it starts and writes it after every request, as
its timings (decode/cost_calibration.py). It holds only for the controller's settings and the drafter's ranking it was
learnt with (`tag`); another tag, a damaged file or none starts empty, and a file that cannot be written is logged:
both cost only what a process without it pays. Carried worth and acceptance decay per request as in one process,
so a kind that stopped drafting tries again after a stretch of plain requests.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from frspec.decode.answer_lengths import AnswerLengths
from frspec.decode.controller import CarriedWorth
from frspec.io import atomic_path

log = logging.getLogger(__name__)

# What SpeculativeGenerator.carried returns: confidence bins, worth and answer lengths, each keyed by a tuple.
Carried = tuple[dict, dict, dict]


@dataclass(frozen=True)
class CarriedStore:
    """Where a generator's carried state is kept (`path`), and what it was learnt with (`tag`)."""

    path: Path
    tag: str

    def load(self) -> Carried:
        """The state kept for this tag; empty where there is none, it was learnt with another tag, or the file is
        damaged."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("tag") != self.tag:
                return {}, {}, {}
            confidence = {tuple(k): (list(map(float, a)), list(map(float, n))) for k, (a, n) in data["confidence"]}
            worth = {tuple(k): CarriedWorth(**{f: float(x) for f, x in w.items()}) for k, w in data["worth"]}
            lengths = {tuple(k): AnswerLengths(tuple((int(t), bool(c)) for t, c in a)) for k, a in data["lengths"]}
            return confidence, worth, lengths
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}, {}, {}

    def save(self, carried: Carried) -> None:
        """Write `carried` whole or not at all."""
        confidence, worth, lengths = carried
        data = {"tag": self.tag,
                "confidence": [[list(k), [list(a), list(n)]] for k, (a, n) in confidence.items()],
                "worth": [[list(k), asdict(w)] for k, w in worth.items()],
                "lengths": [[list(k), [list(x) for x in a.answers]] for k, a in lengths.items()]}
        try:
            with atomic_path(self.path) as tmp:
                tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
        except OSError as e:
            log.warning("could not keep what the requests taught the controller at %s (%s); the next process "
                        "starts without it", self.path, e)


def carried_tag(settings: Any, vocab: Any) -> str:
    """What a carried state is learnt with: the controller's `settings` (their repr) and the drafter's `vocab`:
    its ranking (or static map, or none) and context rows. Acceptance and coverage depend on both."""
    ids = getattr(vocab, "rank_of", None)
    if ids is None and vocab.token_map is not None:
        ids = vocab.token_map.ids
    ranking = "none" if ids is None else hashlib.sha1(ids.cpu().numpy().tobytes()).hexdigest()[:16]
    return f"{settings!r}|{type(vocab).__name__}|{ranking}|{getattr(vocab, 'extra_rows', 0)}"


def carried_path(timings_file: Path) -> Path:
    """Where the state carried with the timings at `timings_file` is kept: under the same name in a `carried` folder
    beside their `timings` one."""
    return timings_file.parent.parent / "carried" / timings_file.name
