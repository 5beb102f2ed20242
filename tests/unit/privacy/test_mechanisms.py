"""Noise and sampling: statistics of the draws, seeding, independence."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raco_cli.privacy.mechanisms import (
    gaussian_noise,
    laplace_noise,
    poisson_sample,
    sampling_generator,
)


def test_laplace_std_and_mean():
    g = torch.Generator().manual_seed(0)
    x = laplace_noise((200_000,), 3.0, g).numpy()
    assert x.std() == pytest.approx(math.sqrt(2) * 3.0, rel=0.02)
    assert abs(x.mean()) < 0.05
    # Laplace, not Gaussian: mean absolute deviation equals the scale
    assert np.abs(x).mean() == pytest.approx(3.0, rel=0.02)


def test_laplace_cells_are_independent():
    g = torch.Generator().manual_seed(1)
    draws = torch.stack([laplace_noise((3, 2), 1.0, g) for _ in range(20_000)]).reshape(20_000, 6).numpy()
    corr = np.corrcoef(draws.T)
    off_diagonal = corr[~np.eye(6, dtype=bool)]
    assert np.abs(off_diagonal).max() < 0.05


def test_gaussian_std():
    g = torch.Generator().manual_seed(2)
    x = gaussian_noise((100_000,), 2.5, g).numpy()
    assert x.std() == pytest.approx(2.5, rel=0.02)


def test_noise_changes_every_call_and_replays_under_a_seed():
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a, b = laplace_noise((4,), 1.0, g1), laplace_noise((4,), 1.0, g1)
    assert not torch.equal(a, b)
    assert torch.equal(a, laplace_noise((4,), 1.0, g2))


@pytest.mark.parametrize("n,q", [(1000, 0.05), (30_000, 0.017), (50, 0.5)])
def test_poisson_batch_statistics(n, q):
    g = sampling_generator(3)
    sizes, counts = [], np.zeros(n)
    for _ in range(3000):
        (b,) = poisson_sample(n, q, g)
        assert torch.all(b[1:] > b[:-1])  # sorted, no duplicates
        sizes.append(len(b))
        counts[b.numpy()] += 1
    sizes = np.array(sizes)
    assert sizes.mean() == pytest.approx(n * q, rel=0.02)
    assert sizes.var() == pytest.approx(n * q * (1 - q), rel=0.12)
    assert counts.mean() / 3000 == pytest.approx(q, rel=0.02)  # every row equally likely
    assert len(set(sizes.tolist())) > 5  # sizes vary


def test_two_poisson_samples_are_independent():
    g = sampling_generator(4)
    overlap, sizes = [], []
    n, q = 2000, 0.1
    for _ in range(2000):
        a, b = poisson_sample(n, q, g, count=2)
        sizes.append((len(a), len(b)))
        overlap.append(len(np.intersect1d(a.numpy(), b.numpy())))
    assert np.mean(overlap) == pytest.approx(n * q * q, rel=0.05)  # |A & B| ~ Bin(n, q^2)
    assert abs(np.corrcoef(np.array(sizes).T)[0, 1]) < 0.06


def test_poisson_same_seed_same_batches_and_empty_batches_happen():
    g1, g2 = sampling_generator(9), sampling_generator(9)
    for _ in range(5):
        assert torch.equal(poisson_sample(500, 0.02, g1)[0], poisson_sample(500, 0.02, g2)[0])
    g = sampling_generator(0)
    sizes = [len(poisson_sample(100, 0.005, g)[0]) for _ in range(500)]
    assert 0 in sizes


def test_full_sampling_rate_takes_every_row():
    g = sampling_generator(0)
    a, b = poisson_sample(7, 1.0, g, count=2)
    assert a.tolist() == list(range(7)) == b.tolist()


@pytest.mark.parametrize("shape", [(5000,), (7, 3000)])
def test_gaps_summed_in_place_are_the_expressions_bits(shape):
    """The in-place geometric gaps (half the time of a group's draw) are bit for bit the
    expression the samples were defined by, uniforms at the edges included (U = 0, U -> 1)."""
    from raco_cli.privacy.mechanisms import _cumulative_gaps

    U = np.random.default_rng(1).random(shape)
    U.reshape(-1)[:3] = [0.0, 1.0 - 2.0**-53, 0.5]
    for q in (1e-4, 0.027, 0.3, 0.999):
        lk = math.log1p(-q)
        expected = np.cumsum(np.floor(np.log1p(-U) / lk) + 1.0, axis=-1)
        assert np.array_equal(_cumulative_gaps(U.copy(), lk), expected)
    g, h = sampling_generator(3), np.random.default_rng(3)  # a sample: the rows of the defining expression
    pos = np.cumsum(np.floor(np.log1p(-h.random(int(0.05 * 4000 + 6 * (0.05 * 4000) ** 0.5 + 16))) / math.log1p(-0.05)) + 1.0) - 1.0
    assert poisson_sample(4000, 0.05, g)[0].tolist() == pos[pos < 4000].astype(np.int64).tolist()
