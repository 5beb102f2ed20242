"""Privacy planning of a run: the steps (or noise) that fit the budget, before training.

A private method's run is ``SelfComposed(step_event, T)``.  With ``steps=null`` T is the
largest number of steps within (eps, delta) (capped by ``max_steps``); with a fixed T the
plan checks the budget, or scales both noise multipliers when ``calibrate_noise`` is set.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace

import dp_accounting as dpa

from raco_cli.errors import BUDGET_EXCEEDED, UNREACHABLE_BUDGET, ConfigError, PrivacyBudgetError
from raco_cli.methods.base import Method, MethodSpec
from raco_cli.privacy import accountant, limits
from raco_cli.privacy.certificate import certificate_event
from raco_cli.privacy.estimates import estimates_event
from raco_cli.privacy.preprocessing import standardization_event
from raco_cli.privacy.selection import selection_event
from raco_cli.privacy.size import size_event

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrivacyPlan:
    """The resolved schedule of a run.

    Attributes:
        spec: the method spec, with noise multipliers possibly calibrated.
        steps: T.
        sample_rate: q.
        event: the DpEvent tree of the whole run.
        eps_planned: epsilon of ``event`` at delta (inf for non-private methods).
    """

    spec: MethodSpec
    steps: int
    sample_rate: float
    event: dpa.DpEvent
    eps_planned: float


def once_events(spec: MethodSpec) -> list[dpa.DpEvent]:
    """The releases a private run makes once, outside its steps: a table's private estimates
    (``private`` bounds / levels / indicators of ``dataset=table``), the DP count of the
    training rows and the DP standardisation (``dataset.preprocessing=dp``) before training,
    and the private checkpoint selection and the released model's certificate
    (``privacy.scope=model``) after it."""
    out = []
    if spec.estimate_noise > 0:
        out.append(estimates_event(spec.estimate_noise))
    if spec.size_noise > 0:
        out.append(size_event(spec.size_noise))
    if spec.preprocessing_noise > 0:
        out.append(standardization_event(spec.preprocessing_noise))
    if spec.selection_eps > 0:
        out.append(selection_event(spec.selection_eps))
    if spec.certificate_noise > 0:
        out.append(certificate_event(spec.certificate_noise))
    return out


def run_event(method: Method, spec: MethodSpec, sample_rate: float, steps: int, *, constrained: bool) -> dpa.DpEvent:
    """The DpEvent tree of a whole run: the method's ``run_event`` if it defines one, else
    ``SelfComposed(step_event, steps)``; composed with :func:`once_events` when the method
    is private."""
    custom = getattr(method, "run_event", None)
    if custom is not None:
        training = custom(spec, sample_rate, steps, constrained=constrained)
    else:
        training = accountant.repeated_event(method.step_event(spec, sample_rate, constrained=constrained), steps)
    once = once_events(spec) if method.PRIVATE else []
    return dpa.ComposedDpEvent([training, *once]) if once else training


def describe(spec: MethodSpec, constrained: bool) -> str:
    parts = [f"noise_multiplier={spec.noise_multiplier}"]
    if constrained:
        parts.append(f"hist_noise_multiplier={spec.hist_noise_multiplier}")
        parts.append(f"sampling={spec.sampling}")
    return ", ".join(parts)


_CACHE: OrderedDict[str, tuple[PrivacyPlan, list[logging.LogRecord]]] = OrderedDict()
_CACHE_SIZE = 512
# the last T found for each plan but its training size, and eps(T + 1) - eps(T) there (None at
# max_steps): where plan_uncached's search starts and its first step (accountant.largest_within)
_STEPS_HINTS: dict[str, tuple[int, float | None]] = {}
# every eps(T) evaluated for a run's event whatever its budget's eps, keyed by what eps(T) reads:
# a private search plans each candidate at ~5-9 per-trial eps (raco_cli/run/private_search.py),
# and a later plan starts from the T known on either side of its eps (accountant.largest_within)
_STEPS_SEEN: OrderedDict[str, dict[int, float]] = OrderedDict()


@dataclass(frozen=True)
class PlanRequest:
    """The inputs of :func:`plan`, the method by name (picklable: :func:`plan_ahead` sends it
    to another process)."""

    method: str
    spec: MethodSpec
    n_train: float
    eps: float
    delta: float
    constrained: bool
    discretization: float = accountant.DEFAULT_DISCRETIZATION

    def key(self) -> str:
        """The plan cache's key: every input."""
        return repr((self.method, self.spec, self.n_train, self.eps, self.delta, self.constrained, self.discretization))


def plan(
    method: Method,
    spec: MethodSpec,
    *,
    n_train: float,
    eps: float,
    delta: float,
    constrained: bool,
    discretization: float = accountant.DEFAULT_DISCRETIZATION,
) -> PrivacyPlan:
    """:func:`plan_uncached`, memoised by its inputs: the runs of a sweep that differ only in
    seed or gamma (or anything else the plan does not read) share one plan, computed once
    per process (calibrating noise accounts hundreds of PLDs), or ahead of the runs by
    :func:`plan_ahead`."""
    key = PlanRequest(method.NAME, spec, n_train, eps, delta, constrained, discretization).key()
    cached = _CACHE.get(key)
    if cached is not None:
        _CACHE.move_to_end(key)
        result, records = cached
        for record in records:  # each run logs what its plan says (a run's log is its own record)
            log.handle(record)
        return result
    handler = _Capture()
    log.addHandler(handler)
    try:
        result = plan_uncached(method, spec, n_train=n_train, eps=eps, delta=delta, constrained=constrained, discretization=discretization)
    finally:
        log.removeHandler(handler)
    _CACHE[key] = (result, handler.records)
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return result


#: plan_ahead uses a process per this many plans at least (a pool of two forked processes from
#: an 800 MB group process costs ~45 ms from start to end; a plan ~0.2 s at Adult's settings)
PLANS_PER_PROCESS = 4


def plan_ahead(requests: Sequence[PlanRequest]) -> int:
    """Compute the plans of many runs (a sweep group's, each seed with its own released n~
    under ``privacy.scope=model``) in parallel, into this process's caches, so that each
    run's :func:`plan` then finds its plan (and logs what the plan logged).

    Each plan is a pure function of its request, so a plan computed in another process is the
    plan computed here: the requests not yet cached go, in order and in contiguous slices, to
    forked processes, one per :data:`PLANS_PER_PROCESS` plans up to the usable cores, each
    planning its slice as one process plans them (the step search from the previous plan's T,
    :func:`accountant.largest_within`).  The plans' whole-run eps go into the accountant's
    cache (the run's finish re-accounts the same tree).  A request whose plan fails (an
    unreachable budget) is left to the run, which raises as before.  Nothing in parallel
    without ``fork`` (not on Windows or macOS) or with one core: the runs plan one by one.
    Returns how many plans were computed ahead.
    """
    import multiprocessing
    import sys
    from concurrent.futures import ProcessPoolExecutor

    from raco_cli.cores import cpu_count

    todo = list({r.key(): r for r in requests if r.key() not in _CACHE}.values())
    workers = min(cpu_count(), len(todo) // PLANS_PER_PROCESS)
    if workers < 2 or not sys.platform.startswith("linux"):
        return 0
    bounds = [round(i * len(todo) / workers) for i in range(workers + 1)]
    slices = [todo[bounds[i] : bounds[i + 1]] for i in range(workers)]
    computed = 0
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            for planned, eps_entries in pool.map(_plan_slice, slices):
                for key, entry in planned.items():
                    _CACHE[key] = entry
                    computed += 1
                accountant.remember_epsilons(eps_entries)
    except Exception as exc:  # noqa: BLE001 - only time is lost: the runs plan what is missing one by one
        log.warning("planning %d runs in %d processes failed (%s: %s); they plan one by one", len(todo), workers, type(exc).__name__, exc)
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return computed


def _plan_slice(requests: Sequence[PlanRequest]) -> tuple[dict[str, tuple[PrivacyPlan, list[logging.LogRecord]]], dict]:
    """In a forked process: the plans of ``requests``, in order, with what each logged, and the
    eps the accountant cached meanwhile.  The log handlers inherited from the parent are
    dropped (the parent replays each plan's records into each run's log)."""
    from raco_cli import methods

    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        if isinstance(logger, logging.Logger):
            logger.handlers.clear()
    before = set(accountant.epsilon_cache())
    out = {}
    for r in requests:
        try:
            plan(methods.get(r.method), r.spec, n_train=r.n_train, eps=r.eps, delta=r.delta, constrained=r.constrained,
                 discretization=r.discretization)
        except Exception:  # noqa: BLE001 - the run plans it again and raises (its own error, in its own log)
            continue
        out[r.key()] = _CACHE[r.key()]
    return out, {k: v for k, v in accountant.epsilon_cache().items() if k not in before}


class _Capture(logging.Handler):
    """The log records of one :func:`plan_uncached` call (replayed when the plan is reused)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def plan_uncached(
    method: Method,
    spec: MethodSpec,
    *,
    n_train: float,
    eps: float,
    delta: float,
    constrained: bool,
    discretization: float = accountant.DEFAULT_DISCRETIZATION,
) -> PrivacyPlan:
    """Resolve steps/noise of a run so that eps(run) <= eps.

    Budget use: with ``steps=null`` T is the largest number of steps within the budget; when
    that reaches ``max_steps`` the budget is not spent, so every noise multiplier is then
    scaled down (calibrated, as ``calibrate_noise``) until eps_spent is within 1 % of eps,
    unless the noise floor (:mod:`raco_cli.privacy.limits`) stops it (logged in one line).

    Raises:
        PrivacyBudgetError: the budget cannot be met with these settings.
        ConfigError: a private method lacks a noise multiplier or clip norm.
    """
    delta = spec.accounting_delta(delta)  # less what a private level estimate's threshold reserved
    full_batch = bool(getattr(method, "FULL_BATCH", False))
    if spec.batch_size > n_train and not full_batch:
        if spec.train_size is None:  # the exact size: the setting itself is wrong
            raise ConfigError(
                f"method.batch_size must be <= the number of training rows (got method.batch_size={spec.batch_size}; "
                f"the training split has {n_train:.0f} rows); it is the expected Poisson batch size. "
                f"Use e.g. method.batch_size={max(1, int(n_train // 10))}."
            )
        # scope=model: n_train is the released n~, whose noise can put it below a batch the
        # table itself allows; the training loops sample at min(1, B / n~), and so is it
        # accounted (post-processing of n~): every step then reads every row
        log.warning("method.batch_size=%d is above the released training size n~ = %.0f (a DP estimate under privacy.scope=model): "
                    "sampling rate q = 1, every step uses every training row (no amplification by sampling)", spec.batch_size, n_train)
    q = 1.0 if full_batch else min(1.0, spec.batch_size / n_train)
    budget = accountant.Budget(eps=eps, delta=delta, discretization=discretization)
    if not method.PRIVATE:  # nothing to promise: exact selection and full records
        spec = replace(spec, scope="paper", selection_eps=0.0, preprocessing_noise=0.0)
        steps = spec.steps or spec.max_steps
        return PrivacyPlan(spec, steps, q, run_event(method, spec, q, steps, constrained=constrained), float("inf"))
    for key in ("noise_multiplier", "clip_norm") + (("hist_noise_multiplier",) if constrained and method.NAME == "raco_dp" else ()):
        if getattr(spec, key) is None:
            raise ConfigError(f"method.{key} must be set for the private method {method.NAME} (got null).")
    if spec.steps is None:
        # runs that differ only in their released n~ (a scope=model sweep's seeds) have nearly
        # the same T: the search starts from the last such run's (the same T for any start)
        hint_key = repr((method.NAME, replace(spec, train_size=None), delta, budget, constrained))
        hint, slope = _STEPS_HINTS.get(hint_key, (None, None))
        # every eps the search evaluates (T: eps), with those of earlier plans of this very event at other eps
        seen_key = repr((method.NAME, spec, q, delta, budget.discretization, constrained))
        seen = _STEPS_SEEN.setdefault(seen_key, {})
        _STEPS_SEEN.move_to_end(seen_key)
        while len(_STEPS_SEEN) > _CACHE_SIZE:
            _STEPS_SEEN.popitem(last=False)
        if hasattr(method, "run_event"):
            steps = _max_steps_of_run(method, spec, q, budget, constrained, hint=hint, slope=slope, seen=seen)
        else:
            step = method.step_event(spec, q, constrained=constrained)
            once = once_events(spec)
            extra = None if not once else once[0] if len(once) == 1 else dpa.ComposedDpEvent(once)
            steps = accountant.max_steps(step, budget, limit=spec.max_steps, describe=describe(spec, constrained), sample_rate=q,
                                         extra=extra, hint=hint, slope=slope, seen=seen)
        _STEPS_HINTS[hint_key] = (steps, seen[steps + 1] - seen[steps] if steps in seen and steps + 1 in seen else None)
        while len(_STEPS_HINTS) > _CACHE_SIZE:
            _STEPS_HINTS.pop(next(iter(_STEPS_HINTS)))
        if steps == spec.max_steps:
            spec = _spend_budget(method, spec, q, steps, budget, constrained)
    else:
        steps = spec.steps
        if spec.calibrate_noise:
            # every noise multiplier of the method is scaled, the defaulted options' too
            defaults = {k: v for k, v in getattr(method, "DEFAULTS", {}).items() if k.endswith("noise_multiplier")}
            base = replace(spec, options={**defaults, **spec.options})

            def scaled(s: float) -> dpa.DpEvent:  # the whole run, so a first stage scales too
                return run_event(method, _scale_noise(base, s), q, steps, constrained=constrained)

            factor = accountant.calibrate_noise_scale(scaled, budget, steps=steps, sample_rate=q, whole_run=True,
                                                      min_scale=_min_noise_scale(base))
            spec = _scale_noise(base, factor)
    event = run_event(method, spec, q, steps, constrained=constrained)
    # cached: a run that takes its planned steps re-accounts this same tree when it finishes
    # (run/finish.py), and in a sweep group that is the same process
    eps_planned = accountant.cached_epsilon(event, delta, discretization=discretization)
    if eps_planned > eps:
        raise PrivacyBudgetError(
            BUDGET_EXCEEDED.format(
                eps=eps, delta=delta, steps=steps, sample_rate=q, mechanism=describe(spec, constrained), eps_spent=eps_planned
            )
        )
    return PrivacyPlan(spec, steps, q, event, eps_planned)


USE_TOLERANCE = 0.01  # a run whose T hits max_steps spends at least 99 % of eps


def _spend_budget(method: Method, spec: MethodSpec, q: float, steps: int, budget: accountant.Budget, constrained: bool) -> MethodSpec:
    """``spec`` with its noise scaled down so that ``max_steps`` steps spend the budget
    (within :data:`USE_TOLERANCE`); unchanged, with one log line, when they already do or the
    noise floor forbids less noise."""
    eps_now = accountant.epsilon(run_event(method, spec, q, steps, constrained=constrained), budget.delta,
                                 discretization=budget.discretization)
    if eps_now >= (1.0 - USE_TOLERANCE) * budget.eps:
        return spec

    def scaled(s: float) -> dpa.DpEvent:
        return run_event(method, _scale_noise(spec, s), q, steps, constrained=constrained)

    floor = _min_noise_scale(spec)
    factor = accountant.calibrate_noise_scale(scaled, budget, steps=steps, sample_rate=q, whole_run=True, min_scale=floor,
                                              rel_tol=USE_TOLERANCE / 20)
    if factor >= 1.0:
        return spec
    calibrated = _scale_noise(spec, factor)
    eps_new = accountant.epsilon(scaled(factor), budget.delta, discretization=budget.discretization)
    if eps_new < (1.0 - USE_TOLERANCE) * budget.eps:
        log.info("Budget use: %d steps (method.max_steps) spend eps=%.4g of %.4g even at the noise floor "
                 "(noise scaled by %.4g); raise method.max_steps to use the rest.", steps, eps_new, budget.eps, factor)
    else:
        log.info("Budget use: T reached method.max_steps=%d; noise scaled by %.4g so that eps_spent=%.4g of %.4g.",
                 steps, factor, eps_new, budget.eps)
    return calibrated


def _max_steps_of_run(method: Method, spec: MethodSpec, q: float, budget: accountant.Budget, constrained: bool, *,
                      hint: int | None = None, slope: float | None = None, seen: dict[int, float] | None = None) -> int:
    """Largest T <= max_steps whose whole-run event fits the budget (:func:`accountant.largest_within`)."""

    def eps_at(T: int) -> float:
        return accountant.epsilon(run_event(method, spec, q, T, constrained=constrained), budget.delta, discretization=budget.discretization)

    def unreachable(eps_one: float) -> PrivacyBudgetError:
        return PrivacyBudgetError(
            UNREACHABLE_BUDGET.format(eps=budget.eps, delta=budget.delta, sample_rate=q, mechanism=describe(spec, constrained), eps_one=eps_one)
        )

    return accountant.largest_within(eps_at, budget.eps, spec.max_steps, hint=hint, slope=slope, seen=seen, unreachable=unreachable)


def _min_noise_scale(spec: MethodSpec) -> float:
    """The smallest factor :func:`_scale_noise` may apply without crossing the noise floor."""
    floors = [limits.MIN_NOISE_MULTIPLIER / spec.noise_multiplier if spec.noise_multiplier else 0.0,
              limits.MIN_LAPLACE_SCALE / spec.hist_noise_multiplier if spec.hist_noise_multiplier else 0.0]
    floors += [limits.MIN_NOISE_MULTIPLIER / v for k, v in spec.options.items()
               if k.endswith("noise_multiplier") and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0]
    return max(floors)


def _scale_noise(spec: MethodSpec, factor: float) -> MethodSpec:
    """Every noise multiplier times ``factor``: the spec's and the method-specific
    ``options.*noise_multiplier`` (e.g. DP-FERMI's W-gradient and count noise)."""
    options = {
        k: (v * factor if k.endswith("noise_multiplier") and isinstance(v, (int, float)) and not isinstance(v, bool) else v)
        for k, v in spec.options.items()
    }
    return replace(
        spec,
        noise_multiplier=None if spec.noise_multiplier is None else spec.noise_multiplier * factor,
        hist_noise_multiplier=None if spec.hist_noise_multiplier is None else spec.hist_noise_multiplier * factor,
        options=options,
    )
