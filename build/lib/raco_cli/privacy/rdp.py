"""Rényi DP curves of raco's event trees: the per-trial curve a private hyperparameter search
needs (:mod:`raco_cli.privacy.tuning`; Papernot & Steinke 2022 state their theorems in RDP).

The PLD accountant (:mod:`raco_cli.privacy.accountant`) stays the one that plans and reports
a run's eps: its pessimistic PLDs put the truncated tail of a Gaussian's privacy loss at +inf,
which makes every Rényi divergence read off them infinite, so an RDP curve cannot be taken
from them.  :class:`RacoRdpAccountant` is dp-accounting's RDP accountant (add/remove-one)
plus the leaves of raco's trees the library rejects:

* ``PoissonSampled(q, Laplace(b))``, a noisy histogram of a Poisson batch: the pair
  ``M = (1-q) Lap(0,b) + q Lap(1,b)`` against ``Lap(0,b)``, both directions (add and remove),
  by :func:`subsampled_laplace_rdp`, an upper Riemann sum of the exact integral (never below
  the true divergence);
* several Gaussians on one Poisson sample (DP-FERMI's two gradients): the one Gaussian they
  equal, ``sigma = (sum sigma_i^-2)^(-1/2)``, as in the PLD accountant;
* binary randomized response, the event of an eps-DP release (the private checkpoint
  selection): its exact RDP, the same under add/remove as under replace-one.

A Laplace and Gaussians on *one* shared Poisson sample (``method.sampling=shared``) are not
covered: the accountant reports the event unsupported and the caller says so.
"""

from __future__ import annotations

import functools
import math

import dp_accounting as dpa
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from scipy.special import logsumexp

from raco_cli.privacy.accountant import (
    combined_gaussian_noise,
    flatten,
    randomized_response_epsilon,
)

# dp-accounting's default orders, and the upper Riemann sum's resolution on the Laplace pair's
# one interval where the privacy loss is not constant
ORDERS = np.asarray(rdp_lib.DEFAULT_RDP_ORDERS, dtype=np.float64)
RIEMANN_CELLS = 20_000


def _log_mixture_moments(q: float, b: float, powers: np.ndarray) -> np.ndarray:
    """Upper bounds of ``log E_{x~Lap(0,b)} [((1-q) + q L(x))^s]`` for each power s, where
    ``L(x) = exp((|x| - |x-1|)/b)`` is the likelihood ratio of Lap(1,b) to Lap(0,b).

    L is ``e^{-1/b}`` on x <= 0 (mass 1/2), ``e^{1/b}`` on x >= 1 (mass ``e^{-1/b}/2``) and
    ``e^{(2x-1)/b}`` in between, where each of ``RIEMANN_CELLS`` cells contributes its exact
    mass times the larger of g at its two ends (g is monotone in x), so the sum is an upper
    bound of the integral.
    """
    s = np.asarray(powers, dtype=np.float64)[:, None]
    edges = np.linspace(0.0, 1.0, RIEMANN_CELLS + 1)
    log_g_edges = s * np.log1p(q * np.expm1((2.0 * edges - 1.0) / b))[None, :]  # log g at every edge
    log_g_cell = np.maximum(log_g_edges[:, :-1], log_g_edges[:, 1:])
    # the exact Lap(0,b) mass of each cell: (e^{-x_i/b} - e^{-x_{i+1}/b}) / 2
    log_mass = math.log(0.5) - edges[:-1] / b + np.log(-np.expm1(-np.diff(edges) / b))
    middle = logsumexp(log_g_cell + log_mass[None, :], axis=1)
    below = math.log(0.5) + s[:, 0] * math.log1p(q * math.expm1(-1.0 / b))
    above = math.log(0.5) - 1.0 / b + s[:, 0] * math.log1p(q * math.expm1(1.0 / b))
    return np.logaddexp(np.logaddexp(below, above), middle)


def subsampled_laplace_rdp(q: float, b: float, orders: np.ndarray = ORDERS) -> np.ndarray:
    """RDP of the Laplace mechanism (noise multiplier b, L1 sensitivity 1) on a Poisson sample
    of rate q, add/remove-one: ``max(D_a(M || P0), D_a(P0 || M))`` with ``P0 = Lap(0,b)``,
    ``M = (1-q) P0 + q Lap(1,b)`` (the pair dp-accounting's PLD uses for the same event).

    ``exp((a-1) D_a(M||P0)) = E_{P0}[((1-q) + qL)^a]`` and
    ``exp((a-1) D_a(P0||M)) = E_{P0}[((1-q) + qL)^{1-a}]``, both by
    :func:`_log_mixture_moments`.  At q = 1 this is Mironov's Laplace RDP (2017, Prop. 6), and
    at integer a the first is ``sum_j C(a,j) (1-q)^{a-j} q^j exp((j-1) D_j(Lap(1,b)||Lap(0,b)))``
    (both tested).

    >>> round(float(subsampled_laplace_rdp(1.0, 1.0, np.array([2.0]))[0]), 4)  # Mironov (2017) at eps 1, a = 2
    0.6191
    """
    a = np.asarray(orders, dtype=np.float64)
    if q == 0:
        return np.zeros_like(a)
    if b == 0:
        return np.full_like(a, np.inf)
    return _subsampled_laplace_rdp(float(q), float(b), tuple(a.tolist())).copy()


@functools.lru_cache(maxsize=256)
def _subsampled_laplace_rdp(q: float, b: float, orders: tuple[float, ...]) -> np.ndarray:
    """:func:`subsampled_laplace_rdp`, memoised by its exact arguments: a private search's plan
    asks for each candidate's histogram leaf at every probed per-trial eps (only T changes),
    and one curve is ~0.1 s of Riemann sums."""
    a = np.asarray(orders, dtype=np.float64)
    add = _log_mixture_moments(q, b, a)
    remove = _log_mixture_moments(q, b, 1.0 - a)
    return np.maximum(add, remove) / (a - 1.0)


def binary_randomized_response_rdp(eps: float, orders: np.ndarray = ORDERS) -> np.ndarray:
    """Exact RDP of binary randomized response with parameter eps (true bit w.p.
    ``p = e^eps/(1+e^eps)``): ``log(p^a (1-p)^{1-a} + (1-p)^a p^{1-a}) / (a-1)``, symmetric in
    the pair, so the same under add/remove as under replace-one.

    >>> round(float(binary_randomized_response_rdp(1.0, np.array([1e6]))[0]), 3)  # -> eps as a -> inf
    1.0
    """
    a = np.asarray(orders, dtype=np.float64)
    log_p, log_1mp = -np.logaddexp(0.0, -eps), -np.logaddexp(0.0, eps)
    return np.logaddexp(a * log_p + (1 - a) * log_1mp, a * log_1mp + (1 - a) * log_p) / (a - 1.0)


class RacoRdpAccountant(rdp_lib.RdpAccountant):
    """dp-accounting's RDP accountant (add/remove-one) plus the leaves listed in the module doc."""

    def __init__(self, orders: np.ndarray = ORDERS) -> None:
        super().__init__(orders=list(orders))

    def _maybe_compose(self, event: dpa.DpEvent, count: int, do_compose: bool):  # noqa: ANN202
        if isinstance(event, dpa.RandomizedResponseDpEvent) and event.num_buckets == 2 and 0 < event.noise_parameter < 1:
            if do_compose:
                self._rdp += count * binary_randomized_response_rdp(randomized_response_epsilon(event), self._orders)
            return None
        if isinstance(event, dpa.PoissonSampledDpEvent):
            inner = event.event
            if isinstance(inner, dpa.LaplaceDpEvent):
                if do_compose:
                    self._rdp += count * subsampled_laplace_rdp(event.sampling_probability, inner.noise_multiplier, self._orders)
                return None
            if isinstance(inner, (dpa.ComposedDpEvent, dpa.SelfComposedDpEvent)):
                leaves = flatten(inner)
                if not all(type(e) is dpa.GaussianDpEvent for e, _ in leaves):
                    return self.CompositionErrorDetails(
                        invalid_event=event,
                        error_message="a Laplace release sharing its Poisson sample with other releases "
                        "(method.sampling=shared) has no RDP curve here",
                    )
                sigmas = [e.noise_multiplier for e, n in leaves for _ in range(n)]
                if any(s == 0 for s in sigmas):
                    return self._maybe_compose(dpa.PoissonSampledDpEvent(event.sampling_probability, dpa.GaussianDpEvent(0.0)), count, do_compose)
                one = dpa.PoissonSampledDpEvent(event.sampling_probability, dpa.GaussianDpEvent(combined_gaussian_noise(sigmas)))
                return super()._maybe_compose(one, count, do_compose)
        return super()._maybe_compose(event, count, do_compose)


def rdp_curve(event: dpa.DpEvent, orders: np.ndarray = ORDERS) -> np.ndarray:
    """The RDP curve of an event tree at ``orders``.

    Raises:
        ValueError: the tree holds a release with no RDP curve here (the message names it).
    """
    why = check_supported(event)
    if why is not None:
        raise ValueError(f"no RDP curve for {event}: {why}")
    acc = RacoRdpAccountant(orders)
    acc.compose(event)
    return np.asarray(acc.rdp, dtype=np.float64)


def rdp_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    """eps at delta of an RDP curve: dp-accounting's conversion (Canonne, Kamath and Steinke
    2020, Prop. 12 / Asoodeh et al. 2021), the one its RDP accountant reports."""
    eps, _ = rdp_lib.compute_epsilon(list(orders), list(rdp), delta)
    return float(eps)


def check_supported(event: dpa.DpEvent) -> str | None:
    """None when :func:`rdp_curve` can account the tree, else why not (one phrase)."""
    result = RacoRdpAccountant(ORDERS[:1])._maybe_compose(event, 1, do_compose=False)
    return None if result is None else str(result.error_message)


__all__ = [
    "ORDERS", "RacoRdpAccountant", "binary_randomized_response_rdp", "check_supported", "rdp_curve",
    "rdp_epsilon", "subsampled_laplace_rdp",
]
