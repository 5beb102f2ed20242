"""Privacy of a private hyperparameter search: run a private trial a random number K of times
and release only the best (Papernot & Steinke, "Hyperparameter tuning with Rényi differential
privacy", ICLR 2022; improving Liu & Talwar, STOC 2019).

The trial Q is one private training run with a candidate drawn at random from a fixed list,
whose output is its model and an accounted noisy score.  The search's output is the best
trial's output only: neither K nor the other trials' outputs may be released (the theorems
bound the best alone; a released K reduces the search to a fixed number of repetitions).

Per-trial curve.  A trial that draws one of the candidates c_1..c_N (uniformly, independently
of the data) is a mixture of their mechanisms; ``exp((a-1) D_a)`` is jointly convex, so its RDP
is at most the pointwise max of theirs (:func:`trial_curve`), and its hockey-stick divergence
likewise at most the max of theirs.

Theorems (``orders`` lambda > 1, the trial (lambda, eps(lambda))-RDP):

* ``truncated_negative_binomial`` (Theorem 2; K ~ D_{eta,gamma} of Definition 1, shape eta >= 0:
  eta = 1 geometric, eta = 0 logarithmic):
  ``eps'(l) = eps(l) + (1+eta)(1 - 1/lh) eps(lh) + (1+eta) log(1/gamma)/lh + log(E[K])/(l-1)``,
  minimised over lh among the orders, then made monotone in l (RDP is non-decreasing in l);
* ``poisson`` (Theorem 6; K ~ Poisson(mu)): ``eps'(l) = eps(l) + mu delta_hat + log(mu)/(l-1)``
  where the trial is (eps_hat, delta_hat)-DP at ``eps_hat = log(1 + 1/(l-1))``; delta_hat is
  read off the trial's PLD (:mod:`raco_cli.privacy.accountant`, the project's accountant) when
  given, else off its RDP curve (as dp-accounting does);
* ``fixed`` (K = k): plain composition of k trials by the PLD accountant, the naive baseline.

The search's eps at delta converts eps'(l) with :func:`raco_cli.privacy.rdp.rdp_epsilon`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from raco_cli.privacy.rdp import ORDERS, rdp_epsilon

Kind = Literal["poisson", "truncated_negative_binomial", "fixed"]
KINDS: tuple[Kind, ...] = ("poisson", "truncated_negative_binomial", "fixed")


@dataclass(frozen=True)
class Repetitions:
    """The distribution of the number of trials: its kind, mean and (negative binomial) shape."""

    kind: Kind
    mean: float
    shape: float = 1.0  # eta of D_{eta,gamma}; 1 = geometric

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"repetitions kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not (math.isfinite(self.mean) and self.mean >= 1):
            raise ValueError(f"the mean number of trials must be >= 1, got {self.mean}")
        if self.kind == "fixed" and self.mean != int(self.mean):
            raise ValueError(f"fixed repetitions need an integer count, got {self.mean}")
        if self.kind == "truncated_negative_binomial" and not (math.isfinite(self.shape) and self.shape >= 0):
            raise ValueError(f"the truncated negative binomial's shape must be >= 0, got {self.shape}")

    @property
    def gamma(self) -> float:
        """gamma of D_{eta,gamma} with this mean (Definition 1's mean formula inverted)."""
        return tnb_gamma(self.shape, self.mean)

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"fixed: {int(self.mean)} trials"
        if self.kind == "poisson":
            return f"poisson: mean {self.mean:g}"
        return f"truncated negative binomial: mean {self.mean:g}, shape {self.shape:g}"


def tnb_mean(gamma: float, shape: float) -> float:
    """E[K] for K ~ D_{eta,gamma} (Definition 1): ``eta (1-gamma) / (gamma (1 - gamma^eta))``,
    and ``(1/gamma - 1) / log(1/gamma)`` at eta = 0.

    >>> round(tnb_mean(0.1, 1.0), 9)  # geometric: 1 / gamma
    10.0
    """
    if shape == 0:
        return (1.0 / gamma - 1.0) / math.log(1.0 / gamma)
    return shape * (1.0 - gamma) / (gamma * -math.expm1(shape * math.log(gamma)))


def tnb_gamma(shape: float, mean: float) -> float:
    """The gamma with ``tnb_mean(gamma, shape) = mean``, by bisection (the mean falls as gamma
    grows); the lower end is returned, whose mean is >= the one asked for (the conservative side:
    the bound grows with log(1/gamma) and log E[K])."""
    if mean == 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if tnb_mean(mid, shape) < mean:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-15 * hi:
            break
    return lo


def repeat_and_select_rdp(
    orders: np.ndarray, rdp: np.ndarray, reps: Repetitions, *, delta_hat: Callable[[np.ndarray], np.ndarray] | None = None
) -> np.ndarray:
    """The search's RDP curve from the trial's (module doc: Theorems 2 and 6); inf at orders <= 1.

    ``delta_hat(eps_hat)``: the trial's delta at each eps_hat (Theorem 6 only); by default
    read off the RDP curve.
    """
    orders = np.asarray(orders, dtype=np.float64)
    rdp = np.asarray(rdp, dtype=np.float64)
    out = np.full_like(orders, np.inf)
    above = orders > 1
    if reps.kind == "poisson":
        mu = reps.mean
        eps_hat = np.log1p(1.0 / (orders[above] - 1.0))
        if delta_hat is None:
            dh = np.array([rdp_lib.compute_delta(list(orders), list(rdp), float(e))[0] for e in eps_hat])
        else:
            dh = np.asarray(delta_hat(eps_hat), dtype=np.float64)
        out[above] = rdp[above] + mu * dh + math.log(mu) / (orders[above] - 1.0)
        return out
    if reps.kind != "truncated_negative_binomial":
        raise ValueError(f"repeat_and_select_rdp is for random repetitions, not {reps.kind}")
    eta, gamma = reps.shape, reps.gamma
    # the lh-term, minimised over the orders (lh >= 1)
    at_least_one = orders >= 1
    c = (1.0 + eta) * np.min((1.0 - 1.0 / orders[at_least_one]) * rdp[at_least_one] + math.log(1.0 / gamma) / orders[at_least_one])
    out[above] = rdp[above] + c + math.log(reps.mean) / (orders[above] - 1.0)
    # RDP is non-decreasing in the order: a higher order's bound holds at a lower one
    return np.minimum.accumulate(out[::-1])[::-1]


def trial_curve(curves: Sequence[np.ndarray]) -> np.ndarray:
    """The RDP curve of a trial that draws one of several candidates: their pointwise max."""
    return np.max(np.vstack([np.asarray(c, dtype=np.float64) for c in curves]), axis=0)


def search_epsilon(
    trial_rdp: np.ndarray, reps: Repetitions, delta: float, *, orders: np.ndarray = ORDERS,
    trial_delta: Callable[[np.ndarray], np.ndarray] | None = None, fixed_epsilon: Callable[[int], float] | None = None,
    before_rdp: np.ndarray | None = None,
) -> float:
    """eps at delta of the whole search: ``before_rdp`` (releases made once, before the trials)
    composed with the repeated-and-selected trial.

    ``fixed`` repetitions are plain composition: ``fixed_epsilon(k)`` (the PLD of k trials and
    the releases before them) when given, else the RDP of k trials.
    """
    base = np.zeros_like(np.asarray(orders, dtype=np.float64)) if before_rdp is None else np.asarray(before_rdp)
    if reps.kind == "fixed":
        k = int(reps.mean)
        if fixed_epsilon is not None:
            return float(fixed_epsilon(k))
        return rdp_epsilon(orders, base + k * np.asarray(trial_rdp), delta)
    return rdp_epsilon(orders, base + repeat_and_select_rdp(orders, trial_rdp, reps, delta_hat=trial_delta), delta)


def draw_repetitions(reps: Repetitions, rng: np.random.Generator) -> int:
    """K from the distribution (the caller's generator must be seeded from fresh secret entropy:
    K is never released).  D_{eta,gamma} is the negative binomial (eta successes, success
    probability gamma, counting failures) conditioned on K >= 1, and the logarithmic
    distribution at eta = 0."""
    if reps.kind == "fixed":
        return int(reps.mean)
    if reps.kind == "poisson":
        return int(rng.poisson(reps.mean))
    gamma = reps.gamma
    if gamma >= 1.0:
        return 1
    if reps.shape == 0:
        return int(rng.logseries(1.0 - gamma))
    while True:
        k = int(rng.negative_binomial(reps.shape, gamma))
        if k >= 1:
            return k


def plan_trial_epsilon(total_eps: float, search_eps_at: Callable[[float], float], *, smallest: float = 1e-3,
                       rel_tol: float = 0.01) -> float:
    """The largest per-trial eps (to ``rel_tol``) whose whole search stays within ``total_eps``:
    a per-trial eps ``lo`` with ``search_eps_at(lo) <= total_eps < search_eps_at(hi)`` for some
    ``hi <= lo * (1 + rel_tol)``, both evaluated (the caller accounts the search at ``lo``).

    ``search_eps_at(trial_eps)`` grows with trial_eps where it is finite; it may be inf at very
    small trial eps (no candidate can take a step).  Each probe plans every candidate (seconds),
    so the probes follow the curve: the search's eps is close to a power of the trial's
    (a straight line in log-log), so after ``total_eps`` each probe is the secant's crossing of
    ``total_eps`` through the last two points (extrapolated while every point is above it, at most
    a factor 4 down; interpolated inside the bracket), aimed ``rel_tol / 2`` below it, and a
    probe that fits is followed by one ``rel_tol`` above it, which closes the bracket when the
    secant was right (Adult's default search: 4-5 probes instead of 9 by halving and bisection).
    Without a usable secant (an infinite or non-increasing point), or after a
    secant that failed to halve the bracket (a staircase, a kink), the probe halves (below any
    bracket, also after three extrapolations) or bisects it (inside).
    Raises ValueError when it still does not fit at ``smallest * total_eps``."""
    aim = 1.0 + rel_tol / 2.0

    def crossing(a: tuple[float, float], b: tuple[float, float]) -> float | None:
        """Where the log-log line through two probes meets ``total_eps`` (None: no usable line)."""
        (xa, ya), (xb, yb) = a, b
        if not all(math.isfinite(v) and v > 0 for v in (xa, ya, xb, yb)) or xa == xb or ya == yb:
            return None
        slope = (math.log(yb) - math.log(ya)) / (math.log(xb) - math.log(xa))
        if not slope > 0:
            return None
        return xb * math.exp((math.log(total_eps) - math.log(yb)) / slope)

    hi, s_hi = total_eps, search_eps_at(total_eps)
    if s_hi <= total_eps:
        return hi
    above: tuple[float, float] | None = None  # the probe above ``hi`` (both over the total): the first secant
    probe, extrapolated, floor = hi / 2.0, 0, 0.0  # floor: the largest probe where no candidate took a step (inf)
    while True:  # down from the total until a probe fits
        s = search_eps_at(probe)
        if s <= total_eps:
            lo, s_lo = probe, s
            break
        if math.isfinite(s):
            above, (hi, s_hi) = (hi, s_hi), (probe, s)
        else:  # below every candidate's first step: a fit, if any, lies between this probe and ``hi``
            floor = max(floor, probe)
        if probe < smallest * total_eps or hi <= floor * (1.0 + rel_tol):
            raise ValueError(f"even a per-trial eps of {probe:.3g} exceeds the search's total eps {total_eps:g}")
        if floor > 0.0:  # bisect between the infinite probe and the finite one (the secant says nothing of the floor)
            probe = math.sqrt(floor * hi)
            continue
        guess = crossing(above, (hi, s_hi)) if above is not None and extrapolated < 3 else None  # then halving: no crawl
        extrapolated += guess is not None
        probe = hi / 2.0 if guess is None else min(max(guess / aim, hi / 4.0), hi / aim)
    secant = True  # until a secant step fails to halve the bracket (a staircase, a kink): bisection after
    while hi / lo > 1.0 + rel_tol:
        width = math.log(hi / lo)
        guess = crossing((lo, s_lo), (hi, s_hi)) if secant else None
        if guess is None:
            probe, then_close = math.sqrt(lo * hi), False
        elif guess / aim <= lo * aim:  # the crossing within rel_tol of lo: the probe that would close the bracket
            probe, then_close = lo * (1.0 + rel_tol), False
        else:
            probe, then_close = min(guess / aim, hi / aim), True
        s = search_eps_at(probe)
        if s <= total_eps:
            lo, s_lo = probe, s
            closing = lo * (1.0 + rel_tol)
            if then_close and closing < hi:  # the secant aimed just below: one probe just above it
                s = search_eps_at(closing)
                lo, s_lo, hi, s_hi = (closing, s, hi, s_hi) if s <= total_eps else (lo, s_lo, closing, s)
        else:
            hi, s_hi = probe, s
        if guess is not None and math.log(hi / lo) > width / 2.0:
            secant = False
    return lo
