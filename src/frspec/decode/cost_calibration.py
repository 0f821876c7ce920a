"""The controller's step costs rescaled from the forwards the engine times itself, after and within requests.

The controller (decode/controller.py) decides by a table of what the target's forward over n rows costs on this
machine (decode/step_costs.py), measured once and cached. A table measured hours before, or during a noisy spell,
can be wrong in the one place a decision turns on, and then the controller never finds out: it avoids the row count
that looks dear, so it never times it. Measured on the 2-core AVX-512 EPYC (bf16, MT-Bench at temperature 1.0): a
14-hour-old table whose 3-row forward read 313 ms between 2 rows' 278 ms and 4 rows' 291 ms made `auto` draft 2 tokens
on 1 step of 210, and it ran 0.96x the best static row; measured again, it drafted 2 tokens on 120 of 183 steps and ran
1.07x. An int4 table with a 106 ms one-row forward (measured again: 79 ms) held `auto` at 0.96x int4 vanilla end to
end, where the fresh one gave 1.00x.

Every decode step already times its target forward (decode/step.py's `target_time_s`, synchronised on a GPU) and
its drafting (the drafter's `time_s`). So each forward of a controlled request adds the ratio of its time to what
the table it started from predicts (at its row count and context) to `StepTimings`; once a row count has
`CALIBRATION_SAMPLES` forwards, the median of its last `CALIBRATION_WINDOW` ratios scales the table's curve there.
Between timed row counts the scale is interpolated (linearly in rows), beyond them the nearest one's holds: the
table's shape stands in where nothing was timed, its level follows what was. The drafter's steps give one pooled
ratio that scales every drafting term (a step drafts at one or two widths; its curve over rows is not what moves),
and until it has drafted often enough, the target's overall ratio does: a slow spell slows both, and rescaling the
target alone would make drafting look cheaper or dearer than it is. The engine recalibrates after every request, and
within one every `RESCALE_EVERY` timed forwards (from every forward timed before it and its own so far): a table off
in the one entry a decision turns on would otherwise decide a run's first request of each kind whole (measured on
the int4 pair at temperature 1.0, `8cfeab6`: a table whose one-row forward read 104 ms where the run's own ran 0.83x
that made chains of 1 look paying, and both MT-Bench questions drafted them on 169 of 178 steps at 0.90x vanilla).
A request's choices remain a function of its seed, its observations (its timed forwards among them) and the table
it started with.

Where the costs come from the cache (decode/cost_measure.py), the timings are kept beside them (`timings_path`), so
the next process starts from the recalibrated table and does not time again what was timed: a `frspec generate` is
one request per process. They hold only for the table they were timed against; a table measured again starts over.

A row count the controller never chooses is never timed, so its entry would stay wrong. The controller therefore
also drafts, now and then, a length whose row count has fewer than `CALIBRATION_SAMPLES` timed forwards when its
expected rate is within `COST_EXPLORE_LOSS` of the best (controller.py, `choose`): a decision that close is the
only kind a wrong entry can flip, and it costs at most that share of those few steps, once per generator (once per
machine and pair where the timings are kept). An entry wrong by more than that share in the direction that makes its
option look worse stays wrong, except plain decoding's: the controller times the one-row forward however far behind
it looks, since every draft is weighed against it (measured from a stale int4 table, it was never timed,
docs/benchmarks.md, `39d2f0e`; and where only drafts are timed, their scale holds down to one row).
"""

from __future__ import annotations

import json
import logging
import statistics
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from frspec.decode.step_costs import StepCosts, fullest_table, interpolate, interpolate_like
from frspec.decode.tree_shape import TreeShape
from frspec.io import atomic_path

log = logging.getLogger(__name__)

# Timed forwards of one row count before their median replaces the table's level there. Each forward timed at a wrong
# level may be a step that loses: on the AVX2-only EPYC a fresh int4 table read 2 rows at 168 ms where the run's own
# ran 215 (x1.28; measured again in one process, five tables read 149-213 ms), chains of 1 looked 9% ahead of plain
# decoding, and MT-Bench's first question drafted 16 steps before the scale took (0.80x vanilla, docs/benchmarks.md).
# Four: the median of four still stands a slow first forward after a prefill.
CALIBRATION_SAMPLES = 4
# The most recent timed forwards kept per row count: a machine's speed drifts (another process, the clock), and the
# last few dozen forwards say what a step costs now.
CALIBRATION_WINDOW = 64
# Within a request, the costs are rescaled again after every this many of its timed target forwards: as often as a
# row count can gain a scale, and not at every step (rescaling copies the tables, about a millisecond).
RESCALE_EVERY = CALIBRATION_SAMPLES
# A cached table whose timed forwards ran more than this share off it overall (their median ratio), over at least
# STALE_FORWARDS of them, is measured again at the next start (decode/cost_measure.py): rescaling keeps the table's
# shape where nothing was timed, and a table that far off likely has the wrong shape too. Over the runs at `39d2f0e`
# (docs/benchmarks.md) the forwards ran at a median 0.76 of the 14-hour-old bf16 table (measured again by this),
# 0.89 of the stale int4 one and 0.91 of a 2.5-hour-old bf16 one (both kept, rescaled): a tighter bound could not
# tell the last two apart.
STALE_LEVEL = 0.15
STALE_FORWARDS = 32


@dataclass
class StepTimings:
    """One generator's timed forwards, as ratios to what the `reference` table predicts for them: the target's by
    row count, the drafter's pooled (its steps' times over the model's draft time). `path`: where they are kept
    between processes (beside cached costs, `timings_path`; None: in this process only)."""

    reference: StepCosts
    path: Path | None = None
    target_ratios: dict[int, deque] = field(default_factory=dict)
    draft_ratios: deque = field(default_factory=lambda: deque(maxlen=CALIBRATION_WINDOW))

    def add_target(self, rows: int, context: int, seconds: float) -> None:
        """One target forward over `rows` rows after `context` tokens that took `seconds`."""
        predicted = self.reference.target(rows, self._context(context))
        if predicted > 0 and seconds > 0:
            self.target_ratios.setdefault(rows, deque(maxlen=CALIBRATION_WINDOW)).append(seconds / predicted)

    def add_draft(self, shape: TreeShape, k: int | None, context: int, behind: int, seconds: float) -> None:
        """One step's drafting of `shape` over a k-row map after `context` tokens, `behind` tokens of plain steps
        caught up first, that took `seconds`."""
        context = self._context(context)
        predicted = self.reference.draft_time_s(shape, k, context) + self.reference.behind_s(behind, context)
        if predicted > 0 and seconds > 0:
            self.draft_ratios.append(seconds / predicted)

    def merge(self, other: StepTimings) -> None:
        """Add `other`'s timings (one request's, against the same reference) after this one's."""
        if other.reference is not self.reference:
            raise ValueError("timings against different reference tables do not add up")
        for rows, ratios in other.target_ratios.items():
            self.target_ratios.setdefault(rows, deque(maxlen=CALIBRATION_WINDOW)).extend(ratios)
        self.draft_ratios.extend(other.draft_ratios)

    def merged(self, other: StepTimings) -> StepTimings:
        """A copy of these timings with `other`'s added after them (as `merge`); neither is modified."""
        out = StepTimings(self.reference, self.path)
        out.merge(self)
        out.merge(other)
        return out

    def samples(self) -> dict[int, int]:
        """Timed target forwards kept per row count."""
        return {rows: len(ratios) for rows, ratios in self.target_ratios.items()}

    def target_scales(self) -> dict[int, float]:
        """The median ratio of each row count timed often enough (CALIBRATION_SAMPLES)."""
        return {rows: statistics.median(ratios) for rows, ratios in sorted(self.target_ratios.items())
                if len(ratios) >= CALIBRATION_SAMPLES}

    def level(self) -> float | None:
        """The median ratio over every kept target forward, once there are STALE_FORWARDS of them: how far off the
        reference table runs overall."""
        every = [r for ratios in self.target_ratios.values() for r in ratios]
        return statistics.median(every) if len(every) >= STALE_FORWARDS else None

    def draft_scale(self) -> float | None:
        """The drafter's median ratio once it drafted often enough; before that the target's over all its
        forwards (both run on this machine's kernels, so a slower or faster spell moves them alike, and scaling
        the target alone would tilt the choice between drafting and not); None before either."""
        if len(self.draft_ratios) >= CALIBRATION_SAMPLES:
            return statistics.median(self.draft_ratios)
        every = [r for ratios in self.target_ratios.values() for r in ratios]
        return statistics.median(every) if len(every) >= CALIBRATION_SAMPLES else None

    def costs(self) -> StepCosts:
        """The reference table rescaled by what was timed (module docstring); the reference itself before enough
        was. The reference is never modified."""
        return recalibrated(self.reference, self.target_scales(), self.draft_scale(),
                            sum(self.samples().values()), len(self.draft_ratios))

    def _context(self, context: int) -> int | None:
        return context if self.reference.contexts else None

    def to_dict(self) -> dict[str, Any]:
        return {"reference_target_costs": self.reference.to_dict()["target_costs"],
                "target_ratios": {str(n): list(r) for n, r in sorted(self.target_ratios.items())},
                "draft_ratios": list(self.draft_ratios)}

    @classmethod
    def from_dict(cls, data: Any, reference: StepCosts) -> StepTimings:
        """Timings saved by `to_dict`; ValueError if they were timed against another table or are malformed."""
        if not isinstance(data, dict) or data.get("reference_target_costs") != reference.to_dict()["target_costs"]:
            raise ValueError("timed against another table")
        timings = cls(reference)
        for n, ratios in data["target_ratios"].items():
            timings.target_ratios[int(n)] = deque((_positive(r) for r in ratios), maxlen=CALIBRATION_WINDOW)
        timings.draft_ratios.extend(_positive(r) for r in data["draft_ratios"])
        return timings


def _positive(value: Any) -> float:
    out = float(value)
    if not out > 0:
        raise ValueError(f"a ratio must be > 0, got {value!r}")
    return out


def timings_path(costs_path: Path) -> Path:
    """Where the timings against the cached costs at `costs_path` are kept: under the same name in a `timings`
    folder beside it."""
    return costs_path.parent / "timings" / costs_path.name


def load_timings(path: Path | None, reference: StepCosts) -> StepTimings:
    """The timings kept at `path` against `reference` (to be kept there again); empty ones when there are none, or
    they were timed against another table (the costs were measured again), or the file is damaged."""
    if path is not None and path.is_file():
        try:
            timings = StepTimings.from_dict(json.loads(path.read_text(encoding="utf-8")), reference)
            timings.path = path
            return timings
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # start over: the next save replaces it
    return StepTimings(reference, path=path)


def save_timings(timings: StepTimings) -> None:
    """Write `timings` to their `path` (if any) whole or not at all; a cache that cannot be written costs only the
    next process's recalibration, so it is logged, not raised."""
    path = timings.path
    if path is None:
        return
    try:
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(timings.to_dict()) + "\n", encoding="utf-8")
    except OSError as e:
        log.warning("could not keep the timed step costs at %s (%s); the next run times them again", path, e)


def recalibrated(reference: StepCosts, target_scales: dict[int, float], draft_scale: float | None = None,
                 target_forwards: int = 0, draft_steps: int = 0) -> StepCosts:
    """`reference` with its target forward over n rows scaled by `target_scales` (row count -> timed / predicted),
    interpolated between the row counts given and held beyond them (the row counts given are added to the tables,
    so a timed count between two measured ones reads as timed), and every drafting term (the draft forward at each
    width and context, the heads, the per-forward overhead) by `draft_scale`. The counts of timed forwards and
    steps the scales rest on go into the provenance."""
    if not target_scales and draft_scale is None:
        return reference

    def scale(n: int) -> float:
        if not target_scales:
            return 1.0
        return interpolate(target_scales, min(max(n, min(target_scales)), max(target_scales)))

    # A row count a context's table lacks reads as the reference reads it there: along the fullest table's shape.
    fullest = fullest_table(reference.target_costs, reference.target_by_context)

    def target(table: dict[int, float]) -> dict[int, float]:
        return {n: interpolate_like(table, n, fullest) * scale(n) for n in sorted(set(table) | set(target_scales))}

    d = 1.0 if draft_scale is None else draft_scale

    def draft(table: dict) -> dict:
        return {key: value * d for key, value in table.items()}

    provenance = dict(reference.provenance)
    provenance["recalibrated"] = {
        "target_forwards": target_forwards, "draft_steps": draft_steps,
        "target_scales": {str(n): round(s, 4) for n, s in sorted(target_scales.items())},
        "draft_scale": None if draft_scale is None else round(draft_scale, 4)}
    return replace(reference, target_costs=target(reference.target_costs),
                   target_by_context={c: target(t) for c, t in reference.target_by_context.items()},
                   draft_base_costs=draft(reference.draft_base_costs),
                   draft_base_by_context={c: draft(t) for c, t in reference.draft_base_by_context.items()},
                   head_costs={k: draft(t) for k, t in reference.head_costs.items()},
                   draft_forward_overhead_s=reference.draft_forward_overhead_s * d,
                   provenance=provenance)
