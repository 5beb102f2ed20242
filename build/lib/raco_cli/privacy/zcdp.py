"""zero-Concentrated DP (Bun & Steinke 2016): budgets given as rho (``privacy.rho``).

The DPSE paper states its budgets in rho-zCDP (rho = 2, 4.5, 8 in Tables 1-3).  raco accounts
(eps, delta) with the PLD accountant (:mod:`raco_cli.privacy.accountant`, the one place eps is
computed); this module holds the zCDP facts that relate the two:

* the Gaussian mechanism with L2 sensitivity 1 and noise multiplier sigma is exactly
  ``rho = 1 / (2 sigma^2)``-zCDP (Bun & Steinke, Prop. 1.6), and zCDP adds under composition
  (Lemma 2.3), so a composition of plain Gaussians is rho-zCDP with the sum of their rhos - and
  is the single Gaussian of that rho (the privacy losses are independent normals);
* a pure eps-DP release is ``eps^2 / 2``-zCDP (Prop. 1.4);
* a rho-zCDP mechanism is ``(rho + 2 sqrt(rho ln(1/delta)), delta)``-DP (Prop. 1.3), the
  conversion the paper quotes.  It is loose: for the Gaussian mechanism itself the exact
  (eps, delta) curve (Balle & Wang 2018, Thm. 8) is what the PLD accountant computes
  (:func:`raco_cli.privacy.accountant.rho_epsilon`), e.g. rho = 2, delta = 1e-5: 11.60 vs 10.00.

A Poisson-subsampled release has no tight zCDP bound (zCDP does not amplify by subsampling),
so :func:`event_rho` returns None for trees that contain one: such runs (DP-SGD, RaCO-DP) meet
the (eps, delta) that a rho-zCDP Gaussian would have at the run's delta, and nothing is claimed
in zCDP terms.
"""

from __future__ import annotations

import math

import dp_accounting as dpa


def gaussian_rho(noise_multiplier: float) -> float:
    """zCDP of the Gaussian mechanism with this noise multiplier (std / L2 sensitivity).

    >>> gaussian_rho(0.5)
    2.0
    """
    return 1.0 / (2.0 * noise_multiplier**2)


def noise_for_rho(rho: float) -> float:
    """Noise multiplier of the Gaussian mechanism that is exactly rho-zCDP: ``1 / sqrt(2 rho)``.

    >>> noise_for_rho(2.0)
    0.5
    """
    if not rho > 0 or not math.isfinite(rho):
        raise ValueError(f"rho must be a positive finite number (got {rho})")
    return 1.0 / math.sqrt(2.0 * rho)


def pure_dp_rho(eps: float) -> float:
    """zCDP of a pure eps-DP mechanism: ``eps^2 / 2`` (Bun & Steinke 2016, Prop. 1.4).

    >>> pure_dp_rho(2.0)
    2.0
    """
    return eps * eps / 2.0


def bun_steinke_epsilon(rho: float, delta: float) -> float:
    """The (loose) eps of a rho-zCDP mechanism at delta: ``rho + 2 sqrt(rho ln(1/delta))``.

    >>> round(bun_steinke_epsilon(2.0, 1e-5), 4)
    11.5971
    """
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def event_rho(event: dpa.DpEvent) -> float | None:
    """zCDP rho of a DpEvent tree, or None when a release in it has no zCDP bound.

    Plain Gaussians add ``1 / (2 sigma^2)`` each, Laplace releases (pure ``1/b``-DP) and binary
    randomized response (pure eps-DP) ``eps^2 / 2``, no-op events 0; Poisson-subsampled
    releases and non-private events give None.

    >>> event_rho(dpa.ComposedDpEvent([dpa.GaussianDpEvent(1.0), dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2.0), 4)]))
    1.0
    """
    if isinstance(event, dpa.NoOpDpEvent):
        return 0.0
    if isinstance(event, dpa.ComposedDpEvent):
        parts = [event_rho(e) for e in event.events]
        return None if any(p is None for p in parts) else float(sum(p for p in parts if p is not None))
    if isinstance(event, dpa.SelfComposedDpEvent):
        inner = event_rho(event.event)
        return None if inner is None else inner * event.count
    if type(event) is dpa.GaussianDpEvent:
        return gaussian_rho(event.noise_multiplier) if event.noise_multiplier > 0 else None
    if type(event) is dpa.LaplaceDpEvent:
        return pure_dp_rho(1.0 / event.noise_multiplier) if event.noise_multiplier > 0 else None
    if isinstance(event, dpa.RandomizedResponseDpEvent) and event.num_buckets == 2 and 0 < event.noise_parameter < 1:
        p = event.noise_parameter
        return pure_dp_rho(math.log(2.0 / p - 1.0))
    return None
