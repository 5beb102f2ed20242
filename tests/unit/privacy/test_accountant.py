"""The accountant: known values, supported trees, budget search and calibration."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st
from specs import paper_spec

from raco_cli.errors import PrivacyBudgetError
from raco_cli.privacy import accountant, events

REF = dict(sample_rate=0.01, noise_multiplier=1.0, hist_noise_multiplier=2.0)


def test_reference_independent_value():
    # Provenance: dp-accounting 0.6.0 PLDAccountant on
    # SelfComposed(Composed[PoissonSampled(0.01, Laplace(2)), PoissonSampled(0.01, Gaussian(1))], 1000), delta=1e-5.
    event = events.repeated(events.raco_step(**REF, sampling="independent"), 1000)
    assert accountant.epsilon(event, 1e-5) == pytest.approx(1.9205, abs=2e-3)


def test_reference_independent_equals_library():
    event = events.repeated(events.raco_step(**REF, sampling="independent"), 1000)
    lib = pld_privacy_accountant.PLDAccountant()
    assert lib.supports(event)
    lib.compose(event)
    assert accountant.epsilon(event, 1e-5) == lib.get_epsilon(1e-5)


@pytest.mark.parametrize("q, sigma, b, T", [(0.01, 1.0, 2.0, 1000), (0.0177, 0.8, 3.5, 417), (0.3, 2.5, 1.0, 7), (1.0, 1.3, 4.0, 20)])
def test_memoised_leaves_give_the_librarys_eps_and_are_built_once(q, sigma, b, T):
    """Subsampled Gaussian and Laplace leaves and plain Gaussian ones come from memos
    (accountant.subsampled_pld, plain_gaussian_pld): eps equals dp-accounting's own
    PLDAccountant exactly, for the step's tree and the runs' (the leaf composed T times beside
    once-releases, one of them repeated), and each leaf is built once."""
    accountant.subsampled_pld.cache_clear()
    accountant.plain_gaussian_pld.cache_clear()
    step = events.raco_step(sample_rate=q, noise_multiplier=sigma, hist_noise_multiplier=b, sampling="independent")
    run = dpa.ComposedDpEvent([events.repeated(step, T), dpa.GaussianDpEvent(7.0), dpa.LaplaceDpEvent(3.0)])
    # a plain Gaussian released 3 times is one Gaussian of noise 7 / sqrt(3) (the library's count)
    other_run = dpa.ComposedDpEvent([events.repeated(step, T + 1), dpa.GaussianDpEvent(7.0), events.repeated(dpa.GaussianDpEvent(7.0), 3)])
    for tree in (step, run, dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), T), other_run):
        lib = pld_privacy_accountant.PLDAccountant()
        lib.compose(tree)
        assert accountant.epsilon(tree, 1e-5) == lib.get_epsilon(1e-5)
    info = accountant.subsampled_pld.cache_info()
    assert (info.misses, info.hits) == (2, 5)  # the Laplace and the Gaussian leaf, then reused
    plain = accountant.plain_gaussian_pld.cache_info()
    assert (plain.misses, plain.hits) == (2, 1)  # sigma 7 (then reused by the other run) and 7 / sqrt(3)
    for other in (events.raco_step(sample_rate=q, noise_multiplier=1.5 * sigma, hist_noise_multiplier=b, sampling="independent"),
                  events.raco_step(sample_rate=q / 2, noise_multiplier=sigma, hist_noise_multiplier=2 * b, sampling="independent")):
        lib = pld_privacy_accountant.PLDAccountant()  # a leaf of other parameters is not served from the memo
        lib.compose(other)
        assert accountant.epsilon(other, 1e-5) == lib.get_epsilon(1e-5)


def test_reference_shared_value():
    """Pinned 2.2073 (docs/privacy.md, SPEC) and, independently of raco's joint-PLD construction, the
    same value from a PLD built by discretising the privacy-loss distribution of one shared
    step directly (tests/oracles.py; agrees to ~1e-6 relative)."""
    from oracles import shared_step_pld

    event = events.repeated(events.raco_step(**REF, sampling="shared"), 1000)
    value = accountant.epsilon(event, 1e-5)
    assert value == pytest.approx(2.2073, abs=2e-3)
    independent = shared_step_pld(REF["sample_rate"], REF["hist_noise_multiplier"], REF["noise_multiplier"])
    assert value == pytest.approx(independent.self_compose(1000).get_epsilon_for_delta(1e-5), rel=1e-3)


def test_library_rejects_the_shared_tree_and_we_accept_it():
    step = events.raco_step(**REF, sampling="shared")
    assert not pld_privacy_accountant.PLDAccountant().supports(step)
    assert accountant.supports(step)


def _delta_two_gaussians_on_one_sample(q, s1, s2, eps, direction):
    """Hockey-stick divergence of one step of two Gaussian releases (sensitivity 1 each) on one
    Poisson sample, by 2-D quadrature of the output densities (no privacy-loss algebra)."""
    from scipy import integrate, stats

    y1 = np.linspace(-12 * s1, 1 + 12 * s1, 1601)
    y2 = np.linspace(-12 * s2, 1 + 12 * s2, 1601)
    P = np.outer(stats.norm.pdf(y1, 0, s1), stats.norm.pdf(y2, 0, s2))
    M = (1 - q) * P + q * np.outer(stats.norm.pdf(y1, 1, s1), stats.norm.pdf(y2, 1, s2))
    diff = M - math.exp(eps) * P if direction == "remove" else P - math.exp(eps) * M
    return integrate.trapezoid(integrate.trapezoid(np.clip(diff, 0, None), y2, axis=1), y1)


@pytest.mark.parametrize("eps", [0.1, 0.5, 1.5])
def test_gaussians_on_one_sample_match_direct_integration(eps):
    """raco's substitution (two Gaussians on one sample = one Gaussian of (sum sigma^-2)^-1/2)
    against the hockey-stick divergence of the actual 2-D mechanism."""
    q, s1, s2 = 0.3, 0.9, 1.3
    two = dpa.PoissonSampledDpEvent(q, dpa.ComposedDpEvent([dpa.GaussianDpEvent(s1), dpa.GaussianDpEvent(s2)]))
    pld = accountant.step_pld(two, discretization=1e-4)
    exact = max(_delta_two_gaussians_on_one_sample(q, s1, s2, eps, d) for d in ("remove", "add"))
    ours = pld.get_delta_for_epsilon(eps)
    assert ours >= exact - 1e-6  # pessimistic
    assert ours == pytest.approx(exact, rel=2e-3, abs=1e-6)  # and tight


def test_two_gaussians_on_one_sample_cost_more_than_on_two_samples():
    shared = dpa.PoissonSampledDpEvent(0.03, dpa.ComposedDpEvent([dpa.GaussianDpEvent(3.0), dpa.GaussianDpEvent(3.0)]))
    separate = dpa.ComposedDpEvent([dpa.PoissonSampledDpEvent(0.03, dpa.GaussianDpEvent(3.0))] * 2)
    assert accountant.epsilon(events.repeated(shared, 500), 1e-5) > accountant.epsilon(events.repeated(separate, 500), 1e-5)


def test_non_private_is_infinite():
    assert accountant.epsilon(events.repeated(events.non_private(), 3), 1e-5) == float("inf")


def test_unsupported_tree_is_rejected():
    bad = dpa.PoissonSampledDpEvent(0.1, dpa.ComposedDpEvent([dpa.LaplaceDpEvent(1.0), dpa.LaplaceDpEvent(1.0), dpa.GaussianDpEvent(1.0)]))
    assert not accountant.supports(bad)
    with pytest.raises(ValueError):
        accountant.epsilon(bad, 1e-5)


@pytest.mark.parametrize("sampling", ["independent", "shared"])
def test_max_steps_is_the_largest_within_budget(sampling):
    step = events.raco_step(sample_rate=0.02, noise_multiplier=2.0, hist_noise_multiplier=4.0, sampling=sampling)
    budget = accountant.Budget(eps=1.0, delta=1e-5)
    T = accountant.max_steps(step, budget, limit=100_000, describe="x", sample_rate=0.02)
    assert accountant.epsilon(events.repeated(step, T), 1e-5) <= 1.0
    assert accountant.epsilon(events.repeated(step, T + 1), 1e-5) > 1.0


@settings(max_examples=400, deadline=None)
@given(crossing=st.integers(0, 1200), limit=st.integers(1, 1000), hint=st.one_of(st.none(), st.integers(-5, 1300)),
       flat=st.integers(1, 40),
       slope=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.floats(1e-300, 1e-3), st.floats(1e-3, 10.0)))
def test_the_step_search_finds_the_same_T_from_any_start(crossing, limit, hint, flat, slope):
    """largest_within on a non-decreasing eps (plateaus of ``flat`` steps): the largest T within
    the target, whatever the hint (a neighbouring run's T) and the slope of its secant step
    (absurd, zero, negative, NaN or infinite ones included), only T in [1, limit] evaluated;
    T = 1 over the target raises for every hint."""
    calls: list[int] = []

    def eps_at(T):  # within 1.0 up to T = crossing, past it after
        calls.append(T)
        return (T // flat) / (crossing // flat + 1) if T <= crossing else 1.0 + T

    def search():
        return accountant.largest_within(eps_at, 1.0, limit, hint=hint, slope=slope, unreachable=lambda e: RuntimeError(f"over {e}"))

    if crossing < 1:
        with pytest.raises(RuntimeError, match="over"):
            search()
        return
    assert search() == min(crossing, limit)
    assert all(1 <= c <= limit for c in calls)


@settings(max_examples=400, deadline=None)
@given(crossing=st.integers(1, 1200), other=st.integers(0, 1300), limit=st.integers(1, 1000), flat=st.integers(1, 40),
       curved=st.booleans())
def test_a_search_from_evaluations_at_another_target_finds_the_same_T(crossing, other, limit, flat, curved):
    """A private search plans a candidate at several per-trial eps: the eps(T) evaluated for one
    target are the start of the next (``seen``), whose answer is the search's from scratch, with
    every T evaluated in [1, limit]."""
    def eps_at(T):  # non-decreasing; plateaus of ``flat`` steps; 1.0 is crossed at T = crossing
        base = (T // flat) * flat
        return (base / crossing) ** (0.5 if curved else 1.0) if T <= crossing else 1.0 + T

    def search(target, seen):
        calls: list[int] = []
        found = accountant.largest_within(lambda T: (calls.append(T), eps_at(T))[1], target, limit, seen=seen,
                                          unreachable=lambda e: RuntimeError(f"over {e}"))
        assert all(1 <= c <= limit for c in calls)
        return found, calls

    seen: dict[int, float] = {}
    first_target = eps_at(min(other, 1200)) if other <= 1200 else 2.0  # the earlier search's target
    try:
        search(first_target, seen)
    except RuntimeError:
        pass
    fresh, _ = search(1.0, None)
    again, _ = search(1.0, seen)
    assert again == fresh == min(crossing, limit)


def test_plans_of_one_event_at_several_eps_share_their_evaluations(monkeypatch):
    """The probes of a private search's plan (one candidate at eps 1, 0.5, then near 0.42): each
    T the same as a plan from scratch, the later ones in a few PLD evaluations (issue 57: 8
    candidates x 9 probes x ~13 evaluations of ~40 ms were most of raco tune's start-up)."""
    step = events.raco_step(sample_rate=0.0356, noise_multiplier=3.0, hist_noise_multiplier=12.0, sampling="independent")
    seen: dict[int, float] = {}
    counts = []
    for eps in (1.0, 0.5, 0.4296, 0.4239):
        evaluations: list[int] = []
        search = accountant.largest_within

        def counted(eps_at, *args, _log=evaluations, _search=search, **kwargs):
            return _search(lambda T: (_log.append(T), eps_at(T))[1], *args, **kwargs)

        monkeypatch.setattr(accountant, "largest_within", counted)
        shared = accountant.max_steps(step, accountant.Budget(eps, 1e-5), limit=10_000, describe="x", sample_rate=0.0356, seen=seen)
        counts.append(len(evaluations))
        monkeypatch.setattr(accountant, "largest_within", search)
        assert shared == accountant.max_steps(step, accountant.Budget(eps, 1e-5), limit=10_000, describe="x", sample_rate=0.0356)
    assert counts[0] > 8 and max(counts[2:]) <= 4, counts


def test_a_close_hint_needs_a_few_evaluations_and_plans_the_same_T(monkeypatch):
    """max_steps from a neighbouring run's T (the seeds of a scope=model sweep: each its own
    released n~, so its own q): the same T as the bisection from scratch, in a few PLD
    evaluations instead of ~log2(limit); a far or absurd hint still gives the same T."""
    search = accountant.largest_within
    evaluations: list[int] = []

    def counted(eps_at, *args, **kwargs):
        return search(lambda T: (evaluations.append(T), eps_at(T))[1], *args, **kwargs)

    monkeypatch.setattr(accountant, "largest_within", counted)
    budget = accountant.Budget(eps=1.0, delta=1e-5)
    found, seen = {}, {}
    for q, hint in ((0.0356, None), (0.03555, None), (0.03555, "near"), (0.03555, "secant"), (0.03555, 1), (0.03555, 10_000)):
        step = events.raco_step(sample_rate=q, noise_multiplier=3.0, hist_noise_multiplier=12.0, sampling="independent")
        start = found[(0.0356, None)][0] if hint in ("near", "secant") else hint
        # the neighbour's eps(T + 1) - eps(T), as planning keeps it (the secant step's slope)
        slope = seen[start + 1] - seen[start] if hint == "secant" else None
        evaluations.clear()
        T = accountant.max_steps(step, budget, limit=10_000, describe="x", sample_rate=q, hint=start, slope=slope,
                                 seen=seen if hint is None and q == 0.0356 else None)
        found[(q, hint)] = (T, len(evaluations))
    assert len({T for T, _ in list(found.values())[1:]}) == 1  # every start, the same T at q = 0.03555
    assert found[(0.0356, None)][0] != found[(0.03555, None)][0]  # (the hint is not the answer)
    assert found[(0.03555, "near")][1] <= 4 < found[(0.03555, None)][1]
    assert found[(0.03555, "secant")][1] <= 3


def test_max_steps_respects_limit():
    step = events.gaussian_step(sample_rate=0.001, noise_multiplier=10.0)
    assert accountant.max_steps(step, accountant.Budget(5.0, 1e-5), limit=50, describe="x", sample_rate=0.001) == 50


def test_unreachable_budget_message():
    step = events.raco_step(sample_rate=0.5, noise_multiplier=0.5, hist_noise_multiplier=0.5, sampling="independent")
    with pytest.raises(PrivacyBudgetError, match=r"^Cannot reach eps=0.01 \(delta=1e-05, sample_rate=0.5, x\): a single step already spends eps="):
        accountant.max_steps(step, accountant.Budget(0.01, 1e-5), limit=10, describe="x", sample_rate=0.5)


def test_calibrated_noise_never_overshoots():
    def make(s):
        return events.raco_step(sample_rate=0.02, noise_multiplier=1.0 * s, hist_noise_multiplier=2.0 * s, sampling="independent")

    budget = accountant.Budget(eps=1.0, delta=1e-5)
    s = accountant.calibrate_noise_scale(make, budget, steps=300, sample_rate=0.02)
    spent = accountant.epsilon(events.repeated(make(s), 300), 1e-5)
    assert spent <= 1.0
    assert spent > 0.99  # and it is tight


def test_calibration_stops_at_the_noise_floor():
    """A budget so large that almost no noise would do: the factor stops at ``min_scale``
    (the accountant's noise floor) and the run is private with room to spare."""
    calls = []

    def make(s):
        calls.append(s)
        return events.gaussian_step(sample_rate=0.02, noise_multiplier=1.0 * s)

    budget = accountant.Budget(eps=200.0, delta=1e-5)
    s = accountant.calibrate_noise_scale(make, budget, steps=10, sample_rate=0.02, min_scale=0.5)
    assert s == 0.5 and min(calls) >= 0.5
    assert accountant.epsilon(events.repeated(make(s), 10), 1e-5) < 200.0


def test_calibration_is_searched_once_per_mechanism_and_budget():
    """A sweep group's runs that differ only where the accounting does not look calibrate once;
    a step that scales other noise (same event at s = 1) or another budget is searched anew."""
    calls = []

    def both(s):
        calls.append(s)
        return events.raco_step(sample_rate=0.03, noise_multiplier=1.1 * s, hist_noise_multiplier=2.3 * s, sampling="independent")

    def gradient_only(s):
        calls.append(s)
        return events.raco_step(sample_rate=0.03, noise_multiplier=1.1 * s, hist_noise_multiplier=2.3, sampling="independent")

    budget = accountant.Budget(eps=1.7, delta=1e-5)
    first = accountant.calibrate_noise_scale(both, budget, steps=97, sample_rate=0.03)
    searched = len(calls)
    calls.clear()
    assert accountant.calibrate_noise_scale(both, budget, steps=97, sample_rate=0.03) == first
    assert sorted(calls) == [1.0, 2.0] and searched > 4  # only the key's two events
    calls.clear()
    other = accountant.calibrate_noise_scale(gradient_only, budget, steps=97, sample_rate=0.03)
    assert len(calls) > 4 and other != first
    assert accountant.epsilon(events.repeated(gradient_only(other), 97), 1e-5) <= 1.7
    calls.clear()
    accountant.calibrate_noise_scale(both, accountant.Budget(eps=1.8, delta=1e-5), steps=97, sample_rate=0.03)
    assert len(calls) > 4


@settings(max_examples=12, deadline=None)
@given(
    q=st.floats(0.005, 0.2),
    sigma=st.floats(0.8, 5.0),
    T=st.integers(1, 200),
)
def test_eps_grows_with_steps_and_falls_with_noise(q, sigma, T):
    def e(steps, s):
        return accountant.epsilon(events.repeated(events.gaussian_step(sample_rate=q, noise_multiplier=s), steps), 1e-5, discretization=1e-3)

    assert e(T + 10, sigma) >= e(T, sigma) - 1e-9
    assert e(T, sigma * 1.3) <= e(T, sigma) + 1e-9


def test_plain_gaussian_composition_is_one_gaussian():
    """Full-batch Gaussians (DPSE) compose into one Gaussian: rho adds, mu-GDP adds in squares."""
    sig = [3.0, 5.0, 7.0]
    tree = dpa.ComposedDpEvent([dpa.GaussianDpEvent(s) for s in sig] + [dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(40.0), 100)])
    combined = 1.0 / math.sqrt(sum(s**-2 for s in sig) + 100 / 40.0**2)
    assert accountant.epsilon(tree, 1e-5) == pytest.approx(accountant.epsilon(dpa.GaussianDpEvent(combined), 1e-5), rel=1e-9)
    # and the library, composing the leaves one by one, agrees up to its discretisation
    lib = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    lib.compose(tree)
    assert accountant.epsilon(tree, 1e-5) == pytest.approx(lib.get_epsilon(1e-5), rel=5e-3)
    assert accountant.epsilon(tree, 1e-5) <= lib.get_epsilon(1e-5) + 1e-9


@pytest.mark.parametrize("sigma", [0.19])  # one case: each accounts sigma = 0.1 PLDs (~20 s)
def test_calibrated_plan_at_a_huge_budget_stops_at_the_noise_floor(sigma):
    """eps = 1e4 needs almost no noise: the plan lands on the floor (sigma 0.1 and Laplace
    scale 0.01 limit it), without tripping the floor check on rounding (0.1 / 0.19 * 0.19 < 0.1)."""
    from raco_cli import methods
    from raco_cli.methods.planning import plan
    from raco_cli.privacy import limits

    spec = paper_spec(name="raco_dp", batch_size=100, steps=5, calibrate_noise=True, clip_norm=1.0,
                      noise_multiplier=sigma, hist_noise_multiplier=2.0 * sigma)
    p = plan(methods.get("raco_dp"), spec, n_train=1000, eps=1e4, delta=1e-5, constrained=True)
    assert p.eps_planned <= 1e4
    assert p.spec.noise_multiplier >= limits.MIN_NOISE_MULTIPLIER * (1 - 1e-9)
    assert p.spec.noise_multiplier == pytest.approx(limits.MIN_NOISE_MULTIPLIER, rel=0.01)


@pytest.mark.parametrize("sampling", ["independent", "shared"])
def test_planned_eps_matches_an_independent_composition(sampling):
    """The planner's eps for a fixed-T RaCO-DP run against the same run composed from scratch:
    q = B / n_train (what training samples at), dp-accounting's Laplace and Gaussian PLD
    constructors (independent sampling) or the directly discretised shared step
    (tests/oracles.py).  A planner accounting another q or another tree fails here."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    from oracles import shared_step_pld

    from raco_cli.methods.planning import plan
    from raco_cli.methods.sgda import raco_dp

    n, B, T, sigma, b = 5000, 100, 400, 1.5, 3.0
    spec = paper_spec(name="raco_dp", batch_size=B, steps=T, noise_multiplier=sigma, hist_noise_multiplier=b, sampling=sampling)
    p = plan(raco_dp, spec, n_train=n, eps=100.0, delta=1e-5, constrained=True)
    q = B / n
    if sampling == "shared":
        step = shared_step_pld(q, b, sigma)
    else:
        step = pld_lib.from_laplace_mechanism(b, sampling_prob=q).compose(pld_lib.from_gaussian_mechanism(sigma, sampling_prob=q))
    assert p.sample_rate == q and p.steps == T
    assert p.eps_planned == pytest.approx(step.self_compose(T).get_epsilon_for_delta(1e-5), rel=2e-3)


def test_dp_sgd_plan_agrees_with_opacus_prv_accountant():
    """A second library: Opacus' PRV accountant (Gopi et al. 2021) on the same DP-SGD run, and
    its RDP accountant as an upper bound."""
    import warnings

    from opacus.accountants import PRVAccountant, RDPAccountant

    from raco_cli.methods.planning import plan
    from raco_cli.methods.sgda import dp_sgd

    n, B, T, sigma = 4000, 80, 500, 1.2
    p = plan(dp_sgd, paper_spec(name="dp_sgd", batch_size=B, steps=T, noise_multiplier=sigma), n_train=n, eps=100.0,
             delta=1e-5, constrained=False)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prv, rdp = PRVAccountant(), RDPAccountant()
        prv.history = rdp.history = [(sigma, B / n, T)]
        eps_prv, eps_rdp = prv.get_epsilon(1e-5), rdp.get_epsilon(1e-5)
    assert p.eps_planned == pytest.approx(eps_prv, rel=0.02)
    assert p.eps_planned <= eps_rdp
