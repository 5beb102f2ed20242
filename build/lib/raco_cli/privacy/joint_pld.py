"""Privacy loss distribution of a Laplace and a Gaussian release on one Poisson sample.

This is the ``shared`` sampling mode of RaCO-DP (paper Algorithm 1 as written): one Poisson
batch feeds both the Laplace histogram (l1 sensitivity 1, scale ``b``) and the Gaussian
gradient sum (l2 sensitivity 1 after normalising by the clip norm, std ``sigma``).
dp-accounting supports ``PoissonSampled(Laplace)`` and ``PoissonSampled(Gaussian)`` but not
``PoissonSampled(Composed[Laplace, Gaussian])``; accounting the two as separately subsampled
*understates* epsilon, because the record is either in both releases or in neither.

Construction (all steps exact up to float rounding, then rounded pessimistically):

1. Dominating pair of the unsampled product mechanism: ``P = Lap(0, b) x N(0, sigma^2)`` and
   ``Q = Lap(1, b) x N(1, sigma^2)`` (the l1-Laplace and l2-Gaussian mechanisms are each
   dominated by their one-dimensional pair, and domination tensorises).  Its privacy loss
   ``L = ln dQ/dP`` is the sum of independent Laplace and Gaussian losses:
   ``L_lap = (|x| - |x-1|)/b`` and ``L_g = (2y-1)/(2 sigma^2)``.
2. Closed-form CDF of ``L`` under P (derived by integrating the Laplace density against the
   Gaussian CDF by parts); with ``s = 1/sigma``, ``mu = s^2/2``, ``c = 2/(b s)`` and
   ``a = (t + 1/b + mu)/s``::

       F_P(t) = Phi(a) - T(a),    1 - F_P(t) = Phi(-a) + T(a),
       T(a)   = 1/2 exp(s^2/8 - a s/2) [Phi(a - s/2) - Phi(a - c - s/2)].

   Under Q the loss is distributed as ``-L`` under P (reflect both coordinates), so
   ``F_Q(t) = 1 - F_P(-t)``.
3. Poisson subsampling at rate q (Zhu, Dong & Wang 2022; dp-accounting's convention):
   REMOVE pair ``(M, P)`` with ``M = (1-q) P + q Q`` and loss ``f(L) = ln(1 - q + q e^L)``
   under M; ADD pair ``(P, M)`` with loss ``-f(L)`` under P.
4. Pessimistic discretisation with connect-the-dots (Doroshenko et al. 2022, Algorithm 1, as
   implemented by dp-accounting): the exact single-step hockey-stick divergences
   ``delta(eps) = P_upper(loss > eps) - e^eps P_lower(loss > eps)`` on the grid
   ``k * Delta`` define a discrete PLD that dominates the true one; the mass above the
   truncated upper tail becomes infinity mass.

Composition over steps and the conversion to (eps, delta) are dp-accounting's own
(:class:`PrivacyLossDistribution`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from scipy.special import log_ndtr, ndtr

MAX_ABS_LOSS = 60.0  # losses beyond this are treated as infinite (pessimistic)


def _log_ndtr_diff(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``log(Phi(u) - Phi(v))`` for ``u > v``, stable in both tails."""
    u, v = np.broadcast_arrays(np.asarray(u, float), np.asarray(v, float))
    upper = v > 0  # both in the upper tail: use survival functions
    lu = np.where(upper, log_ndtr(-v), log_ndtr(u))
    lv = np.where(upper, log_ndtr(-u), log_ndtr(v))
    with np.errstate(divide="ignore"):
        return lu + np.log1p(-np.exp(lv - lu))


class ProductLoss:
    """Distribution of the privacy loss ``L`` of the unsampled Laplace x Gaussian pair."""

    def __init__(self, laplace_scale: float, gaussian_sigma: float) -> None:
        self.b = float(laplace_scale)
        self.s = 1.0 / float(gaussian_sigma)
        self.mu = self.s**2 / 2.0
        self.c = 2.0 / (self.b * self.s)

    def _parts(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a = (np.asarray(t, float) + 1.0 / self.b + self.mu) / self.s
        log_T = (
            math.log(0.5)
            + self.s**2 / 8.0
            - a * self.s / 2.0
            + _log_ndtr_diff(a - self.s / 2.0, a - self.c - self.s / 2.0)
        )
        return a, np.exp(log_T)

    def cdf_p(self, t: np.ndarray) -> np.ndarray:
        """``P_P(L <= t)`` (t may be +-inf)."""
        t = np.asarray(t, float)
        finite = np.isfinite(t)
        a, T = self._parts(np.where(finite, t, 0.0))
        out = np.clip(ndtr(a) - T, 0.0, 1.0)
        return np.where(finite, out, (t > 0).astype(float))

    def sf_p(self, t: np.ndarray) -> np.ndarray:
        """``P_P(L > t)`` (t may be +-inf)."""
        t = np.asarray(t, float)
        finite = np.isfinite(t)
        a, T = self._parts(np.where(finite, t, 0.0))
        out = np.clip(ndtr(-a) + T, 0.0, 1.0)
        return np.where(finite, out, (t < 0).astype(float))

    def support_bound(self) -> float:
        """A B with ``P(|L| > B) < 1e-20`` under both P and Q."""
        return 1.0 / self.b + self.mu + 10.0 * self.s + 1.0


def _connect_dots_pmf(
    hockey_stick: Callable[[np.ndarray], np.ndarray], *, lo: float, hi: float, delta: float
) -> pld_pmf.PLDPmf:
    """Pessimistic connect-the-dots PMF (Doroshenko et al. 2022, Algorithm 1) from delta(eps).

    Args:
        hockey_stick: ``eps -> delta(eps)`` of the single-step pair, vectorised.
        lo / hi: loss range covered; the mass above ``hi`` becomes infinity mass
            (``delta(hi)``), which is pessimistic.
        delta: grid spacing.
    """
    k_lo = math.floor(max(lo, -MAX_ABS_LOSS) / delta)
    k_hi = math.ceil(min(hi, MAX_ABS_LOSS) / delta)
    deltas = np.clip(hockey_stick(np.arange(k_lo, k_hi + 1) * delta), 0.0, 1.0)
    # exact delta(eps) is non-increasing; remove float jitter of order 1e-16
    deltas = np.minimum.accumulate(deltas)
    return pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(delta, k_lo, k_hi, deltas)


def shared_laplace_gaussian_pld(
    *,
    sampling_prob: float,
    laplace_scale: float,
    gaussian_sigma: float,
    value_discretization_interval: float = 1e-4,
) -> PrivacyLossDistribution:
    """Pessimistic PLD of one step: Laplace (scale b) and Gaussian (std sigma) on one Poisson sample.

    Args:
        sampling_prob: Poisson sampling rate q in (0, 1].
        laplace_scale: Laplace scale b of the l1-sensitivity-1 histogram.
        gaussian_sigma: Gaussian noise multiplier (std / l2 sensitivity).
        value_discretization_interval: loss grid spacing Delta.

    Returns:
        A :class:`PrivacyLossDistribution` (REMOVE and ADD directions) that composes with
        dp-accounting's own PLDs.
    """
    q = float(sampling_prob)
    if not 0 < q <= 1:
        raise ValueError(f"sampling_prob must be in (0, 1], got {q}")
    if laplace_scale <= 0 or gaussian_sigma <= 0:
        raise ValueError("noise parameters must be > 0")
    d = float(value_discretization_interval)
    L = ProductLoss(laplace_scale, gaussian_sigma)
    B = L.support_bound()

    def f(t: float) -> float:  # subsampled loss as a function of the product loss
        return math.log(1 - q + q * math.exp(t)) if q < 1 else t

    def f_inv(e: np.ndarray) -> np.ndarray:  # -inf where e <= ln(1 - q)
        e = np.asarray(e, float)
        if q == 1:
            return e
        with np.errstate(divide="ignore", invalid="ignore"):
            inner = np.expm1(e) + q  # = e^e - (1 - q)
            return np.where(inner > 0, np.log(np.where(inner > 0, inner, 1.0)) - math.log(q), -np.inf)

    def delta_remove(e: np.ndarray) -> np.ndarray:
        # upper M = (1-q)P + qQ, lower P; {loss > e} = {L > u}, u = f_inv(e)
        u = f_inv(e)
        sf_p, sf_q = L.sf_p(u), L.cdf_p(-u)
        return (1 - q) * sf_p + q * sf_q - np.exp(e) * sf_p

    def delta_add(e: np.ndarray) -> np.ndarray:
        # upper P, lower M; {loss > e} = {-f(L) > e} = {L < v}, v = f_inv(-e)
        v = f_inv(-np.asarray(e, float))
        cdf_p, cdf_q = L.cdf_p(v), L.sf_p(-v)
        return cdf_p - np.exp(e) * ((1 - q) * cdf_p + q * cdf_q)

    pmf_remove = _connect_dots_pmf(delta_remove, lo=f(-B), hi=f(B), delta=d)
    pmf_add = _connect_dots_pmf(delta_add, lo=-f(B), hi=-f(-B), delta=d)
    return PrivacyLossDistribution(pmf_remove, pmf_add)
