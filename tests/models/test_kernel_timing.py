"""The timer the models' kernel choices are made with (models/kernel_timing.py), on a fake clock: a stretch of a
shared machine's noise must not decide a choice that holds for the whole process."""

from __future__ import annotations

from frspec.models import kernel_timing


class SpellClock:
    """A clock that the timed calls advance: each call costs its kernel's seconds, times `slowdown` during the
    first `spell` calls of all (a noisy stretch of the machine)."""

    def __init__(self, spell: int, slowdown: float = 10.0):
        self.now, self.calls, self.spell, self.slowdown = 0.0, 0, spell, slowdown

    def perf_counter(self) -> float:
        return self.now

    def kernel(self, seconds: float):
        def call() -> None:
            self.now += seconds * (self.slowdown if self.calls < self.spell else 1.0)
            self.calls += 1
        return call


def test_a_noisy_stretch_over_the_first_calls_weighs_on_both_kernels_alike_and_the_medians_ignore_it(monkeypatch):
    # Twelve calls: the first three rounds' warm-ups and timed calls of both kernels. Timed one after the other
    # (a warm-up and three calls each), the faster kernel would have taken the whole spell: 10 s against 3 s.
    clock = SpellClock(spell=12)
    monkeypatch.setattr(kernel_timing.time, "perf_counter", clock.perf_counter)
    fast, slow = kernel_timing.alternated_medians(clock.kernel(1.0), clock.kernel(3.0))
    assert (fast, slow) == (1.0, 3.0)
    assert clock.calls == 9 * 2 * 2  # nine rounds, each a warm-up and a timed call of each kernel


def test_a_spell_over_most_rounds_slows_both_medians_without_reordering_the_kernels(monkeypatch):
    clock = SpellClock(spell=24)  # six of the nine rounds
    monkeypatch.setattr(kernel_timing.time, "perf_counter", clock.perf_counter)
    fast, slow = kernel_timing.alternated_medians(clock.kernel(1.0), clock.kernel(3.0))
    assert (fast, slow) == (10.0, 30.0)
