"""The joint PLD of a Laplace and a Gaussian release on one Poisson sample (shared mode).

Validated by its limits, by an independent numerical integration of the hockey-stick
divergence (T=1) and by Monte Carlo (T=2).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import integrate, stats

from raco_cli.privacy.joint_pld import ProductLoss, shared_laplace_gaussian_pld

DELTA = 1e-5


def eps(pld, T):
    return pld.self_compose(T).get_epsilon_for_delta(DELTA)


def test_product_loss_cdf_matches_monte_carlo():
    rng = np.random.default_rng(0)
    b, sigma = 2.0, 1.0
    x = rng.laplace(0, b, 1_000_000)
    y = rng.normal(0, sigma, 1_000_000)
    loss = (np.abs(x) - np.abs(x - 1)) / b + (2 * y - 1) / (2 * sigma**2)
    L = ProductLoss(b, sigma)
    for t in (-2.0, -0.5, 0.0, 0.4, 1.5, 3.0):
        assert L.cdf_p(t) == pytest.approx((loss <= t).mean(), abs=2e-3)
        assert L.cdf_p(t) + L.sf_p(t) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("q,T", [(0.01, 300), (0.05, 50)])
def test_limit_infinite_hist_noise_is_subsampled_gaussian(q, T):
    joint = shared_laplace_gaussian_pld(sampling_prob=q, laplace_scale=1e6, gaussian_sigma=1.0)
    gauss = pld_lib.from_gaussian_mechanism(1.0, sampling_prob=q)
    assert eps(joint, T) == pytest.approx(eps(gauss, T), rel=2e-3)


@pytest.mark.parametrize("q,T", [(0.01, 300), (0.05, 50)])
def test_limit_infinite_gradient_noise_is_subsampled_laplace(q, T):
    joint = shared_laplace_gaussian_pld(sampling_prob=q, laplace_scale=2.0, gaussian_sigma=1e5)
    lap = pld_lib.from_laplace_mechanism(2.0, sampling_prob=q)
    assert eps(joint, T) == pytest.approx(eps(lap, T), rel=2e-3)


def test_q_one_is_plain_composition():
    joint = shared_laplace_gaussian_pld(sampling_prob=1.0, laplace_scale=2.0, gaussian_sigma=1.0)
    plain = pld_lib.from_laplace_mechanism(2.0).compose(pld_lib.from_gaussian_mechanism(1.0))
    assert eps(joint, 5) == pytest.approx(eps(plain, 5), rel=1e-6)


@pytest.mark.parametrize("q,sigma,b", [(0.01, 1.0, 2.0), (0.1, 2.0, 5.0), (0.3, 0.8, 1.0)])
def test_shared_is_at_least_independent(q, sigma, b):
    joint = shared_laplace_gaussian_pld(sampling_prob=q, laplace_scale=b, gaussian_sigma=sigma)
    indep = pld_lib.from_laplace_mechanism(b, sampling_prob=q).compose(pld_lib.from_gaussian_mechanism(sigma, sampling_prob=q))
    for T in (1, 20):
        assert eps(joint, T) >= eps(indep, T) - 1e-9


def _exact_delta_single_step(q, b, sigma, epsilon, direction):
    """Hockey-stick divergence of one step by direct 2-D quadrature over the outputs (x, y).

    Independent of the PLD code: it integrates max(0, upper - e^eps lower) of the actual
    output densities on a fine grid (x split at the Laplace kinks 0 and 1).
    """
    x = np.concatenate([
        np.linspace(-25 * b, 0.0, 2501), np.linspace(0.0, 1.0, 801)[1:], np.linspace(1.0, 1 + 25 * b, 2501)[1:]
    ])
    y = np.linspace(-11 * sigma, 1 + 11 * sigma, 2401)
    px, qx = stats.laplace.pdf(x, 0, b), stats.laplace.pdf(x, 1, b)
    py, qy = stats.norm.pdf(y, 0, sigma), stats.norm.pdf(y, 1, sigma)
    P = np.outer(px, py)
    M = (1 - q) * P + q * np.outer(qx, qy)
    diff = M - math.exp(epsilon) * P if direction == "remove" else P - math.exp(epsilon) * M
    inner = integrate.trapezoid(np.clip(diff, 0, None), y, axis=1)
    return integrate.trapezoid(inner, x)


@pytest.mark.parametrize("epsilon", [0.05, 0.2, 0.5])
def test_single_step_matches_numerical_integration(epsilon):
    q, b, sigma = 0.3, 1.5, 1.2
    pld = shared_laplace_gaussian_pld(sampling_prob=q, laplace_scale=b, gaussian_sigma=sigma)
    exact = max(
        _exact_delta_single_step(q, b, sigma, epsilon, "remove"),
        _exact_delta_single_step(q, b, sigma, epsilon, "add"),
    )
    ours = pld.get_delta_for_epsilon(epsilon)
    assert ours >= exact - 2e-6  # pessimistic (up to the quadrature error)
    assert ours == pytest.approx(exact, rel=2e-3, abs=2e-6)  # and tight


def test_two_steps_match_monte_carlo():
    """delta(eps) after T=2 steps vs E[(1 - e^(eps - loss))_+] under the upper distribution."""
    q, b, sigma, T, n = 0.5, 1.0, 1.0, 2, 400_000
    rng = np.random.default_rng(1)
    total = np.zeros(n)
    for _ in range(T):  # REMOVE direction: outputs ~ M = (1-q) P + q Q
        shift = (rng.random(n) < q).astype(float)
        x = rng.laplace(shift, b)
        y = rng.normal(shift, sigma)
        L = (np.abs(x) - np.abs(x - 1)) / b + (2 * y - 1) / (2 * sigma**2)
        total += np.log(1 - q + q * np.exp(L))
    pld = shared_laplace_gaussian_pld(sampling_prob=q, laplace_scale=b, gaussian_sigma=sigma).self_compose(T)
    for epsilon in (0.5, 1.0, 1.5):
        samples = np.clip(1 - np.exp(epsilon - total), 0, None)
        mc, se = samples.mean(), samples.std() / math.sqrt(n)
        ours = pld._pmf_remove.get_delta_for_epsilon(epsilon)
        assert ours == pytest.approx(mc, abs=4 * se + 1e-4)


def _add_direction_monte_carlo(q, b, sigma, T, epsilons, n, seed):
    """delta(eps) of the T-fold ADD pair (P, M) by Monte Carlo: outputs drawn from P (the
    record absent), loss -log(1 - q + q e^L) per step, E[(1 - e^(eps - total loss))_+]."""
    rng = np.random.default_rng(seed)
    total = np.zeros(n)
    for _ in range(T):
        x = rng.laplace(0.0, b, n)
        y = rng.normal(0.0, sigma, n)
        L = (np.abs(x) - np.abs(x - 1)) / b + (2 * y - 1) / (2 * sigma**2)
        total -= np.log1p(q * np.expm1(L))
    out = []
    for epsilon in epsilons:
        samples = np.clip(1 - np.exp(epsilon - total), 0, None)
        out.append((samples.mean(), samples.std() / math.sqrt(n)))
    return out


def test_add_direction_binds_and_matches_monte_carlo():
    """Where the ADD direction binds (a strong Laplace part, few compositions: here by 6-9 % in
    delta), the composed PLD follows it: its ADD pmf matches Monte Carlo and its delta(eps) is
    the ADD one, not the smaller REMOVE one.  (REMOVE binds at the usual small deltas, so a
    PLD that dropped the ADD direction passed every other test.)"""
    q, b, sigma, T = 0.5, 3.0, 50.0, 3
    step = shared_laplace_gaussian_pld(sampling_prob=q, laplace_scale=b, gaussian_sigma=sigma)
    with np.errstate(over="ignore"):  # dp-accounting's tail-bound search overflows harmlessly here
        pld = step.self_compose(T)
    for epsilon, (mc, se) in zip((0.2, 0.25), _add_direction_monte_carlo(q, b, sigma, T, (0.2, 0.25), 400_000, 2)):
        add, remove = pld._pmf_add.get_delta_for_epsilon(epsilon), pld._pmf_remove.get_delta_for_epsilon(epsilon)
        assert add == pytest.approx(mc, abs=4 * se + 2e-4)  # the ADD pmf is right
        assert mc > remove + 4 * se  # and ADD binds here (Monte Carlo says so, independently of the pmfs)
        assert pld.get_delta_for_epsilon(epsilon) >= mc - 4 * se  # the PLD accounts for it
