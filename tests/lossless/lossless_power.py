"""The statistical check every lossless distribution test uses, and the power it has.

The check: draw n samples of a discrete outcome (e.g. the first two emitted tokens), then
  1. every outcome the reference gives probability exactly 0 must never occur (checked cell by cell, never pooled);
  2. Pearson's chi-square test of the counts against the reference over the outcomes with probability > 0 (cells
     whose expected count is below 5 are pooled with each other, never with zero cells) must not reject at `ALPHA`.

Power, derived (`detectable_tv`). Let the true law be r = p + d with total variation TV = sum|d|/2 = eps. The
chi-square statistic is approximately noncentral chi-square with df = cells - 1 and noncentrality
lambda = n * sum_i d_i^2 / p_i. Over all d with sum d = 0 and sum |d| = 2 eps, sum d_i^2 / p_i is smallest when d
is proportional to p (d_i = +-2 eps p_i on two halves of p's mass; Cauchy-Schwarz: (sum|d|)^2 <= sum d^2/p * sum p),
giving lambda >= 4 n eps^2. Power grows with lambda, so ANY deviation with TV >= eps is rejected with probability
at least the power at lambda = 4 n eps^2. `detectable_tv(n, cells)` is the eps where that power is `POWER`; its
test (test_power.py) checks the claim by simulation with that worst-case deviation.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq
from scipy.stats import chi2, ncx2

ALPHA = 1e-3  # false-rejection rate of one check (fixed seeds make each run deterministic anyway)
POWER = 0.9  # the probability of rejecting a deviation of the stated size
# What the tests are sized to detect. The fixed-logit tests carry the verification rule: at the 50,419 samples that
# TV 0.015 takes over their 24 outcomes they would also catch each wrong rule their negative controls plant, with
# power above 0.9999 (test_verify_distribution.py). The end-to-end tests check wiring (caches, drafter state, maps
# inside the engine), whose faults move the law far more.
TARGET_TV = 0.015
E2E_TV = 0.1
MIN_EXPECTED = 5.0  # chi-square cells with a smaller expected count are pooled together


def noncentrality_for_power(df: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The noncentrality lambda at which a level-`alpha` chi-square test with `df` degrees of freedom has `power`."""
    crit = chi2.isf(alpha, df)
    return brentq(lambda lam: ncx2.sf(crit, df, lam) - power, 1e-9, 1e6)


def detectable_tv(n: int, cells: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest total-variation distance the check detects with probability >= `power` (module docstring)."""
    return math.sqrt(noncentrality_for_power(cells - 1, alpha, power) / (4.0 * n))


def samples_for_tv(cells: int, tv: float = TARGET_TV, alpha: float = ALPHA, power: float = POWER) -> int:
    """How many samples make `detectable_tv` <= tv."""
    return math.ceil(noncentrality_for_power(cells - 1, alpha, power) / (4.0 * tv * tv))


def pooled(counts: np.ndarray, probs: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(observed, expected) over the cells with probability > 0, small-expectation cells merged into one."""
    counts, probs = counts.reshape(-1).astype(np.float64), probs.reshape(-1).astype(np.float64)
    live = probs > 0
    c, e = counts[live], probs[live] * n
    small = e < MIN_EXPECTED
    if small.any():
        c = np.append(c[~small], c[small].sum())
        e = np.append(e[~small], e[small].sum())
    return c, e


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """(p-value, number of cells) of Pearson's test of `counts` against `probs` (after `pooled`)."""
    n = int(counts.sum())
    c, e = pooled(counts, probs, n)
    stat = float(((c - e) ** 2 / e).sum())
    return float(chi2.sf(stat, len(c) - 1)), len(c)


class DistributionMismatch(AssertionError):
    pass


def check_distribution(counts: np.ndarray, probs: np.ndarray, what: str, alpha: float = ALPHA) -> float:
    """Raise DistributionMismatch unless `counts` are consistent with `probs` (the module's check); returns the
    detectable TV of this check (at POWER) so callers can assert it is as small as they claim."""
    counts, probs = np.asarray(counts), np.asarray(probs, dtype=np.float64)
    if counts.shape != probs.shape:
        raise ValueError(f"counts {counts.shape} and reference {probs.shape} differ in shape")
    if abs(probs.sum() - 1.0) > 1e-9:
        raise ValueError(f"the reference sums to {probs.sum()}, not 1")
    impossible = (probs == 0) & (counts > 0)
    if impossible.any():
        cells = [tuple(int(i) for i in idx) for idx in np.argwhere(impossible)[:5]]
        raise DistributionMismatch(f"{what}: outcomes with reference probability 0 were emitted: {cells}")
    pvalue, cells = chi_square_pvalue(counts, probs)
    n = int(counts.sum())
    empirical_tv = 0.5 * float(np.abs(counts / n - probs).sum())
    if pvalue < alpha:
        raise DistributionMismatch(
            f"{what}: chi-square p = {pvalue:.3g} < {alpha} over {cells} cells, n = {n}, "
            f"empirical TV {empirical_tv:.4f}"
        )
    return detectable_tv(n, cells, alpha)
