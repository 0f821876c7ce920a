"""The one sampler (decode/sampling.py `sample`): the law it draws from, and what it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from frspec.decode.sampling import make_generator, sample
from tests.lossless.lossless_power import TARGET_TV, check_distribution, detectable_tv, samples_for_tv


def _law() -> torch.Tensor:
    """24 outcomes, six of them impossible (first, last and inside), the rest uneven down to 0.2%."""
    p = torch.tensor([0.0, 0.3, 0.002, 0.0, 0.1, 0.05, 0.0, 0.08, 0.004, 0.02, 0.06, 0.0,
                      0.07, 0.01, 0.09, 0.003, 0.04, 0.0, 0.06, 0.011, 0.05, 0.03, 0.02, 0.0], dtype=torch.float64)
    return p / p.sum()


def test_sample_draws_from_the_given_law():
    p = _law()
    n = samples_for_tv(int((p > 0).sum()), TARGET_TV)
    assert detectable_tv(n, int((p > 0).sum())) <= TARGET_TV
    # Rows of one batch are independent draws: n draws as n rows of one call, unnormalised (x3) as callers may pass.
    ids = sample((3 * p).expand(n, -1), make_generator(7))
    counts = np.bincount(ids.numpy(), minlength=len(p))
    check_distribution(counts, p.numpy(), "sample() against its input")


def test_a_wrong_law_fails_the_same_check():
    """The negative control: the same check at the same size rejects draws from a law TV 0.02 away."""
    p = _law()
    n = samples_for_tv(int((p > 0).sum()), TARGET_TV)
    wrong = p.clone()
    wrong[1] -= 0.02
    wrong[4] += 0.02
    counts = np.bincount(sample(wrong.expand(n, -1), make_generator(7)).numpy(), minlength=len(p))
    with pytest.raises(AssertionError):
        check_distribution(counts, p.numpy(), "sample() against another law")


def test_sample_keeps_the_leading_shape_and_never_draws_a_zero():
    p = torch.zeros(2, 3, 50)
    p[..., 49] = 1e-30  # a last id whose mass is all but nothing: still the only id to draw
    p[1, 2, 0] = 1.0
    ids = sample(p, make_generator(0))
    assert ids.shape == (2, 3)
    assert ids[1, 2] == 0 and (ids.flatten()[:5] == 49).all()
    single = torch.tensor([0.0, 0.0, 2.0, 0.0], dtype=torch.float64)
    assert all(int(sample(single, make_generator(s))) == 2 for s in range(50))


def test_sample_is_reproducible_from_its_generator():
    p = _law().expand(100, -1)
    assert torch.equal(sample(p, make_generator(3)), sample(p, make_generator(3)))


@pytest.mark.parametrize("bad", [[0.0, 0.0], [float("nan"), 1.0], [float("inf"), 1.0]])
def test_a_row_without_a_finite_positive_total_is_refused(bad):
    with pytest.raises(ValueError, match="positive finite total"):
        sample(torch.tensor(bad), make_generator(0))
