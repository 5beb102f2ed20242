"""Independent privacy computations the tests compare raco's accountant with.

None of these calls ``raco_cli.privacy``: they rebuild what a run released from first
principles (the mechanisms' densities, dp-accounting's own PLD constructors, Opacus' PRV
accountant), so a test comparing with them can fail when raco's event trees, substitutions or
planner are wrong (issue 13: tests that compared the code with itself could not).

* :func:`shared_step_pld`: the PLD of one RaCO-DP step with ``sampling=shared`` (a Laplace and a
  Gaussian release on one Poisson sample), built by discretising the privacy-loss
  *distribution* directly (the Laplace loss's atoms and density convolved with the Gaussian
  loss on a fine grid, then mapped through the subsampling transform), not from raco's
  closed-form CDF and connect-the-dots construction.
* :func:`summary_epsilon`: the epsilon of a run from its ``summary.json`` (steps, sample rate,
  noise multipliers, once-per-run releases), composed with dp-accounting's PLD constructors.
* :func:`event_leaves`: the mechanisms of a DpEvent tree with their Poisson rate and count,
  read by walking the tree here (not through raco's accountant).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import dp_accounting as dpa
import numpy as np
from dp_accounting.pld import common, pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import signal, special

DISCRETIZATION = 1e-4


def _loss_masses(b: float, sigma: float, h: float) -> tuple[np.ndarray, np.ndarray]:
    """Masses of ``L = L_lap + L_g`` under P = Lap(0, b) x N(0, sigma^2) on a grid of step h.

    ``L_lap = (|x| - |x - 1|) / b``: an atom -1/b of mass 1/2 (x <= 0), an atom +1/b of mass
    e^{-1/b}/2 (x >= 1), and x in (0, 1) maps linearly onto (-1/b, 1/b) with density
    e^{-x/b}/(2b).  ``L_g = (2y - 1)/(2 sigma^2) ~ N(-1/(2 sigma^2), 1/sigma^2)``.
    """
    n_lap = int(math.ceil(1.0 / (b * h)))
    centres = np.arange(-n_lap, n_lap + 1) * h
    x1 = np.clip((b * (centres - h / 2) + 1) / 2, 0.0, 1.0)
    x2 = np.clip((b * (centres + h / 2) + 1) / 2, 0.0, 1.0)
    lap = (np.exp(-x1 / b) - np.exp(-x2 / b)) / 2
    lap[np.argmin(np.abs(centres + 1 / b))] += 0.5
    lap[np.argmin(np.abs(centres - 1 / b))] += math.exp(-1 / b) / 2
    mu, s = -1 / (2 * sigma**2), 1 / sigma
    n_g = int(math.ceil((abs(mu) + 14 * s) / h))
    gc = np.arange(-n_g, n_g + 1) * h
    gauss = special.ndtr((gc + h / 2 - mu) / s) - special.ndtr((gc - h / 2 - mu) / s)
    w = np.clip(signal.fftconvolve(lap, gauss), 0.0, None)
    return np.arange(len(w)) * h + (centres[0] + gc[0]), w


def _pmf(loss: np.ndarray, mass: np.ndarray, d: float) -> pld_pmf.PLDPmf:
    keep = mass > 0
    idx = np.rint(loss[keep] / d).astype(np.int64)
    lo = int(idx.min())
    probs = np.bincount(idx - lo, weights=mass[keep])
    return pld_pmf.DensePLDPmf(d, lo, probs, max(0.0, 1.0 - float(probs.sum())), pessimistic_estimate=True)


def shared_step_pld(q: float, b: float, sigma: float, *, h: float = 2e-5, d: float = DISCRETIZATION) -> pld_lib.PrivacyLossDistribution:
    """PLD of ``PoissonSampled(q, Composed[Laplace(b), Gaussian(sigma)])`` by direct discretisation.

    Under Q the loss density is e^L times P's, so Q's masses are e^L times P's on the grid.
    REMOVE: loss ``f(L) = log(1 - q + q e^L)`` under ``(1 - q) P + q Q``; ADD: ``-f(L)`` under P.
    """
    L, w_p = _loss_masses(b, sigma, h)
    w_q = np.exp(L) * w_p
    f = np.log1p(q * np.expm1(L))
    return pld_lib.PrivacyLossDistribution(_pmf(f, (1 - q) * w_p + q * w_q, d), _pmf(-f, w_p, d))


def _gaussian(sigma: float, q: float = 1.0) -> pld_lib.PrivacyLossDistribution:
    return pld_lib.from_gaussian_mechanism(sigma, sampling_prob=q, value_discretization_interval=DISCRETIZATION)


def summary_epsilon(summary: dict[str, Any], *, constrained: bool) -> float:
    """Epsilon of the run a ``summary.json`` describes, at its delta, composed from scratch.

    raco_dp: T x [Lap(b) on a sample, Gauss(sigma) on another] (independent sampling) or the
    shared step; dp_sgd: T x Gauss(sigma); dp_fermi: the noisy counts then T x one sample
    feeding two Gaussians (one Gaussian of sigma = (sigma_theta^-2 + sigma_W^-2)^-1/2);
    dpse: one Gaussian (module docstring of raco_cli.methods.dpse); plus the DP count of the
    training rows, the DP standardisation and the certificate's counts (Gaussians) and the private selection (pure eps_sel-DP).
    """
    hp, T, q = summary["hyperparameters"], int(summary["steps"]), float(summary["sample_rate"])
    method = summary["method"]
    if method == "raco_dp" and constrained:
        b, sigma = hp["hist_noise_multiplier"], hp["noise_multiplier"]
        if hp["sampling"] == "shared":
            step = shared_step_pld(q, b, sigma)
        else:
            step = pld_lib.from_laplace_mechanism(b, sampling_prob=q, value_discretization_interval=DISCRETIZATION).compose(
                _gaussian(sigma, q))
        run = step.self_compose(T)
    elif method in ("raco_dp", "dp_sgd"):
        run = _gaussian(hp["noise_multiplier"], q).self_compose(T)
    elif method == "dp_fermi":
        o = hp["options"]
        sigma = (hp["noise_multiplier"] ** -2 + o["noise_multiplier_w"] ** -2) ** -0.5
        run = _gaussian(sigma, q).self_compose(T).compose(_gaussian(o["count_noise_multiplier"]))
    elif method == "dpse":
        # full batch, all Gaussian: the counts, and stage 1 + stage 2 whose zCDP shares add up to
        # rho = 1 / (2 sigma_run^2) for the worst-case group; Gaussians compose by 1/sigma^2
        o = hp["options"]
        run = _gaussian((o.get("count_noise_multiplier", 100.0) ** -2 + hp["noise_multiplier"] ** -2) ** -0.5)
    else:
        raise ValueError(f"no independent composition for method {method}")
    if hp.get("size_noise", 0.0) > 0:  # the DP count of the training rows (scope=model)
        run = run.compose(_gaussian(hp["size_noise"]))
    if hp.get("preprocessing_noise", 0.0) > 0:
        run = run.compose(_gaussian(hp["preprocessing_noise"]))
    if hp.get("certificate_noise", 0.0) > 0:  # the released model's certificate (scope=model, constraint.confidence)
        run = run.compose(_gaussian(hp["certificate_noise"]))
    if hp.get("selection_eps", 0.0) > 0:
        run = run.compose(pld_lib.from_privacy_parameters(common.DifferentialPrivacyParameters(hp["selection_eps"], 0.0),
                                                          value_discretization_interval=DISCRETIZATION))
    return float(run.get_epsilon_for_delta(summary["delta"]))


class Leaf(NamedTuple):
    """One mechanism of an event tree: the event, the Poisson rate it is sampled at (1.0 when
    not subsampled; the outermost rate when nested) and how many times it is composed."""

    event: dpa.DpEvent
    rate: float
    count: int


def event_leaves(event: dpa.DpEvent, *, rate: float | None = None, count: int = 1) -> list[Leaf]:
    """The leaves of ``event`` in tree order (composition and self-composition flattened)."""
    if isinstance(event, dpa.SelfComposedDpEvent):
        return event_leaves(event.event, rate=rate, count=count * event.count)
    if isinstance(event, dpa.ComposedDpEvent):
        return [leaf for e in event.events for leaf in event_leaves(e, rate=rate, count=count)]
    if isinstance(event, dpa.PoissonSampledDpEvent):
        return event_leaves(event.event, rate=event.sampling_probability if rate is None else rate, count=count)
    return [Leaf(event, 1.0 if rate is None else rate, count)]
