"""The training size as a DP count (``privacy.scope=model``).

Under add/remove adjacency the number of training rows n is itself a statistic of the data:
two neighbouring datasets differ in it by exactly one.  A run that wrote the exact n (in the
sample rate q = B / n, the steps planned from q, delta = n^-e, or the mean of a standardisation)
would let a reader who knows everything but one record tell D from D' with certainty.  So under
``scope=model`` n is released once, first, as the exact integer

    n~ = n + Z,   Z ~ N_Z(0, sigma_Z^2),   clamped to >= 1,

(for a constrained run the counts of the constraint's partition cells are released instead, one
discrete Gaussian per cell, and n~ is their sum: :func:`dp_cell_counts`; still one record in one
cell)

with Z drawn exactly, in integer arithmetic, from the discrete Gaussian of integer scale
``sigma_Z = ceil(sqrt(sigma^2 + 2^2))`` (:mod:`raco_cli.privacy.discrete`, Canonne, Kamath and
Steinke 2020): a float Gaussian rounded to an integer would carry the floating-point channel of
Mironov (CCS 2012) in the draw before rounding, an exact integer draw has none.  It is accounted
as the Gaussian mechanism with L2 sensitivity 1 (``GaussianDpEvent(sigma)`` in the run's DpEvent
tree, ``sigma = privacy.size_noise_multiplier``, 50 rows by default, so sigma_Z = 51): by the
convolution lemma (module docstring of :mod:`raco_cli.privacy.discrete`) N_Z(n, sigma_Z^2) is
pointwise within a factor exp(+-2e-34) of a randomised rounding, N_Z(X, 2^2), of the continuous
Gaussian X ~ N(n, s1^2) with s1 = sqrt(sigma_Z^2 - 4) >= sigma, a post-processing of
``GaussianDpEvent(sigma)``; the slack, (eps + 4e-34, (1 + 2e-34) delta), is negligible.  Every
later use of the size reads n~ instead (post-processing): the Poisson rate q = B / n~ (each row
is still sampled independently with probability q, which is what the accountant charges), the
normaliser of every noisy gradient sum (q n~ = B), the DP standardisation's means and the
``privacy.delta_exponent`` delta.  Its cost inside a run's budget is small: a Gaussian of zCDP
rho = 1 / (2 sigma^2) = 0.0002 at sigma = 50, composed with the training releases by the PLD
accountant (Adult, eps = 1: 406 steps instead of 408 without it; sigma = 20 would cost 15; docs/privacy.md),
while an error of +-50 rows moves q by 0.2 % on Adult and 5 % on a 1 000-row table.
"""

from __future__ import annotations

import dp_accounting as dpa
import numpy as np

from raco_cli.privacy import releases
from raco_cli.privacy.discrete import discrete_gaussian, discrete_gaussian_for, noisy_integer_counts
from raco_cli.privacy.mechanisms import NoiseSource


def size_event(noise_multiplier: float) -> dpa.DpEvent:
    """The DpEvent of :func:`dp_size` (L2 sensitivity 1 under add/remove of one record)."""
    return dpa.GaussianDpEvent(noise_multiplier)


def noisy_count(n: int, noise_multiplier: float, source: NoiseSource) -> int:
    """``n + Z``, Z ~ N_Z(0, sigma_Z^2) with ``sigma_Z = discrete_gaussian_for(sigma)`` (exact
    integers), clamped to >= 1 (clamping: post-processing).

    >>> import torch
    >>> noisy_count(100, 50.0, torch.Generator().manual_seed(0))
    82
    """
    z = discrete_gaussian((1,), discrete_gaussian_for(noise_multiplier), source)
    return max(1, int(n) + int(z[0]))


def dp_size(n: int, *, noise_multiplier: float, source: NoiseSource) -> int:
    """The released training size (module docstring), through the replay tape."""
    return int(releases.release("size", lambda: noisy_count(n, noise_multiplier, source)))


def dp_cell_counts(counts: np.ndarray, *, noise_multiplier: float, source: NoiseSource) -> tuple[int, np.ndarray]:
    """The training rows of each cell of a partition (the constraint's global cells), released
    at once as exact integers: ``counts + Z``, Z i.i.d. N_Z(0, sigma_Z^2) per cell
    (:func:`noisy_count`'s noise).  A record is in exactly one cell, so the L2 sensitivity is 1
    and the release is the same ``GaussianDpEvent(sigma)`` as the size count (module
    docstring); the size is their sum (clamped to >= 1), the cells (as float64 integers) feed
    the generalisation margins of ``constraint.confidence`` (:mod:`raco_cli.constraints.margin`).

    Returns:
        (n~, the noisy cell counts).
    """
    noisy = np.asarray(releases.release("size", lambda: noisy_integer_counts(counts, noise_multiplier, source).astype(np.float64)),
                       dtype=np.float64)
    return max(1, int(round(float(noisy.sum())))), noisy
