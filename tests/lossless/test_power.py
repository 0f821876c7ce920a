"""The power claim of power.py, checked by simulation: the chi-square check rejects the worst-case deviation of the
stated TV at least POWER of the time, and rejects the true law about ALPHA of the time."""

import numpy as np
import pytest

from tests.lossless.lossless_power import (
    ALPHA, POWER, TARGET_TV, DistributionMismatch, check_distribution, chi_square_pvalue, detectable_tv,
    samples_for_tv,
)


def _reference(cells: int, seed: int) -> np.ndarray:
    p = np.random.default_rng(seed).dirichlet(np.ones(cells))
    p = np.maximum(p, 0.2 / cells)  # keep expected counts large, as in the real tests
    return p / p.sum()


def _worst_case(p: np.ndarray, tv: float) -> np.ndarray:
    """The deviation with the smallest chi-square noncentrality for its TV: +-2 tv p on two halves of p's mass."""
    order = np.argsort(p)
    half = np.zeros(len(p), bool)
    acc = 0.0
    for i in order[::-1]:  # greedily fill one half of the mass
        if acc < 0.5:
            half[i] = True
            acc += p[i]
    up, down = p[half].sum(), p[~half].sum()
    r = p.copy()
    r[half] += tv * p[half] / up
    r[~half] -= tv * p[~half] / down
    assert abs(0.5 * np.abs(r - p).sum() - tv) < 1e-12
    return r


@pytest.mark.parametrize("cells", [6, 25])
def test_worst_case_deviation_at_the_stated_tv_is_detected(cells):
    n = 20_000
    tv = detectable_tv(n, cells)
    p = _reference(cells, cells)
    r = _worst_case(p, tv)
    rng = np.random.default_rng(1)
    trials = 400
    rejected = sum(chi_square_pvalue(rng.multinomial(n, r), p)[0] < ALPHA for _ in range(trials))
    # POWER is a lower bound (the deviation is the hardest one for its TV); allow binomial noise of 400 trials.
    assert rejected / trials >= POWER - 0.05, (rejected, trials, tv)


def test_the_true_law_is_rarely_rejected():
    p = _reference(25, 3)
    rng = np.random.default_rng(2)
    trials = 2000
    rejected = sum(chi_square_pvalue(rng.multinomial(20_000, p), p)[0] < 0.05 for _ in range(trials))
    assert abs(rejected / trials - 0.05) < 0.02


def test_sizes_and_zero_cells():
    assert detectable_tv(samples_for_tv(30), 30) <= TARGET_TV < detectable_tv(samples_for_tv(30) // 2, 30)
    p = np.array([0.5, 0.5, 0.0])
    with pytest.raises(DistributionMismatch, match="probability 0"):
        check_distribution(np.array([50, 49, 1]), p, "x")  # one impossible outcome fails, whatever the rest says
    assert check_distribution(np.array([5000, 5000, 0]), p, "x") > 0
