"""The exact integer samplers of raco_cli/privacy/discrete.py (Canonne, Kamath, Steinke 2020):
frequencies against the exact probabilities computed here independently (numpy, scipy, mpmath),
the convolution lemma that lets ``GaussianDpEvent(sigma)`` cover the discrete Gaussian, and the
noise sources (seeded generator reproducible, ``os.urandom`` for SecureNoise)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from raco_cli.privacy import discrete
from raco_cli.privacy.discrete import (
    MAX_SIGMA,
    ROUNDING_ETA,
    ROUNDING_TAU,
    bernoulli_exp,
    discrete_gaussian,
    discrete_gaussian_for,
    discrete_laplace,
    random_words,
    rounding_tau,
    uniform_below,
)
from raco_cli.privacy.mechanisms import SecureNoise

pytestmark = pytest.mark.usefixtures("one_torch_thread")
N = 200_000


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _within_binomial(hits: int, n: int, p: float, z: float = 5.0) -> bool:
    return abs(hits - n * p) <= z * math.sqrt(n * p * (1 - p)) + 1e-9


def _pmf(log_weight, radius: int) -> tuple[np.ndarray, np.ndarray]:
    """Support -radius..radius and the pmf normalised over it (the mass beyond is < 1e-300)."""
    k = np.arange(-radius, radius + 1)
    w = np.exp(log_weight(k.astype(np.float64)))
    return k, w / w.sum()


def _chi_square_p(samples: np.ndarray, k: np.ndarray, p: np.ndarray, min_expected: float = 20.0) -> float:
    """Goodness-of-fit p-value: one bin per value with >= min_expected expected draws, the two
    tails pooled into one bin each."""
    n = len(samples)
    central = n * p >= min_expected
    lo, hi = k[central].min(), k[central].max()
    observed = [np.sum(samples < lo)] + [np.sum(samples == v) for v in range(lo, hi + 1)] + [np.sum(samples > hi)]
    expected = [n * p[k < lo].sum()] + [n * p[k == v][0] for v in range(lo, hi + 1)] + [n * p[k > hi].sum()]
    observed, expected = np.array(observed, dtype=float), np.array(expected)
    keep = expected > 0
    chi2 = float((((observed - expected) ** 2) / expected)[keep].sum())
    return float(stats.chi2.sf(chi2, keep.sum() - 1))


def _moments_agree(samples: np.ndarray, k: np.ndarray, p: np.ndarray) -> None:
    """Sample mean 0 and sample variance = the exact variance, each within 5 standard errors."""
    n = len(samples)
    var = float((p * k.astype(float) ** 2).sum())
    mu4 = float((p * k.astype(float) ** 4).sum())
    x = samples.astype(np.float64)
    assert abs(x.mean()) < 5 * math.sqrt(var / n)
    assert abs(x.var() - var) < 5 * math.sqrt((mu4 - var**2) / n)


# --- Bernoulli(exp(-n / d)) -------------------------------------------------------------------


@pytest.mark.parametrize(("n", "d"), [(0, 1), (1, 3), (2, 3), (1, 1), (5, 5), (7, 2), (13, 4), (9, 1)])
def test_bernoulli_exp_has_probability_exp_minus_n_over_d(n, d):
    """Frequencies of 2e5 draws within a 5-sigma binomial band of exp(-n/d), gamma <= 1 and > 1."""
    b = bernoulli_exp(torch.full((N,), n), torch.full((N,), d), _gen(n * 100 + d))
    assert b.dtype == torch.bool and b.shape == (N,)
    p = math.exp(-n / d)
    assert _within_binomial(int(b.sum()), N, p), (int(b.sum()) / N, p)


def test_bernoulli_exp_mixed_parameters_in_one_call():
    """Each element has its own (n, d): a vector of 4 pairs repeated, frequencies per pair."""
    pairs = torch.tensor([[0, 7], [3, 7], [10, 7], [30, 7]])
    reps = 50_000
    n, d = pairs[:, 0].repeat(reps), pairs[:, 1].repeat(reps)
    b = bernoulli_exp(n, d, _gen(1)).reshape(reps, 4)
    for j, (nn, dd) in enumerate(pairs.tolist()):
        assert _within_binomial(int(b[:, j].sum()), reps, math.exp(-nn / dd))


@pytest.mark.parametrize(("n", "d"), [(1, 2), (3, 2), (2**70 + 5, 2**69)], ids=["1/2", "3/2", "(2^70+5)/2^69"])
def test_the_arbitrary_precision_bernoulli_has_probability_exp_minus_n_over_d(n, d):
    g = _gen(7)
    draws = 20_000
    hits = sum(discrete._bernoulli_exp_int(n, d, g) for _ in range(draws))
    assert _within_binomial(hits, draws, math.exp(-n / d))


def test_uniform_below_is_uniform_and_refuses_out_of_range():
    m = torch.tensor([3, 7, 2**61 + 1]).repeat(30_000)
    u = uniform_below(m, _gen(2)).reshape(30_000, 3)
    assert (u >= 0).all() and (u < m[:3]).all()
    for j, size in enumerate((3, 7)):
        counts = np.bincount(u[:, j].numpy(), minlength=size)
        assert stats.chisquare(counts).pvalue > 1e-4
    assert _within_binomial(int((u[:, 2] < 2**60).sum()), 30_000, 2**60 / (2**61 + 1))
    with pytest.raises(ValueError):
        uniform_below(torch.tensor([0]), _gen(0))
    with pytest.raises(ValueError):
        uniform_below(torch.tensor([2**62]), _gen(0))


# --- discrete Laplace and discrete Gaussian: goodness of fit ----------------------------------


@pytest.mark.parametrize("t", [1, 3])
def test_discrete_laplace_fits_its_exact_pmf(t):
    z = discrete_laplace((N,), t, _gen(10 + t)).numpy()
    assert z.dtype == np.int64
    k, p = _pmf(lambda x: -np.abs(x) / t, 60 * t)
    assert _chi_square_p(z, k, p) > 1e-4
    _moments_agree(z, k, p)
    # the closed form of the variance of the discrete Laplace, 2 e^{-1/t} / (1 - e^{-1/t})^2
    q = math.exp(-1 / t)
    assert float((p * k.astype(float) ** 2).sum()) == pytest.approx(2 * q / (1 - q) ** 2, rel=1e-12)


@pytest.mark.parametrize("sigma", [1, 3, 20])
def test_discrete_gaussian_fits_its_exact_pmf(sigma):
    """Chi-square of 2e5 draws against exp(-k^2 / (2 sigma^2)) normalised over |k| <= 40 sigma,
    mean 0 and the exact variance (below sigma^2 for sigma = 1) within 5 standard errors."""
    z = discrete_gaussian((N,), sigma, _gen(20 + sigma)).numpy()
    assert z.dtype == np.int64
    k, p = _pmf(lambda x: -(x**2) / (2 * sigma**2), 40 * sigma)
    assert _chi_square_p(z, k, p) > 1e-4
    _moments_agree(z, k, p)


def test_discrete_gaussian_variance_at_sigma_one_is_below_one():
    """An independent check of the exact pmf itself: Var N_Z(0, 1) = 0.99999...; a continuous
    Gaussian rounded to the nearest integer would have 1 + 1/12."""
    k, p = _pmf(lambda x: -(x**2) / 2, 40)
    var = float((p * k.astype(float) ** 2).sum())
    assert 0.99999 < var < 1.0


@pytest.mark.parametrize("sigma", [1, 3])
def test_discrete_gaussian_is_symmetric(sigma):
    z = discrete_gaussian((N,), sigma, _gen(40 + sigma)).numpy()
    pos, neg = int((z > 0).sum()), int((z < 0).sum())
    assert _within_binomial(pos, pos + neg, 0.5)
    for v in (1, 2):
        a, b = int((z == v).sum()), int((z == -v).sum())
        assert _within_binomial(a, a + b, 0.5)


def test_the_overflow_path_draws_the_same_distribution(monkeypatch):
    """Acceptance steps with |Y| - sigma beyond 2**31 go to the arbitrary-precision Bernoulli;
    with that threshold lowered to 2 most draws take it, and the draws still fit N_Z(0, 9)."""
    monkeypatch.setattr(discrete, "_SQUARE_SAFE", 2)
    z = discrete_gaussian((20_000,), 3, _gen(3)).numpy()
    k, p = _pmf(lambda x: -(x**2) / 18, 120)
    assert _chi_square_p(z, k, p) > 1e-4


def test_discrete_gaussian_refuses_bad_sigmas():
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            discrete_gaussian((2,), bad, _gen(0))
    with pytest.raises(ValueError, match="above"):
        discrete_gaussian((2,), MAX_SIGMA + 1, _gen(0))
    z = discrete_gaussian((3, 4), MAX_SIGMA, _gen(0))
    assert z.shape == (3, 4) and z.dtype == torch.int64


# --- discrete_gaussian_for and the convolution lemma ------------------------------------------


def test_discrete_gaussian_for_is_the_ceiling_of_the_root():
    assert discrete_gaussian_for(50.0) == 51
    assert discrete_gaussian_for(20.0) == 21
    assert discrete_gaussian_for(0.0) == 2
    assert discrete_gaussian_for(1e-9) == 3  # 4 + 1e-18 is above 2^2
    assert discrete_gaussian_for(3.0, 4.0) == 5  # a perfect square stays
    assert discrete_gaussian_for(3e6) == 3_000_001
    for sigma in (0.3, 1.0, 7.5, 100.0, 12345.678):
        z = discrete_gaussian_for(sigma)
        assert z * z - 4 >= sigma * sigma and (z - 1) ** 2 < sigma * sigma + 4  # s1 >= sigma, the smallest such z
    with pytest.raises(ValueError):
        discrete_gaussian_for(float("nan"))


def test_tau_is_the_poisson_summation_deviation():
    """tau against N(x) = sum_k exp(-(k - x)^2 / (2 s2^2)) summed directly: N(0) / (sqrt(2 pi) s2)
    is exactly 1 + tau (every cosine is 1), and N(x) stays within [1 - tau, 1 + tau]."""
    for s2 in (0.5, 0.6, 1.0):
        tau = rounding_tau(s2)
        ks = np.arange(-200, 201)
        xs = np.linspace(0, 1, 101)
        Nx = np.array([np.exp(-((ks - x) ** 2) / (2 * s2**2)).sum() for x in xs]) / (math.sqrt(2 * math.pi) * s2)
        assert Nx[0] - 1 == pytest.approx(tau, rel=1e-6)
        assert (Nx <= 1 + tau * (1 + 1e-6)).all() and (Nx >= 1 - tau * (1 + 1e-6)).all()
    assert ROUNDING_TAU == pytest.approx(2 * math.exp(-8 * math.pi**2), rel=1e-12)
    assert ROUNDING_TAU < 1e-33 and ROUNDING_TAU == pytest.approx(1.0245e-34, rel=1e-4)
    assert ROUNDING_ETA == pytest.approx(2 * ROUNDING_TAU, rel=1e-12)


def _rounded_pmf(y: int, mu: int, s1: float, s2: float) -> float:
    """P(Y = y) for X ~ N(mu, s1^2), Y | X ~ N_Z(X, s2^2), by numerical integration over x."""
    ks = np.arange(mu - 60, mu + 61)

    def integrand(x: float) -> float:
        normaliser = np.exp(-((ks - x) ** 2) / (2 * s2**2)).sum()
        return stats.norm.pdf(x, mu, s1) * math.exp(-((y - x) ** 2) / (2 * s2**2)) / normaliser

    value, _ = integrate.quad(integrand, mu - 20 * s1, mu + 20 * s1, points=[float(y)], limit=400, epsabs=0, epsrel=1e-12)
    return value


@pytest.mark.parametrize(("s1", "mu"), [(1.5, 0), (1.5, 7), (0.25, 0)])
def test_rounding_a_continuous_gaussian_is_the_discrete_gaussian_within_tau(s1, mu):
    """The lemma at s2 = 0.6 (tau = 1.6e-3, visible): P(Y = y) / N_Z(mu, s1^2 + s2^2)(y) lies
    within [(1 - tau) / (1 + tau), (1 + tau) / (1 - tau)] for every y.  At s1 = 1.5 the continuous
    Gaussian averages N(x)'s ripple out (deviation ~5e-6); at s1 = 0.25 the deviation is of
    order tau itself, so the bound is not vacuous."""
    s2 = 0.6
    tau = rounding_tau(s2)
    assert 1e-3 < tau < 2e-3
    s = math.hypot(s1, s2)
    k, p = _pmf(lambda x: -(x**2) / (2 * s**2), 60)
    ratios = np.array([_rounded_pmf(y, mu, s1, s2) / p[k == y - mu][0] for y in range(mu - 5, mu + 6)])
    assert ((1 - tau) / (1 + tau) <= ratios).all() and (ratios <= (1 + tau) / (1 - tau)).all(), ratios
    assert np.abs(ratios - 1).max() > (tau / 2 if s1 < 1 else 1e-7)


@pytest.mark.slow  # ~6 s of mpmath quadrature
def test_at_rounding_sd_two_the_lemma_holds_to_34_digits():
    """s2 = 2 (discrete_gaussian_for's): in 60-digit arithmetic (mpmath), the ratio of the rounded
    continuous Gaussian to the discrete Gaussian is 1 within 2.05e-34 = eta."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 60
    s1, s2, mu = mpmath.mpf("1.5"), mpmath.mpf(2), 0
    s_sq = s1**2 + s2**2
    ks = range(-60, 61)

    def rounded(y: int):
        def f(x):
            normaliser = mpmath.fsum(mpmath.exp(-((k - x) ** 2) / (2 * s2**2)) for k in ks)
            return mpmath.npdf(x, mu, s1) * mpmath.exp(-((y - x) ** 2) / (2 * s2**2)) / normaliser
        return mpmath.quad(f, mpmath.linspace(-30, 30, 13))

    z = mpmath.fsum(mpmath.exp(-(k**2) / (2 * s_sq)) for k in range(-80, 81))
    for y in (0, 3):
        ratio = rounded(y) / (mpmath.exp(-(y**2) / (2 * s_sq)) / z)
        assert abs(ratio - 1) <= mpmath.mpf(ROUNDING_ETA) * (1 + mpmath.mpf("1e-6")), ratio


# --- noise sources ------------------------------------------------------------------------------


def test_a_seeded_generator_reproduces_its_draws():
    a = discrete_gaussian((1000,), 5, _gen(9))
    b = discrete_gaussian((1000,), 5, _gen(9))
    c = discrete_gaussian((1000,), 5, _gen(10))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(discrete_laplace((50,), 2, _gen(1)), discrete_laplace((50,), 2, _gen(1)))


def _devices() -> list[str]:
    return ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("device", _devices())
def test_secure_noise_draws_int64_on_the_source_device(device):
    source = SecureNoise(device)
    z = discrete_gaussian((2000,), 4, source)
    assert z.dtype == torch.int64 and z.device.type == torch.device(device).type and z.shape == (2000,)
    assert 3.5 < z.double().std().item() < 4.5
    assert discrete_laplace((7,), 3, source).device.type == torch.device(device).type


def test_secure_words_are_the_top_62_bits_of_os_urandom(monkeypatch):
    """All-ones bytes give 2**62 - 1, zero bytes 0; and with os.urandom replaced by a seeded
    stream, the secure draws are reproducible: they read os.urandom (through csprng.urandom_words)
    and nothing else."""
    from raco_cli.privacy import csprng

    monkeypatch.setattr(csprng.os, "urandom", lambda k: b"\xff" * k)
    assert random_words(3, SecureNoise()).tolist() == [2**62 - 1] * 3
    monkeypatch.setattr(csprng.os, "urandom", lambda k: b"\x00" * k)
    assert random_words(2, SecureNoise()).tolist() == [0, 0]

    def stream(seed):
        rng = np.random.default_rng(seed)
        return lambda k: rng.bytes(k)

    monkeypatch.setattr(csprng.os, "urandom", stream(4))
    a = discrete_gaussian((100,), 6, SecureNoise())
    monkeypatch.setattr(csprng.os, "urandom", stream(4))
    assert torch.equal(a, discrete_gaussian((100,), 6, SecureNoise()))
