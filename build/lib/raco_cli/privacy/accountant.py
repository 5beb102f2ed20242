"""Privacy accounting: epsilon of a DpEvent tree, steps within a budget, noise calibration.

The one place where epsilon is computed.  It is dp-accounting's PLD accountant
(Doroshenko et al. 2022, connect-the-dots, pessimistic), extended by
:class:`RacoPLDAccountant` with the case the library rejects, several Laplace /
Gaussian releases on *one* Poisson sample, ``PoissonSampled(q, Composed[...])``:

* only Gaussians (e.g. DP-FERMI's two gradients on one batch): the product of Gaussian
  mechanisms with noise multipliers sigma_i is exactly the Gaussian mechanism with
  ``sigma = (sum_i sigma_i^-2)^(-1/2)`` (the privacy loss is the sum of independent normal
  losses), which the library accounts with Poisson subsampling;
* one Laplace and Gaussians (RaCO-DP, ``shared`` sampling): the joint PLD of
  :func:`raco_cli.privacy.joint_pld.shared_laplace_gaussian_pld`.

binary ``RandomizedResponseDpEvent`` (the event of the pure eps-DP checkpoint selection of
:mod:`raco_cli.privacy.selection`), which the library accepts only under replace-one, and one
exact shortcut: a composition of plain (not subsampled) Gaussian
releases, e.g. DPSE's full-batch run, is accounted as the single Gaussian it equals (the
same identity), which avoids composing thousands of discretised PLDs.

Everything else is delegated unchanged to the library.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import dp_accounting as dpa
from dp_accounting.pld import common, pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from raco_cli.errors import NOISE_UNREACHABLE, UNREACHABLE_BUDGET, PrivacyBudgetError
from raco_cli.privacy.joint_pld import shared_laplace_gaussian_pld

DEFAULT_DISCRETIZATION = 1e-4
MAX_NOISE_MULTIPLIER = 1e6


class RacoPLDAccountant(pld_privacy_accountant.PLDAccountant):
    """dp-accounting's PLD accountant plus jointly sampled Laplace/Gaussian releases."""

    def __init__(self, value_discretization_interval: float = DEFAULT_DISCRETIZATION) -> None:
        super().__init__(value_discretization_interval=value_discretization_interval)

    def _maybe_compose(self, event: dpa.DpEvent, count: int, do_compose: bool):  # noqa: ANN202
        if isinstance(event, dpa.RandomizedResponseDpEvent) and event.num_buckets == 2 and 0 < event.noise_parameter < 1:
            # binary randomized response, the event of a pure eps-DP release (the private
            # checkpoint selection dominated by it, Kairouz et al. 2015): its PLD is that of
            # (eps, 0)-DP, the same under add/remove as under replace-one (the library only
            # accepts replace-one)
            if do_compose:
                pld = pld_lib.from_privacy_parameters(
                    common.DifferentialPrivacyParameters(randomized_response_epsilon(event), 0.0),
                    value_discretization_interval=self._value_discretization_interval,
                )
                self._pld = self._pld.compose(pld.self_compose(count))  # type: ignore[has-type]
            return None
        if isinstance(event, dpa.PoissonSampledDpEvent) and isinstance(
            event.event, (dpa.ComposedDpEvent, dpa.SelfComposedDpEvent)
        ):
            return self._compose_shared(event, count, do_compose)
        if (
            isinstance(event, dpa.PoissonSampledDpEvent) and type(event.event) in (dpa.GaussianDpEvent, dpa.LaplaceDpEvent)
            and event.sampling_probability > 0 and event.event.noise_multiplier > 0
            and self.neighboring_relation == dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
        ):  # the library's own leaf, memoised (subsampled_pld)
            if do_compose:
                leaf = subsampled_pld(type(event.event).__name__, event.event.noise_multiplier, event.sampling_probability,
                                      self._value_discretization_interval)
                self._pld = self._pld.compose(leaf.self_compose(count))  # type: ignore[has-type]
            return None
        if type(event) is dpa.GaussianDpEvent and event.noise_multiplier > 0:  # the library's own leaf, memoised
            if do_compose:
                leaf = plain_gaussian_pld(event.noise_multiplier / math.sqrt(count), self._value_discretization_interval,
                                          self.neighboring_relation)
                self._pld = self._pld.compose(leaf)  # type: ignore[has-type]
            return None
        if isinstance(event, (dpa.ComposedDpEvent, dpa.SelfComposedDpEvent)):
            leaves = flatten(event)
            if len(leaves) > 1 and all(type(e) is dpa.GaussianDpEvent and e.noise_multiplier > 0 for e, _ in leaves):
                # plain (not subsampled) Gaussians compose exactly into one Gaussian: one PLD
                # instead of many, and no discretisation error accumulated over the leaves
                sigma = combined_gaussian_noise([e.noise_multiplier for e, n in leaves for _ in range(n)])
                return self._maybe_compose(dpa.GaussianDpEvent(sigma), count, do_compose)
        return super()._maybe_compose(event, count, do_compose)

    def _compose_shared(self, event: dpa.PoissonSampledDpEvent, count: int, do_compose: bool):  # noqa: ANN202
        leaves = flatten(event.event)
        laplaces = [e for e, _ in leaves if isinstance(e, dpa.LaplaceDpEvent)]
        gaussians = [(e, n) for e, n in leaves if isinstance(e, dpa.GaussianDpEvent)]
        if len(laplaces) + len(gaussians) != len(leaves) or len(laplaces) > 1 or not gaussians:
            return self.CompositionErrorDetails(
                invalid_event=event,
                error_message="PoissonSampled(Composed[...]) is supported for Gaussian events "
                "and at most one Laplace event",
            )
        if (
            laplaces and sum(n for e, n in leaves if isinstance(e, dpa.LaplaceDpEvent)) != 1
        ):  # a Laplace repeated on the same sample is not implemented
            return self.CompositionErrorDetails(invalid_event=event, error_message="repeated Laplace")
        if not do_compose or event.sampling_probability == 0:
            return None
        sigmas = [e.noise_multiplier for e, n in gaussians for _ in range(n)]
        if any(s == 0 for s in sigmas) or any(e.noise_multiplier == 0 for e in laplaces):
            self._contains_non_dp_event = True
            return None
        sigma = combined_gaussian_noise(sigmas)
        d = self._value_discretization_interval
        if laplaces:
            pld = _shared_pld(event.sampling_probability, laplaces[0].noise_multiplier, sigma, d)
        else:
            pld = subsampled_pld("GaussianDpEvent", sigma, event.sampling_probability, d)
        self._pld = self._pld.compose(pld.self_compose(count))  # type: ignore[has-type]  # untyped base class attribute
        return None

    @property
    def pld(self) -> pld_lib.PrivacyLossDistribution:
        """The composed privacy loss distribution so far."""
        return self._pld

    @property
    def non_private(self) -> bool:
        return bool(self._contains_non_dp_event)


@functools.lru_cache(maxsize=64)
def subsampled_pld(kind: str, noise: float, sampling_prob: float, discretization: float) -> pld_lib.PrivacyLossDistribution:
    """The PLD of one Poisson-subsampled ``GaussianDpEvent`` or ``LaplaceDpEvent`` (``kind``),
    built by the library's call with the library's arguments (add/remove neighbours), memoised:
    a plan's step search and its whole-run eps build the same leaf (Adult's subsampled Gaussian:
    27 ms at the main job's noise, 0.29 s at sigma = 1; a loop in Python).  PLDs are immutable
    (compose and self_compose return new ones), so one may serve every caller."""
    if kind == "GaussianDpEvent":
        return pld_lib.from_gaussian_mechanism(standard_deviation=noise, value_discretization_interval=discretization,
                                               sampling_prob=sampling_prob, neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    return pld_lib.from_laplace_mechanism(parameter=noise, value_discretization_interval=discretization, sampling_prob=sampling_prob)


@functools.lru_cache(maxsize=64)
def plain_gaussian_pld(standard_deviation: float, discretization: float,
                       relation: dpa.NeighboringRelation) -> pld_lib.PrivacyLossDistribution:
    """The PLD of a ``GaussianDpEvent`` (not subsampled) as the library's accountant builds it
    (its ``noise / sqrt(count)`` is the caller's), memoised as :func:`subsampled_pld`: a run's
    once-made releases (the DP count and standardisation) do not depend on its sample rate, so
    the seeds of a scope=model sweep, each with its own n~, share them."""
    return pld_lib.from_gaussian_mechanism(standard_deviation=standard_deviation, value_discretization_interval=discretization,
                                           neighboring_relation=relation)


@functools.lru_cache(maxsize=64)
def _shared_pld(sampling_prob: float, laplace_scale: float, sigma: float, discretization: float) -> pld_lib.PrivacyLossDistribution:
    """:func:`shared_laplace_gaussian_pld`, memoised as :func:`subsampled_pld`."""
    return shared_laplace_gaussian_pld(sampling_prob=sampling_prob, laplace_scale=laplace_scale, gaussian_sigma=sigma,
                                       value_discretization_interval=discretization)


def randomized_response_epsilon(event: dpa.RandomizedResponseDpEvent) -> float:
    """eps of binary randomized response: the true bit w.p. ``1 - p/2``, so
    ``e^eps = (1 - p/2) / (p/2)``.

    >>> import dp_accounting as dpa
    >>> round(randomized_response_epsilon(dpa.RandomizedResponseDpEvent(2 / (1 + math.e), 2)), 12)
    1.0
    """
    p = event.noise_parameter
    return math.log(2.0 / p - 1.0)


def flatten(event: dpa.DpEvent, count: int = 1) -> list[tuple[dpa.DpEvent, int]]:
    """Leaves of Composed/SelfComposed trees with their multiplicities."""
    if isinstance(event, dpa.ComposedDpEvent):
        return [leaf for e in event.events for leaf in flatten(e, count)]
    if isinstance(event, dpa.SelfComposedDpEvent):
        return flatten(event.event, count * event.count)
    return [(event, count)]


def combined_gaussian_noise(sigmas: list[float]) -> float:
    """Noise multiplier of the Gaussian equivalent to several on one sample.

    >>> round(combined_gaussian_noise([1.0, 1.0]), 6)
    0.707107
    """
    return 1.0 / math.sqrt(sum(1.0 / s**2 for s in sigmas))


def supports(event: dpa.DpEvent) -> bool:
    """Whether the accountant can account the event tree."""
    return RacoPLDAccountant().supports(event)


def epsilon(event: dpa.DpEvent, delta: float, *, discretization: float = DEFAULT_DISCRETIZATION) -> float:
    """Epsilon at ``delta`` of an event tree (inf for non-private events).

    A tree of plain (not subsampled) Gaussian releases only is the single Gaussian of
    :func:`combined_gaussian_noise`, whose eps is computed exactly by
    :func:`gaussian_epsilon` (no discretisation: faster and tighter than its PLD, which
    agrees to within the discretisation, tested); everything else goes to the PLD accountant.

    >>> import dp_accounting as dpa
    >>> round(epsilon(dpa.GaussianDpEvent(1.0), 1e-5), 3)  # the Gaussian mechanism, sigma=1
    4.377
    """
    sigma = plain_gaussian_noise(event)
    if sigma is not None:
        return gaussian_epsilon(sigma, delta)
    acc = RacoPLDAccountant(discretization)
    if not acc.supports(event):
        raise ValueError(f"event not supported by the accountant: {event}")
    acc.compose(event)
    return float(acc.get_epsilon(delta))


def plain_gaussian_noise(event: dpa.DpEvent) -> float | None:
    """The noise multiplier of the one Gaussian a tree of plain Gaussian releases equals,
    None when the tree holds anything else (subsampling, Laplace, a non-private event).

    >>> round(plain_gaussian_noise(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2.0), 4)), 6)
    1.0
    """
    leaves = [(e, n) for e, n in flatten(event) if n > 0]
    if not leaves or not all(type(e) is dpa.GaussianDpEvent and e.noise_multiplier > 0 for e, _ in leaves):
        return None
    return 1.0 / math.sqrt(sum(n / e.noise_multiplier**2 for e, n in leaves))  # combined_gaussian_noise, with counts


def gaussian_delta(sigma: float, eps: float) -> float:
    """delta(eps) of the Gaussian mechanism with L2 sensitivity 1 and noise std sigma, under
    add/remove or replace-one alike (Balle & Wang 2018, Theorem 8)::

        delta(eps) = Phi(1/(2 sigma) - eps sigma) - e^eps Phi(-1/(2 sigma) - eps sigma)

    >>> round(gaussian_delta(1.0, 0.0), 6)  # = 2 Phi(1/2) - 1, the total variation distance
    0.382925
    """
    from scipy.special import log_ndtr, ndtr

    a, b = 0.5 / sigma - eps * sigma, -0.5 / sigma - eps * sigma
    return float(max(ndtr(a) - math.exp(eps + log_ndtr(b)), 0.0))


def gaussian_epsilon(sigma: float, delta: float) -> float:
    """The smallest eps >= 0 with ``gaussian_delta(sigma, eps) <= delta`` (bisection to 1e-12
    relative, the upper end returned: never below the exact value).

    >>> round(gaussian_epsilon(1.0, 1e-5), 3)
    4.377
    """
    if gaussian_delta(sigma, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while gaussian_delta(sigma, hi) > delta:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-12 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if gaussian_delta(sigma, mid) <= delta else (mid, hi)
    return hi


def rho_epsilon(rho: float, delta: float, *, discretization: float = DEFAULT_DISCRETIZATION) -> float:
    """The eps at ``delta`` of a rho-zCDP budget (``privacy.rho``): the exact (eps, delta)
    curve of the Gaussian mechanism that is rho-zCDP, noise multiplier ``1 / sqrt(2 rho)``
    (:mod:`raco_cli.privacy.zcdp`).  A run planned against this eps whose releases are plain
    Gaussians is itself that Gaussian, hence exactly rho-zCDP.

    >>> round(rho_epsilon(2.0, 1e-5), 2)
    10.0
    """
    from raco_cli.privacy.zcdp import noise_for_rho

    return epsilon(dpa.GaussianDpEvent(noise_for_rho(rho)), delta, discretization=discretization)


_EPSILON_CACHE: dict[tuple[str, float, float], float] = {}


def cached_epsilon(event: dpa.DpEvent, delta: float, *, discretization: float = DEFAULT_DISCRETIZATION) -> float:
    """:func:`epsilon`, memoised by the event's full text (events are immutable and their
    ``repr`` lists every parameter): the runs of a sweep group that share a plan re-account
    the same tree once, not once each."""
    key = (repr(event), float(delta), float(discretization))
    if key not in _EPSILON_CACHE:
        if len(_EPSILON_CACHE) > 1024:
            _EPSILON_CACHE.clear()
        _EPSILON_CACHE[key] = epsilon(event, delta, discretization=discretization)
    return _EPSILON_CACHE[key]


def epsilon_cache() -> dict[tuple[str, float, float], float]:
    """The eps :func:`cached_epsilon` holds (a copy)."""
    return dict(_EPSILON_CACHE)


def remember_epsilons(entries: dict[tuple[str, float, float], float]) -> None:
    """Add eps that :func:`cached_epsilon` computed in another process (for the same trees:
    its keys are the trees' full text)."""
    if len(_EPSILON_CACHE) + len(entries) > 1024:
        _EPSILON_CACHE.clear()
    _EPSILON_CACHE.update(entries)


def step_pld(step: dpa.DpEvent, *, discretization: float) -> pld_lib.PrivacyLossDistribution | None:
    """The PLD of one step (None when the step is non-private)."""
    acc = RacoPLDAccountant(discretization)
    acc.compose(step)
    return None if acc.non_private else acc.pld


@dataclass(frozen=True)
class Budget:
    """A target (eps, delta) and the accounting resolution."""

    eps: float
    delta: float
    discretization: float = DEFAULT_DISCRETIZATION


def max_steps(
    step: dpa.DpEvent,
    budget: Budget,
    *,
    limit: int,
    describe: str,
    sample_rate: float,
    extra: dpa.DpEvent | None = None,
    hint: int | None = None,
    slope: float | None = None,
    seen: dict[int, float] | None = None,
) -> int:
    """Largest T <= limit with eps(SelfComposed(step, T) [+ extra]) <= budget.eps.

    A search over T (:func:`largest_within`) on the single-step PLD (eps is non-decreasing in
    T); ``extra`` is a release made once per run (e.g. the private checkpoint selection),
    composed with each T; ``hint``, ``slope``, ``seen``: as :func:`largest_within`.

    Raises:
        PrivacyBudgetError: even one step exceeds the budget.
    """
    pld = step_pld(step, discretization=budget.discretization)
    if pld is None:
        return limit
    extra_pld = None if extra is None else step_pld(extra, discretization=budget.discretization)

    def eps_at(T: int) -> float:
        run = pld.self_compose(T)
        return float((run if extra_pld is None else run.compose(extra_pld)).get_epsilon_for_delta(budget.delta))

    def unreachable(eps_one: float) -> PrivacyBudgetError:
        return PrivacyBudgetError(
            UNREACHABLE_BUDGET.format(eps=budget.eps, delta=budget.delta, sample_rate=sample_rate, mechanism=describe, eps_one=eps_one)
        )

    return largest_within(eps_at, budget.eps, limit, hint=hint, slope=slope, seen=seen, unreachable=unreachable)


def largest_within(
    eps_at: Callable[[int], float], target: float, limit: int, *, hint: int | None = None, slope: float | None = None,
    seen: dict[int, float] | None = None, unreachable: Callable[[float], Exception],
) -> int:
    """Largest T in [1, limit] with ``eps_at(T) <= target``, for a non-decreasing ``eps_at``.

    Without a hint: eps at 1 and at ``limit``, then bisection of [1, limit] (~log2(limit)
    evaluations, each a PLD self-composition of ~50 ms at Adult's settings).  With one (the T of
    a run planned just before whose sample rate differs slightly, e.g. the seeds of a
    scope=model sweep, each with its own released n~): eps at the hint, then, given ``slope``
    (that run's eps(T + 1) - eps(T)), one secant step to ``hint + floor((target - eps(hint)) /
    slope)`` (eps is nearly linear over the few steps between neighbouring runs' T, so the step
    lands on the answer or next to it); from there steps of 1, 2, 4, ... until eps crosses the
    target, then bisection of that bracket: 2-3 evaluations when the hint is close.  Either
    way the answer is the T with eps(T) <= target < eps(T + 1) (or ``limit``), both evaluated,
    so the same T for any hint and slope.  ``seen``: a dict that receives every evaluation (T:
    eps), e.g. for the next search's slope.  It may hold evaluations of the same ``eps_at`` made
    for another target (a private search plans each candidate at several per-trial eps): without
    a hint, the known T on either side of this target are the start, searched by secant steps
    (eps is nearly linear between them), each checked one T past it, alternating with bisection.

    Raises:
        ``unreachable(eps_at(1))``: even T = 1 exceeds the target.
    """
    seen = {} if seen is None else seen

    def fits(T: int) -> bool:
        if T not in seen:
            seen[T] = eps_at(T)
        return seen[T] <= target

    def clamped(T: int) -> int:
        return min(max(int(T), 1), limit)

    if hint is None:
        below = [T for T, e in seen.items() if 1 <= T <= limit and e <= target]
        above = [T for T, e in seen.items() if 1 <= T <= limit and e > target]
        if below and above and max(below) < min(above):  # known from a search at another target
            return _secant_within(fits, seen, target, max(below), min(above))
        if not fits(1):
            raise unreachable(seen[1])
        if fits(limit):
            return limit
        lo, hi = 1, limit  # eps(lo) <= target < eps(hi)
    else:
        start, gap = clamped(hint), 1
        if slope is not None and math.isfinite(slope) and slope > 0:
            fits(start)
            steps_left = (target - seen[start]) / slope
            if math.isfinite(steps_left):
                start = clamped(start + math.floor(steps_left))
        if fits(start):  # gallop up to the first T past the target
            lo = start
            while True:
                if lo == limit:
                    return limit
                probe = min(lo + gap, limit)
                if not fits(probe):
                    hi = probe
                    break
                lo, gap = probe, 2 * gap
        else:  # gallop down to the first T within it
            hi = start
            while True:
                if hi == 1:
                    raise unreachable(seen[1])
                probe = max(hi - gap, 1)
                if fits(probe):
                    lo = probe
                    break
                hi, gap = probe, 2 * gap
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _secant_within(fits: Callable[[int], bool], seen: dict[int, float], target: float, lo: int, hi: int) -> int:
    """The largest T in [lo, hi) with eps(T) <= target, given eps(lo) <= target < eps(hi)
    (both in ``seen``): a secant step to where the line through the bracket's ends crosses the
    target, then the T one past it (a right secant closes the bracket in two evaluations),
    alternating with bisection (a poor secant, e.g. on a plateau, still halves the bracket
    every other evaluation)."""
    secant = True
    while hi - lo > 1:
        if secant:
            rise = seen[hi] - seen[lo]
            guess = lo + (target - seen[lo]) * (hi - lo) / rise if rise > 0 and math.isfinite(rise) else (lo + hi) / 2
            probe = min(max(math.floor(guess), lo + 1), hi - 1)
        else:
            probe = (lo + hi) // 2
        if fits(probe):
            lo = probe
            if secant and lo + 1 < hi:  # the secant's answer is checked one step past it
                lo, hi = (lo + 1, hi) if fits(lo + 1) else (lo, lo + 1)
        else:
            hi = probe
        secant = not secant
    return lo


def calibrate_noise_scale(
    make_step: Callable[[float], dpa.DpEvent],
    budget: Budget,
    *,
    steps: int,
    sample_rate: float,
    rel_tol: float = 1e-3,
    whole_run: bool = False,
    min_scale: float = 1e-3,
) -> float:
    """Smallest factor s (to ``rel_tol``) such that ``SelfComposed(make_step(s), steps)`` meets the budget.

    ``make_step(s)`` multiplies every noise multiplier of the step by s; with ``whole_run``
    it returns the event of the whole run (not repeated ``steps`` times).  As in dp-accounting's
    ``calibrate_dp_mechanism`` (parameter -> event map, fresh accountant per trial, search),
    but the bracket grows geometrically from s = 1 (very small noise makes a PLD huge, so
    the search never starts there) and bisects in log space; the result is re-accounted
    at full resolution and nudged up until epsilon does not exceed the target.  The factor
    never goes below ``min_scale`` (the noise floor of :mod:`raco_cli.privacy.limits`): a
    budget so large that less noise would do is then met with room to spare.

    The result is memoised by everything it depends on: the events at s = 1 and s = 2 (their
    ``repr`` lists every parameter; ``make_step`` multiplies noise multipliers, so the two pin
    which ones and from what values), the budget and the search settings.  A sweep group's
    runs that differ in what the accounting does not see (DP-FERMI's penalty weight, gamma)
    calibrate once: a 140-run DP-FERMI group at eps = 9 searched 7 times, ~4 s each.

    Raises:
        PrivacyBudgetError: the target needs a noise multiplier factor above 1e6.
    """
    key = (repr(make_step(1.0)), repr(make_step(2.0)), budget, int(steps), float(sample_rate), float(rel_tol), bool(whole_run), float(min_scale))
    if key not in _CALIBRATION_CACHE:
        if len(_CALIBRATION_CACHE) > 1024:
            _CALIBRATION_CACHE.clear()
        _CALIBRATION_CACHE[key] = _calibrate_noise_scale(make_step, budget, steps=steps, sample_rate=sample_rate, rel_tol=rel_tol,
                                                         whole_run=whole_run, min_scale=min_scale)
    return _CALIBRATION_CACHE[key]


_CALIBRATION_CACHE: dict[tuple, float] = {}


def _calibrate_noise_scale(
    make_step: Callable[[float], dpa.DpEvent], budget: Budget, *, steps: int, sample_rate: float, rel_tol: float, whole_run: bool,
    min_scale: float,
) -> float:
    """:func:`calibrate_noise_scale` without the memo."""

    def eps_of(s: float, discretization: float) -> float:
        event = make_step(s) if whole_run else repeated_event(make_step(s), steps)
        return epsilon(event, budget.delta, discretization=discretization)

    coarse = max(budget.discretization, 1e-3)
    lo, hi = 1.0, 1.0
    while eps_of(hi, coarse) > budget.eps:  # grow until private enough
        lo, hi = hi, hi * 2.0
        if hi > MAX_NOISE_MULTIPLIER:
            raise PrivacyBudgetError(
                NOISE_UNREACHABLE.format(
                    eps=budget.eps, delta=budget.delta, steps=steps, sample_rate=sample_rate, limit=MAX_NOISE_MULTIPLIER
                )
            )
    if lo == hi:  # s = 1 already meets the budget: shrink
        while lo / 2.0 >= min_scale and eps_of(lo / 2.0, coarse) <= budget.eps:
            lo /= 2.0
        if lo / 2.0 < min_scale and eps_of(min_scale, coarse) <= budget.eps:
            lo = hi = min_scale  # the floor already meets the budget: no search below it
        else:
            hi, lo = lo, max(lo / 2.0, min_scale)
    while hi / lo > 1.0 + rel_tol:  # invariant: eps(hi) <= target < eps(lo)
        mid = math.sqrt(lo * hi)
        if eps_of(mid, coarse) <= budget.eps:
            hi = mid
        else:
            lo = mid
    s = hi
    while eps_of(s, budget.discretization) > budget.eps:
        s *= 1.0 + rel_tol
    return float(s)


def repeated_event(step: dpa.DpEvent, steps: int) -> dpa.DpEvent:
    return dpa.SelfComposedDpEvent(step, int(steps))
