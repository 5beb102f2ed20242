"""RDP curves of raco's event trees (the per-trial curve of private tuning): hand formulas,
an independent binomial expansion, a Monte Carlo of both directions, and the PLD as a floor."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from raco_cli.privacy import accountant
from raco_cli.privacy.rdp import (
    ORDERS,
    binary_randomized_response_rdp,
    check_supported,
    rdp_curve,
    rdp_epsilon,
    subsampled_laplace_rdp,
)


def _mironov_laplace(eps: float, a: float) -> float:
    """Mironov (2017), Proposition 6, by hand: the RDP of Laplace with sensitivity/scale eps."""
    return math.log(a / (2 * a - 1) * math.exp((a - 1) * eps) + (a - 1) / (2 * a - 1) * math.exp(-a * eps)) / (a - 1)


def _binomial_expansion(q: float, b: float, a: int) -> float:
    """D_a(M || Lap(0,b)) at integer a: E[((1-q) + qL)^a] = sum_j C(a,j) (1-q)^(a-j) q^j E[L^j],
    E[L^j] = exp((j-1) D_j) for the Laplace pair (an independent computation)."""
    terms = [math.comb(a, j) * (1 - q) ** (a - j) * q**j * math.exp((j - 1) * _mironov_laplace(1 / b, j) if j > 1 else 0.0)
             for j in range(a + 1)]
    return math.log(math.fsum(terms)) / (a - 1)


@pytest.mark.parametrize("b", [0.5, 1.0, 5.0])
def test_unsampled_laplace_is_mironovs_formula(b):
    orders = np.array([1.5, 2.0, 3.5, 10.0, 64.0])
    got = subsampled_laplace_rdp(1.0, b, orders)
    want = np.array([_mironov_laplace(1 / b, a) for a in orders])
    assert np.all(got >= want - 1e-12)  # an upper bound, never below
    np.testing.assert_allclose(got, want, rtol=2e-3)


@pytest.mark.parametrize(("q", "b"), [(0.03, 5.17), (0.3, 1.0), (0.01, 0.5)])
def test_subsampled_laplace_add_direction_matches_the_binomial_expansion(q, b):
    orders = np.array([2, 3, 5, 10, 32])
    got = subsampled_laplace_rdp(q, b, orders.astype(float))
    want = np.array([_binomial_expansion(q, b, int(a)) for a in orders])
    assert np.all(got >= want * (1 - 1e-9))
    np.testing.assert_allclose(got, want, rtol=5e-3)


def test_subsampled_laplace_both_directions_match_a_monte_carlo():
    """Both Rényi divergences of the pair by Monte Carlo over Lap(0,b): the curve is the larger."""
    q, b, a = 0.2, 0.7, 3.0
    x = np.random.default_rng(7).laplace(0.0, b, 4_000_000)
    mix = (1 - q) + q * np.exp((np.abs(x) - np.abs(x - 1)) / b)
    add = math.log(np.mean(mix**a)) / (a - 1)
    remove = math.log(np.mean(mix ** (1 - a))) / (a - 1)
    got = float(subsampled_laplace_rdp(q, b, np.array([a]))[0])
    assert got == pytest.approx(max(add, remove), rel=0.01)
    assert remove > 0 and add > 0


def test_binary_randomized_response_is_the_librarys_under_replace_one():
    eps = 1.3
    p = 2.0 / (1.0 + math.exp(eps))
    for a in (1.5, 2.0, 7.0, 100.0):
        want = rdp_lib._randomized_response_rdp_replace_one(p, 2, a)
        assert float(binary_randomized_response_rdp(eps, np.array([a]))[0]) == pytest.approx(want, rel=1e-9)


def test_gaussians_on_one_sample_are_their_combined_gaussian():
    two = dpa.PoissonSampledDpEvent(0.02, dpa.ComposedDpEvent([dpa.GaussianDpEvent(1.0), dpa.GaussianDpEvent(2.0)]))
    one = dpa.PoissonSampledDpEvent(0.02, dpa.GaussianDpEvent(accountant.combined_gaussian_noise([1.0, 2.0])))
    np.testing.assert_allclose(rdp_curve(two), rdp_curve(one), rtol=1e-12)


def test_the_rdp_epsilon_of_a_raco_run_is_above_its_pld_epsilon_and_close():
    """The PLD is the tight accounting; an RDP curve converted to (eps, delta) may only be looser
    (a curve below the PLD would be a bug), and for a raco_dp run it is within 15 %."""
    step = dpa.ComposedDpEvent([dpa.PoissonSampledDpEvent(0.0356, dpa.LaplaceDpEvent(5.17)),
                                dpa.PoissonSampledDpEvent(0.0356, dpa.GaussianDpEvent(1.293))])
    run = dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(step, 400), dpa.GaussianDpEvent(50.0), dpa.GaussianDpEvent(20.0),
                               dpa.RandomizedResponseDpEvent(2.0 / (1.0 + math.exp(0.1)), 2)])
    pld = accountant.epsilon(run, 1e-5)
    rdp = rdp_epsilon(ORDERS, rdp_curve(run), 1e-5)
    assert pld <= rdp <= 1.15 * pld


def test_a_laplace_sharing_its_sample_has_no_curve():
    shared = dpa.PoissonSampledDpEvent(0.1, dpa.ComposedDpEvent([dpa.LaplaceDpEvent(2.0), dpa.GaussianDpEvent(1.0)]))
    assert "method.sampling=shared" in str(check_supported(shared))
    with pytest.raises(ValueError, match="sampling=shared"):
        rdp_curve(shared)
