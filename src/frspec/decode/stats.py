"""Generation statistics: one type for a single request and for any number of requests added together."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterable


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


@dataclass
class GenerationStats:
    """Counters and timings of one or more generations. All times are seconds of wall clock.

    Decode steps are the target forwards after the prefill; each verifies one draft (empty for vanilla) and emits
    the accepted drafts plus one target token, so `acceptance_length` is 1.00 for vanilla and at most
    num_spec_tokens + 1. The first generated token comes from the prefill forward and is counted in `tokens` but
    not in `decode_tokens`.
    """

    requests: int = 1
    prompt_tokens: int = 0
    tokens: int = 0  # generated tokens emitted (including a final EOS)
    decode_tokens: int = 0  # of which emitted by decode steps
    target_forwards: int = 0  # decode forwards of the target (prefill excluded)
    draft_steps: int = 0  # drafter forwards while proposing (prefill excluded)
    num_spec_tokens: int = 0  # draft length per step, a tree's depth (0 for vanilla)
    accepted_per_position: list[int] = field(default_factory=list)  # steps whose draft position i was accepted
    proposed_per_position: list[int] = field(default_factory=list)  # steps that drafted position i
    tree: str = ""  # the drafted shape (str(TreeShape), e.g. "chain-4"); "" for vanilla
    draft_tokens: int = 0  # drafted tokens (tree nodes) the target verified, over all decode steps
    accepted_depth_histogram: list[int] = field(default_factory=list)  # [m]: decode steps accepting m drafts
    draft_prompt_tokens: int = 0  # prompt tokens the drafter's prefill read (fewer than prompt_tokens: a window)
    prefill_time_s: float = 0.0  # the target's prefill and the first token
    draft_prefill_time_s: float = 0.0  # the drafter's prefill over the prompt (or its window)
    target_time_s: float = 0.0  # decode forwards of the target
    draft_time_s: float = 0.0  # drafter time spent proposing
    draft_lm_head_time_s: float = 0.0  # of which in its LM head alone (docs/engine.md, Timings)
    wall_time_s: float = 0.0  # the whole request, prefill included
    # With the per-request controller (decode/controller.py): decode steps per chosen draft length ([0]: plain
    # steps) and speculative steps per chosen map size; empty without it.
    chosen_depth_histogram: list[int] = field(default_factory=list)
    chosen_map_sizes: dict[int, int] = field(default_factory=dict)

    @classmethod
    def aggregate(cls, items: Iterable[GenerationStats]) -> GenerationStats:
        """Add up requests: counters and times are summed, per-position counts are summed position by position."""
        total = cls(requests=0)
        for s in items:
            for f in fields(cls):
                a, b = getattr(total, f.name), getattr(s, f.name)
                if f.name == "num_spec_tokens":
                    setattr(total, f.name, max(a, b))
                elif isinstance(a, str):
                    setattr(total, f.name, a or b)
                elif isinstance(a, dict):
                    setattr(total, f.name, {key: a.get(key, 0) + b.get(key, 0) for key in sorted({*a, *b})})
                elif isinstance(a, list):
                    width = max(len(a), len(b))
                    a, b = a + [0] * (width - len(a)), b + [0] * (width - len(b))
                    setattr(total, f.name, [x + y for x, y in zip(a, b)])
                else:
                    setattr(total, f.name, a + b)
        return total

    def record_step(self, drafted_depth: int, accepted: int, draft_tokens: int, target_time_s: float) -> None:
        """Count one decode step: one target forward taking `target_time_s`, over a draft with `draft_tokens`
        tokens (a chain's length or a tree's node count; 0 for vanilla) reaching depth `drafted_depth`, of which
        the first `accepted` positions were accepted and kept (drafts cut by an EOS or a stop string do not count)."""
        self.target_forwards += 1
        self.target_time_s += target_time_s
        if drafted_depth == 0:
            return
        for i in range(drafted_depth):
            self.proposed_per_position[i] += 1
            self.accepted_per_position[i] += int(i < accepted)
        if len(self.accepted_depth_histogram) <= accepted:
            self.accepted_depth_histogram.extend([0] * (accepted + 1 - len(self.accepted_depth_histogram)))
        self.accepted_depth_histogram[accepted] += 1
        self.draft_tokens += draft_tokens

    def record_choice(self, depth: int, map_size: int) -> None:
        """Count the controller's choice for one decode step: its draft length and, drafting, its map size."""
        if len(self.chosen_depth_histogram) <= depth:
            self.chosen_depth_histogram.extend([0] * (depth + 1 - len(self.chosen_depth_histogram)))
        self.chosen_depth_histogram[depth] += 1
        if depth:
            self.chosen_map_sizes[map_size] = self.chosen_map_sizes.get(map_size, 0) + 1

    @property
    def acceptance_length(self) -> float | None:
        """Mean tokens emitted per target decode forward; None before any decode step."""
        return _ratio(self.decode_tokens, self.target_forwards)

    @property
    def acceptance_rate_per_position(self) -> list[float | None]:
        """For each draft position i, the fraction of steps drafting it in which it was accepted."""
        return [_ratio(a, p) for a, p in zip(self.accepted_per_position, self.proposed_per_position)]

    @property
    def end_to_end_tokens_per_s(self) -> float | None:
        """Generated tokens per second of the whole request, prefill (prompt processing, first token) included."""
        return _ratio(self.tokens, self.wall_time_s)

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens emitted by decode steps per second of decoding: wall time after the target's prefill.

        The target's prefill is the same work for every method, so leaving it out compares what the methods change.
        A draft model's prefill over the prompt is not: it is what speculating costs before its first draft, so it
        counts as decoding time (leaving it out would credit a static drafter with a free prefill, and count against
        a controller that declines to pay it). This is the throughput `frspec bench` reports and its speedups divide.
        """
        decode_time = self.wall_time_s - self.prefill_time_s
        return self.decode_tokens / decode_time if self.decode_tokens and decode_time > 0 else None

    @property
    def mean_target_forward_s(self) -> float | None:
        return _ratio(self.target_time_s, self.target_forwards)

    @property
    def mean_draft_step_s(self) -> float | None:
        return _ratio(self.draft_time_s, self.draft_steps)

    @property
    def forward_ratio(self) -> float | None:
        """Mean drafter time per draft step over mean target forward time (None for vanilla)."""
        d, t = self.mean_draft_step_s, self.mean_target_forward_s
        return d / t if d is not None and t else None

    @property
    def lm_head_share(self) -> float | None:
        """Share of the drafter's time spent in its LM head."""
        return _ratio(self.draft_lm_head_time_s, self.draft_time_s)

    @property
    def overhead_time_s(self) -> float:
        """Wall time outside the prefills, target forwards and drafting: verification, bookkeeping, stop checks."""
        return (self.wall_time_s - self.prefill_time_s - self.draft_prefill_time_s - self.target_time_s
                - self.draft_time_s)

    def to_dict(self) -> dict[str, Any]:
        """Fields and derived values, JSON-ready (undefined ratios are None)."""
        out = asdict(self)
        for name in (
            "acceptance_length",
            "acceptance_rate_per_position",
            "decode_tokens_per_s",
            "end_to_end_tokens_per_s",
            "mean_target_forward_s",
            "mean_draft_step_s",
            "forward_ratio",
            "lm_head_share",
            "overhead_time_s",
        ):
            out[name] = getattr(self, name)
        return out

    def summary(self) -> str:
        """One human line: tokens, speed, acceptance, forward ratio."""

        def fmt(x: float | None, spec: str) -> str:
            return "-" if x is None else format(x, spec)

        parts = [
            f"{self.tokens} tokens in {self.wall_time_s:.2f}s ({fmt(self.end_to_end_tokens_per_s, '.2f')} tok/s end "
            f"to end, {fmt(self.decode_tokens_per_s, '.2f')} decoding)",
            f"{self.target_forwards} target forwards",
            f"acceptance length {fmt(self.acceptance_length, '.2f')}",
        ]
        if self.tree:
            hist = "/".join(str(c) for c in self.accepted_depth_histogram)
            parts.append(f"tree {self.tree}, accepted depths 0/1/.. {hist}")
        if self.chosen_depth_histogram:
            depths = "/".join(str(c) for c in self.chosen_depth_histogram)
            sizes = ", ".join(f"{k}: {n}" for k, n in sorted(self.chosen_map_sizes.items()))
            parts.append(f"auto: steps per draft length 0/1/.. {depths}, per map size {{{sizes}}}")
        if self.num_spec_tokens:
            parts.append(f"forward ratio {fmt(self.forward_ratio, '.3f')}")
            parts.append(f"draft LM head share {fmt(self.lm_head_share, '.1%')}")
        return ", ".join(parts)
