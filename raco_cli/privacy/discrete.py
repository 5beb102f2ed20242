"""Exact integer noise for integer queries: the discrete Gaussian and discrete Laplace.

Noise computed in floating point (Box-Muller, ``-log U``) does not have the distribution the
proofs assume, and the low bits of ``value + noise`` can reveal ``value`` (Mironov, "On
significance of the least significant bits for differential privacy", CCS 2012).  For a query
whose value is an *integer* (a count) the release ``count + Z`` with Z an exactly sampled
integer has no such channel.  Here Z is drawn, with integer arithmetic only, from

* the discrete Laplace, ``P(k) ∝ exp(-|k| / t)``, and
* the discrete Gaussian ``N_Z(0, sigma^2)``, ``P(k) ∝ exp(-k^2 / (2 sigma^2))``,

by Algorithms 1-3 of Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential
Privacy" (NeurIPS 2020, arXiv:2004.00010): Bernoulli(exp(-n/d)) from uniform integers
(Alg. 1), the discrete Laplace from it (Alg. 2, s = 1) and the discrete Gaussian by rejection
from the discrete Laplace of scale t = sigma (Alg. 3, valid for any t > 0; t = sigma keeps the
acceptance exponent ``(|Y| - sigma)^2 / (2 sigma^2)`` an int64 fraction for sigma up to
:data:`MAX_SIGMA`).  Every decision compares integers drawn from 62-bit random words: no float
enters the sampling.  The words come from the run's noise source: ``os.urandom`` for
:class:`~raco_cli.privacy.mechanisms.SecureNoise`, ``torch.randint`` of a seeded
``torch.Generator`` otherwise (reproducible).  Vectorised over a tensor of draws with "while any
pending" masks, on the source's device.

Accounting (why the run's ``GaussianDpEvent(sigma)`` covers ``count + N_Z(0, sigma_Z^2)`` with
``sigma_Z = discrete_gaussian_for(sigma)``, unchanged).  The convolution lemma (Peikert, "An
efficient and parallel Gaussian sampler for lattices", CRYPTO 2010; CKS 2020): let
X ~ N(mu, s1^2) be the continuous Gaussian mechanism (mu the integer query) and Y | X ~
N_Z(X, s2^2) a randomised rounding of X (post-processing: it does not look at mu).  By Poisson
summation

    N(x) := sum_k exp(-(k - x)^2 / (2 s2^2)) = sqrt(2 pi) s2 sum_m exp(-2 pi^2 s2^2 m^2) cos(2 pi m x)

lies in ``sqrt(2 pi) s2 [1 - tau, 1 + tau]`` with ``tau = 2 sum_{m >= 1} exp(-2 pi^2 s2^2 m^2)``
(:func:`rounding_tau`).  Hence ``P(Y = y) = ∫ phi_s1(x - mu) exp(-(y - x)^2 / (2 s2^2)) / N(x) dx``
lies within ``[1 / (1 + tau), 1 / (1 - tau)] * phi_s(y - mu)``, s^2 = s1^2 + s2^2 (the Gaussians
convolve), while ``N_Z(mu, s^2)(y) = phi_s(y - mu) / sum_k phi_s(k - mu)`` with that sum in
``[1 - tau, 1 + tau]`` (the same identity at s >= s2).  So N_Z(mu, s^2) is pointwise within
``exp(±eta)``, ``eta = log((1 + tau) / (1 - tau))`` (:data:`ROUNDING_ETA`), of a post-processing of
the continuous Gaussian mechanism of std ``s1 = sqrt(s^2 - s2^2)``.  A mechanism whose every
output probability is within exp(±H) of an (eps, delta)-DP one is (eps + 2H, e^H delta)-DP
(``P(S) <= e^H (e^eps e^H P'(S) + delta)``), with H = eta times the number of released
coordinates.  At s2 = 2 (:func:`discrete_gaussian_for`'s default) tau = 2 exp(-8 pi^2) ≈ 1.0e-34
(:data:`ROUNDING_TAU`), eta ≈ 2.0e-34: for any realistic number of coordinates the slack is
below 1e-25 in eps and a factor 1 + 1e-25 on delta, far below the accountant's own precision.
``sigma_Z = ceil(sqrt(sigma^2 + 2^2))`` gives s1 = sqrt(sigma_Z^2 - 4) >= sigma, and a Gaussian of
std s1 >= sigma is a post-processing (extra independent noise) of the one of std sigma: the
release is covered by ``GaussianDpEvent(sigma)`` for L2 sensitivity 1.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch

from raco_cli.privacy.csprng import urandom_words
from raco_cli.privacy.mechanisms import NoiseSource, SecureNoise

WORD_BITS = 62  # random words are uniform on [0, 2**62): torch.randint's range and os.urandom >> 2
_WORDS = 1 << WORD_BITS
MAX_SIGMA = 10**7  # 2 sigma^2 and the uniform ranges d K stay far inside int64 up to here
_SQUARE_SAFE = 1 << 31  # |a| <= 2**31: a^2 <= 2**62 fits int64; beyond, the exact Python-int path


def rounding_tau(s2: float) -> float:
    """``tau = 2 sum_{m >= 1} exp(-2 pi^2 s2^2 m^2)``: the Poisson-summation deviation of the
    randomised rounding N_Z(x, s2^2) (module docstring); ~2 exp(-2 pi^2 s2^2) for s2 >= 1."""
    if s2 <= 0:
        raise ValueError(f"the rounding sd must be positive (got {s2})")
    total, m = 0.0, 1
    while True:
        term = math.exp(-2.0 * math.pi**2 * s2 * s2 * m * m)
        total += term
        if term <= total * 1e-17 or term == 0.0:
            return 2.0 * total
        m += 1


def rounding_eta(s2: float) -> float:
    """``eta = log((1 + tau) / (1 - tau))``: the pointwise log-ratio bound of one coordinate."""
    tau = rounding_tau(s2)
    return math.log1p(tau) - math.log1p(-tau)


ROUNDING_SD = 2.0
ROUNDING_TAU = rounding_tau(ROUNDING_SD)  # ≈ 1.0e-34
ROUNDING_ETA = rounding_eta(ROUNDING_SD)  # ≈ 2.0e-34


def discrete_gaussian_for(sigma_continuous: float, rounding_sd: float = ROUNDING_SD) -> int:
    """The integer sigma_Z = ceil(sqrt(sigma^2 + rounding_sd^2)) of the discrete Gaussian that the
    accountant's ``GaussianDpEvent(sigma)`` covers (module docstring), computed exactly.

    >>> discrete_gaussian_for(50.0), discrete_gaussian_for(20.0), discrete_gaussian_for(1e-9)
    (51, 21, 3)
    """
    if not (math.isfinite(sigma_continuous) and sigma_continuous >= 0 and math.isfinite(rounding_sd) and rounding_sd > 0):
        raise ValueError(f"discrete_gaussian_for needs a finite sigma >= 0 and rounding sd > 0 (got {sigma_continuous}, {rounding_sd})")
    target = Fraction(sigma_continuous) ** 2 + Fraction(rounding_sd) ** 2  # exact: no float sqrt/ceil
    c = math.ceil(target)
    return math.isqrt(c - 1) + 1  # the smallest k with k^2 >= c, i.e. k^2 >= target


# --- random words and uniform integers ---------------------------------------------------------


def random_words(count: int, source: NoiseSource) -> torch.Tensor:
    """``count`` independent uniform integers on [0, 2**62), int64 on the source's device."""
    if isinstance(source, SecureNoise):
        words = urandom_words(count) >> np.uint64(64 - WORD_BITS)  # the top 62 bits
        return torch.from_numpy(words.view(np.int64)).to(source.device)
    return torch.randint(0, _WORDS, (count,), generator=source, dtype=torch.int64, device=source.device)


def uniform_below(m: torch.Tensor, source: NoiseSource) -> torch.Tensor:
    """Exactly uniform integers on [0, m) for an int64 tensor m (1 <= m < 2**62), by rejection:
    a word w on [0, 2**62) is kept when w < floor(2**62 / m) * m (a whole number of copies of
    [0, m)), then w mod m."""
    m = m.to(torch.int64)
    if m.numel() and (int(m.min()) < 1 or int(m.max()) >= _WORDS):
        raise ValueError(f"uniform_below needs 1 <= m < 2**{WORD_BITS}")
    return _uniform_below(m, source)


def _uniform_below(m: torch.Tensor, source: NoiseSource) -> torch.Tensor:
    """:func:`uniform_below` without the range check (the samplers' own ranges are in range)."""
    flat = m.reshape(-1)
    limit = (_WORDS // flat) * flat
    out = torch.zeros_like(flat)
    pending = torch.arange(flat.numel(), device=flat.device)
    while pending.numel():
        w = random_words(pending.numel(), source).to(flat.device)
        ok = w < limit[pending]
        done = pending[ok]
        out[done] = w[ok] % flat[done]
        pending = pending[~ok]
    return out.reshape(m.shape)


# --- CKS Algorithm 1: Bernoulli(exp(-n / d)) --------------------------------------------------


def _bernoulli_exp_fraction(n: torch.Tensor, d: torch.Tensor, source: NoiseSource) -> torch.Tensor:
    """Bernoulli(exp(-gamma)), gamma = n / d in [0, 1] (1-D int64 tensors): K = 1; while
    Bernoulli(gamma / K) (a uniform on [0, d K) below n): K += 1; the result is K odd."""
    K = torch.ones_like(n)
    pending = torch.arange(n.numel(), device=n.device)
    while pending.numel():
        dk = d[pending] * K[pending]
        a = _uniform_below(dk, source) < n[pending]
        K[pending[a]] += 1
        pending = pending[a]
    return K % 2 == 1


def bernoulli_exp(n: torch.Tensor, d: torch.Tensor, source: NoiseSource) -> torch.Tensor:
    """Bernoulli(exp(-n / d)) for int64 tensors n >= 0, d >= 1 (broadcast), as a bool tensor.

    gamma <= 1: :func:`_bernoulli_exp_fraction`.  gamma > 1: floor(gamma) independent
    Bernoulli(exp(-1)), all 1 (stopping at the first 0), and Bernoulli(exp(-(gamma - floor gamma)))."""
    n, d = torch.broadcast_tensors(torch.as_tensor(n, dtype=torch.int64), torch.as_tensor(d, dtype=torch.int64))
    shape = n.shape
    n, d = n.reshape(-1).to(source.device), d.reshape(-1).to(source.device)
    if n.numel() and (int(n.min()) < 0 or int(d.min()) < 1):
        raise ValueError("bernoulli_exp needs n >= 0 and d >= 1")
    return _bernoulli_exp(n, d, source).reshape(shape)


def _bernoulli_exp(n: torch.Tensor, d: torch.Tensor, source: NoiseSource) -> torch.Tensor:
    """:func:`bernoulli_exp` of 1-D int64 tensors on the source's device, without the checks."""
    whole, rest = n // d, n % d
    result = torch.ones(n.shape, dtype=torch.bool, device=n.device)
    done = torch.zeros_like(whole)  # Bernoulli(exp(-1)) drawn so far, all 1
    alive = torch.nonzero(whole > 0).reshape(-1)
    while alive.numel():
        one = torch.ones(alive.numel(), dtype=torch.int64, device=n.device)
        b = _bernoulli_exp_fraction(one, one, source)
        result[alive[~b]] = False
        done[alive] += 1
        keep = b & (done[alive] < whole[alive])
        alive = alive[keep]
    last = torch.nonzero(result).reshape(-1)
    if last.numel():
        result[last] = _bernoulli_exp_fraction(rest[last], d[last], source)
    return result


def _bernoulli_exp_int(n: int, d: int, source: NoiseSource) -> bool:
    """:func:`bernoulli_exp` of one pair of Python ints of any size (the same algorithm in exact
    arbitrary-precision integers): the acceptance step of a discrete Gaussian draw whose
    |Y| - sigma exceeds 2**31 (probability below exp(-200) per draw), where (|Y| - sigma)^2
    would overflow int64."""
    def uniform(m: int) -> int:
        # rejection from concatenated 62-bit words (exact for any m >= 1)
        words = max(1, -(-m.bit_length() // WORD_BITS))
        span = 1 << (WORD_BITS * words)
        limit = (span // m) * m
        while True:
            w = 0
            for x in random_words(words, source).tolist():
                w = (w << WORD_BITS) | int(x)
            if w < limit:
                return w % m

    def fraction(num: int, den: int) -> bool:
        k = 1
        while uniform(den * k) < num:
            k += 1
        return k % 2 == 1

    for _ in range(n // d):
        if not fraction(1, 1):
            return False
    return fraction(n % d, d)


# --- CKS Algorithm 2 (s = 1): discrete Laplace ------------------------------------------------


def _geometric(count: int, source: NoiseSource) -> torch.Tensor:
    """V = the number of consecutive 1s of Bernoulli(exp(-1)): P(V = v) = (1 - 1/e) e^-v."""
    device = source.device
    V = torch.zeros(count, dtype=torch.int64, device=device)
    alive = torch.arange(count, device=device)
    while alive.numel():
        one = torch.ones(alive.numel(), dtype=torch.int64, device=device)
        b = _bernoulli_exp_fraction(one, one, source)
        V[alive[b]] += 1
        alive = alive[b]
    return V


def discrete_laplace(shape: tuple[int, ...], t: int, source: NoiseSource) -> torch.Tensor:
    """i.i.d. integers with ``P(k) ∝ exp(-|k| / t)`` (t a positive int), int64 of ``shape`` on
    the source's device (CKS Alg. 2 with s = 1).

    Loop: U uniform on [0, t); reject unless Bernoulli(exp(-U / t)); V geometric
    (:func:`_geometric`); X = U + t V; a fair sign B; reject B = 1 with X = 0; Y = (1 - 2B) X."""
    t = _positive_int(t, "t")
    device = source.device
    count = math.prod(shape)
    out = torch.zeros(count, dtype=torch.int64, device=device)
    pending = torch.arange(count, device=device)
    while pending.numel():
        k = pending.numel()
        tt = torch.full((k,), t, dtype=torch.int64, device=device)
        U = _uniform_below(tt, source)
        D = _bernoulli_exp(U, tt, source)
        U, idx = U[D], pending[D]
        X = U + t * _geometric(idx.numel(), source)
        B = _uniform_below(torch.full((idx.numel(),), 2, dtype=torch.int64, device=device), source)
        ok = ~((B == 1) & (X == 0))
        out[idx[ok]] = ((1 - 2 * B) * X)[ok]
        accepted = torch.zeros(k, dtype=torch.bool, device=device)
        accepted[torch.nonzero(D).reshape(-1)[ok]] = True
        pending = pending[~accepted]
    return out.reshape(shape)


# --- CKS Algorithm 3: discrete Gaussian -------------------------------------------------------


def discrete_gaussian(shape: tuple[int, ...], sigma: int, source: NoiseSource) -> torch.Tensor:
    """i.i.d. draws of N_Z(0, sigma^2), ``P(k) ∝ exp(-k^2 / (2 sigma^2))``, for a positive integer
    sigma <= :data:`MAX_SIGMA`: int64 of ``shape`` on the source's device (CKS Alg. 3, t = sigma).

    Loop: Y discrete Laplace of scale sigma; accept with probability
    exp(-(|Y| - sigma)^2 / (2 sigma^2)) (:func:`bernoulli_exp`)."""
    sigma = _positive_int(sigma, "sigma")
    if sigma > MAX_SIGMA:
        raise ValueError(f"discrete_gaussian: sigma = {sigma} is above {MAX_SIGMA} (its int64 arithmetic is exact only up to there)")
    device = source.device
    count = math.prod(shape)
    out = torch.zeros(count, dtype=torch.int64, device=device)
    pending = torch.arange(count, device=device)
    denominator = 2 * sigma * sigma
    while pending.numel():
        k = pending.numel()
        Y = discrete_laplace((k,), sigma, source)
        a = Y.abs() - sigma
        small = a.abs() <= _SQUARE_SAFE
        accept = torch.zeros(k, dtype=torch.bool, device=device)
        safe = torch.nonzero(small).reshape(-1)
        if safe.numel():
            accept[safe] = _bernoulli_exp(a[safe] * a[safe], torch.full((safe.numel(),), denominator, dtype=torch.int64, device=device), source)
        for i in torch.nonzero(~small).reshape(-1).tolist():  # practically never: see _bernoulli_exp_int
            accept[i] = _bernoulli_exp_int(int(a[i]) ** 2, denominator, source)
        out[pending[accept]] = Y[accept]
        pending = pending[~accept]
    return out.reshape(shape)


def _positive_int(value: int, name: str) -> int:
    if isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ValueError(f"{name} must be a positive integer (got {value!r})")
    return int(value)


def noisy_integer_counts(counts: np.ndarray, noise_multiplier: float, source: NoiseSource) -> np.ndarray:
    """``counts + Z`` as int64 of the same shape, Z i.i.d. N_Z(0, sigma_Z^2) with ``sigma_Z =
    discrete_gaussian_for(noise_multiplier)``: the body of every integer count release (the
    partition's cell counts, :mod:`raco_cli.privacy.size`; a model's certificate,
    :mod:`raco_cli.privacy.certificate`), which route it through the replay tape themselves.

    >>> noisy_integer_counts(np.array([[10, 20]]), 1e-9, torch.Generator().manual_seed(0)).shape
    (1, 2)

    Raises:
        ValueError: a count that is not an integer.
    """
    exact = np.asarray(counts)
    if not np.array_equal(exact.astype(np.int64), exact):
        raise ValueError("an integer count release got non-integer counts")
    z = discrete_gaussian((exact.size,), discrete_gaussian_for(noise_multiplier), source).cpu().numpy()
    return exact.astype(np.int64) + z.reshape(exact.shape)
