"""The store's running moments against the two-pass float64 mean and variance of all rows.

A store's statistics are per-batch moments combined pairwise (Chan, Golub & LeVeque 1979,
eq. 2.1: M2 = M2_a + M2_b + delta^2 n_a n_b / n). The reference here is the textbook
two-pass formula over the concatenated rows, so a wrong term of the pairwise update (a
count dropped from the cross term, the mean weighted the wrong way) is seen whatever the
batch sizes; the sizes are unequal on purpose, since with equal ones several wrong weights
agree with the right one.
"""

import torch

from hookedattn.store._writer import RunningMoments

SIZES = [1, 3, 7, 2, 5]  # unequal: n_a n_b / n differs from n_b / n and from n_a / n


def batches(offset: float = 0.0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [
        offset + torch.randn(n, 4, 3, generator=generator, dtype=torch.float64) * (1 + i)
        for i, n in enumerate(SIZES)
    ]


def combined(rows: list[torch.Tensor]) -> RunningMoments:
    empty = torch.zeros((), dtype=torch.float64)
    total = RunningMoments(0, empty, empty)
    for batch in rows:
        total = total.combine(RunningMoments.of(batch))
    return total


def two_pass(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean, then the mean squared deviation from it (the biased variance), over all rows."""
    every = torch.cat(rows)
    mean = every.sum(0) / every.shape[0]
    return mean, ((every - mean) ** 2).sum(0) / every.shape[0]


def test_one_batch_has_the_two_pass_mean_and_variance():
    rows = batches()[2:3]
    moments, (mean, var) = RunningMoments.of(rows[0]), two_pass(rows)
    assert moments.count == 7
    torch.testing.assert_close(moments.mean, mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(moments.m2 / moments.count, var, rtol=0, atol=1e-12)


def test_batches_of_unequal_sizes_combine_to_the_two_pass_mean_and_variance():
    rows = batches()
    moments, (mean, var) = combined(rows), two_pass(rows)
    assert moments.count == sum(SIZES)
    torch.testing.assert_close(moments.mean, mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(moments.m2 / moments.count, var, rtol=0, atol=1e-12)


def test_the_combination_does_not_depend_on_the_order_of_the_batches():
    rows = batches()
    forward, backward = combined(rows), combined(rows[::-1])
    torch.testing.assert_close(forward.mean, backward.mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(forward.m2, backward.m2, rtol=1e-12, atol=1e-12)


def test_a_mean_far_from_zero_keeps_the_variance():
    # Batches are shifted by 1e6: a one-pass sum of squares would lose the variance (~1-25)
    # to cancellation at this size; the shifted sums and the pairwise update keep it.
    rows, far = batches(), batches(offset=1e6)
    near_var = combined(rows).m2 / sum(SIZES)
    far_moments = combined(far)
    torch.testing.assert_close(far_moments.m2 / sum(SIZES), near_var, rtol=1e-7, atol=0)
    torch.testing.assert_close(far_moments.mean, two_pass(far)[0], rtol=1e-12, atol=0)
