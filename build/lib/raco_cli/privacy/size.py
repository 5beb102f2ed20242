"""The training size as a DP count (``privacy.scope=model``).

Under add/remove adjacency the number of training rows n is itself a statistic of the data:
two neighbouring datasets differ in it by exactly one.  A run that wrote the exact n (in the
sample rate q = B / n, the steps planned from q, delta = n^-e, or the mean of a standardisation)
would let a reader who knows everything but one record tell D from D' with certainty.  So under
``scope=model`` n is released once, first, as

    n~ = round(n + N(0, sigma^2)),   clamped to >= 1,

(for a constrained run the counts of the constraint's partition cells are released instead, one
Gaussian per cell, and n~ is their sum: :func:`dp_cell_counts`; still one record in one cell)

the Gaussian mechanism with L2 sensitivity 1 (``GaussianDpEvent(sigma)`` in the run's DpEvent
tree, ``sigma = privacy.size_noise_multiplier``, 50 rows by default), and every later use of
the size reads n~ instead (post-processing): the Poisson rate q = B / n~ (each row is still
sampled independently with probability q, which is what the accountant charges), the
normaliser of every noisy gradient sum (q n~ = B), the DP standardisation's means and the
``privacy.delta_exponent`` delta.  Its cost inside a run's budget is small: a Gaussian of zCDP
rho = 1 / (2 sigma^2) = 0.0002 at sigma = 50, composed with the training releases by the PLD
accountant (Adult, eps = 1: 406 steps instead of 408 without it; sigma = 20 would cost 15; docs/privacy.md),
while an error of +-50 rows moves q by 0.2 % on Adult and 5 % on a 1 000-row table.
"""

from __future__ import annotations

import dp_accounting as dpa
import numpy as np
import torch

from raco_cli.privacy import releases
from raco_cli.privacy.mechanisms import NoiseSource, gaussian_noise


def size_event(noise_multiplier: float) -> dpa.DpEvent:
    """The DpEvent of :func:`dp_size` (L2 sensitivity 1 under add/remove of one record)."""
    return dpa.GaussianDpEvent(noise_multiplier)


def noisy_count(n: int, noise_multiplier: float, source: NoiseSource) -> int:
    """``round(n + N(0, sigma^2))`` clamped to >= 1 (rounding and clamping: post-processing).

    >>> noisy_count(100, 1e-9, torch.Generator().manual_seed(0))
    100
    """
    noise = float(gaussian_noise((1,), noise_multiplier, source, dtype=torch.float64).cpu()[0])
    return max(1, int(round(n + noise)))


def dp_size(n: int, *, noise_multiplier: float, source: NoiseSource) -> int:
    """The released training size (module docstring), through the replay tape."""
    return int(releases.release("size", lambda: noisy_count(n, noise_multiplier, source)))


def dp_cell_counts(counts: np.ndarray, *, noise_multiplier: float, source: NoiseSource) -> tuple[int, np.ndarray]:
    """The training rows of each cell of a partition (the constraint's global cells), released
    at once: ``counts + N(0, sigma^2 I)``.  A record is in exactly one cell, so the L2
    sensitivity is 1 and the release is the same ``GaussianDpEvent(sigma)`` as the size count;
    the size is their sum (``round``, clamped to >= 1), the cells feed the generalisation
    margins of ``constraint.confidence`` (:mod:`raco_cli.constraints.margin`).

    Returns:
        (n~, the noisy cell counts).
    """
    def release() -> np.ndarray:
        noise = gaussian_noise((len(counts),), noise_multiplier, source, dtype=torch.float64).cpu().numpy()
        return np.asarray(counts, dtype=np.float64) + noise

    noisy = np.asarray(releases.release("size", release), dtype=np.float64)
    return max(1, int(round(float(noisy.sum())))), noisy
