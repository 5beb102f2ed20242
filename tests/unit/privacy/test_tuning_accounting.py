"""Accounting of a private hyperparameter search (Papernot & Steinke 2022): the theorems against
dp-accounting's independent implementation, the paper's pure-DP corollary, plain composition
for fixed repetitions, and the distribution of the number of trials."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from hypothesis import given, settings
from hypothesis import strategies as st

from raco_cli.privacy import accountant
from raco_cli.privacy.rdp import ORDERS, rdp_curve, rdp_epsilon
from raco_cli.privacy.tuning import (
    Repetitions,
    draw_repetitions,
    plan_trial_epsilon,
    repeat_and_select_rdp,
    search_epsilon,
    tnb_gamma,
    tnb_mean,
    trial_curve,
)

TRIAL = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.1)), 2000)
RANDOM = [
    Repetitions("poisson", 10.0),
    Repetitions("truncated_negative_binomial", 10.0, 1.0),  # geometric
    Repetitions("truncated_negative_binomial", 10.0, 0.0),  # logarithmic
    Repetitions("truncated_negative_binomial", 5.0, 0.5),
]


def _library_shape(reps: Repetitions) -> float:
    return math.inf if reps.kind == "poisson" else reps.shape


@pytest.mark.parametrize("reps", RANDOM, ids=lambda r: r.describe())
def test_the_search_curve_equals_dp_accountings_repeat_and_select(reps):
    """Theorems 2 and 6 as dp-accounting codes them (written by the paper's group, independently
    of ours): the same curve and the same eps of the whole search."""
    curve = rdp_curve(TRIAL)
    ours = repeat_and_select_rdp(ORDERS, curve, reps)
    theirs = rdp_lib._compute_rdp_repeat_and_select(ORDERS, curve, reps.mean, _library_shape(reps))
    np.testing.assert_allclose(ours, theirs, rtol=1e-8)
    library = rdp_lib.RdpAccountant()
    library.compose(dp_event.RepeatAndSelectDpEvent(TRIAL, reps.mean, _library_shape(reps)))
    assert search_epsilon(curve, reps, 1e-5) == pytest.approx(library.get_epsilon(1e-5), rel=1e-8)
    assert search_epsilon(curve, reps, 1e-5) > rdp_epsilon(ORDERS, curve, 1e-5)  # the search costs more than a trial


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0, 2.0])
def test_pure_dp_trials_give_the_papers_corollary(eta):
    """Corollary 3: eps-DP trials and K ~ D_{eta,gamma} give a ((2 + eta) eps)-DP search, 3 eps for
    the geometric K of Liu and Talwar; pure eps-DP is RDP eps at every order, and the bound
    tends to (2 + eta) eps as the orders grow."""
    eps, orders = 0.7, np.array([1e6, 1e8, 1e10])
    got = repeat_and_select_rdp(orders, np.full(3, eps), Repetitions("truncated_negative_binomial", 10.0, eta))
    assert got[-1] == pytest.approx((2 + eta) * eps, rel=1e-6)


def test_the_hand_computed_geometric_bound_at_one_order():
    """Theorem 2 by hand at lambda = lh = 2 with a constant curve eps = 0.5, geometric K of mean 4:
    0.5 + 2 (1 - 1/2) 0.5 + 2 log(4)/2 + log(4)/1 = 1.0 + 2 log 4."""
    orders = np.array([2.0])
    got = repeat_and_select_rdp(orders, np.array([0.5]), Repetitions("truncated_negative_binomial", 4.0, 1.0))
    assert got[0] == pytest.approx(1.0 + 2 * math.log(4.0), rel=1e-9)


def test_fixed_repetitions_are_plain_composition():
    curve = rdp_curve(TRIAL)
    fixed = Repetitions("fixed", 5)
    assert search_epsilon(curve, fixed, 1e-5) == pytest.approx(rdp_epsilon(ORDERS, 5 * curve, 1e-5), rel=1e-12)
    by_pld = search_epsilon(curve, fixed, 1e-5, fixed_epsilon=lambda k: accountant.epsilon(dpa.SelfComposedDpEvent(TRIAL, k), 1e-5))
    assert by_pld == pytest.approx(accountant.epsilon(dpa.SelfComposedDpEvent(TRIAL, 5), 1e-5), rel=1e-12)


def test_poisson_reads_delta_hat_where_it_is_given():
    """Theorem 6 with delta_hat from the PLD (tighter than from the curve) gives a smaller eps."""
    curve = rdp_curve(TRIAL)
    reps = Repetitions("poisson", 10.0)

    def pld_delta(eps_hat):
        pld = accountant.RacoPLDAccountant()
        pld.compose(TRIAL)
        return np.array([pld.get_delta(float(e)) for e in eps_hat])

    assert search_epsilon(curve, reps, 1e-5, trial_delta=pld_delta) < search_epsilon(curve, reps, 1e-5)


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0, 3.0])
def test_tnb_gamma_inverts_the_mean(eta):
    for mean in (1.5, 4.0, 20.0):
        g = tnb_gamma(eta, mean)
        assert tnb_mean(g, eta) == pytest.approx(mean, rel=1e-9)
        assert tnb_mean(g, eta) >= mean  # the conservative side


def _tnb_pmf(k: int, gamma: float, eta: float) -> float:
    """Definition 1 by hand."""
    if eta == 0:
        return (1 - gamma) ** k / (k * math.log(1 / gamma))
    prod = math.prod((ell + eta) / (ell + 1) for ell in range(k))
    return (1 - gamma) ** k / (gamma**-eta - 1) * prod


@pytest.mark.parametrize("reps", RANDOM, ids=lambda r: r.describe())
def test_the_number_of_trials_follows_the_named_distribution(reps):
    """K is drawn, not fixed: its frequencies match the pmf (Definition 1; Poisson) within 5 SE."""
    rng = np.random.default_rng(3)
    draws = np.array([draw_repetitions(reps, rng) for _ in range(40_000)])
    assert draws.mean() == pytest.approx(reps.mean, rel=0.03)
    for k in (1, 2, 5):
        if reps.kind == "poisson":
            p = math.exp(-reps.mean) * reps.mean**k / math.factorial(k)
        else:
            p = _tnb_pmf(k, reps.gamma, reps.shape)
        se = math.sqrt(p * (1 - p) / len(draws))
        assert abs(np.mean(draws == k) - p) < 5 * se + 1e-4
    assert len(set(draws.tolist())) > 5


def test_a_mixture_of_candidates_is_bounded_by_their_pointwise_max():
    a = rdp_curve(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.1)), 1000))
    b = rdp_curve(dpa.GaussianDpEvent(2.0))
    both = trial_curve([a, b])
    assert np.all(both >= a) and np.all(both >= b)
    assert np.any(both > a) and np.any(both > b)  # neither dominates: the max is needed


def test_the_trial_budget_keeps_the_whole_search_within_the_total():
    def search_at(trial_eps):
        sigma = 1.0 / trial_eps  # a Gaussian trial: eps grows as sigma falls
        return search_epsilon(rdp_curve(dpa.GaussianDpEvent(sigma)), Repetitions("truncated_negative_binomial", 10.0, 1.0), 1e-5)

    trial = plan_trial_epsilon(1.0, search_at)
    assert search_at(trial) <= 1.0 < search_at(trial * 1.02)
    with pytest.raises(ValueError, match="exceeds"):
        plan_trial_epsilon(1e-6, search_at)


def _old_plan_trial_epsilon(total_eps, search_eps_at, *, smallest=1e-3, rel_tol=0.01):
    """The rule before issue 57 (halving, then geometric bisection): the probe count to beat."""
    hi = total_eps
    if search_eps_at(hi) <= total_eps:
        return hi
    lo = hi / 2.0
    while search_eps_at(lo) > total_eps:
        if lo < smallest * total_eps:
            raise ValueError("exceeds")
        lo, hi = lo / 2.0, lo
    while hi / lo > 1.0 + rel_tol:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if search_eps_at(mid) <= total_eps else (lo, mid)
    return lo


@settings(max_examples=300, deadline=None)
@given(power=st.floats(0.3, 3.0), scale=st.floats(0.05, 40.0), steps=st.integers(0, 60), floor=st.floats(0.0, 0.2),
       rel_tol=st.sampled_from([0.005, 0.01, 0.02]))
def test_the_trial_budget_probes_follow_the_curve_and_stay_within_the_total(power, scale, steps, floor, rel_tol):
    """Whatever the curve (power laws, staircases of ``steps`` levels like integer step counts,
    inf below ``floor``, i.e. no candidate takes a step): the per-trial eps returned fits, one
    evaluated within rel_tol above it does not, and no more probes than halving and bisection
    (issue 57: the probes are the start-up of raco tune)."""
    def curve(x):
        if x < floor:
            return math.inf
        y = scale * x**power
        return y if steps == 0 else math.ceil(y * steps) / steps

    probes: list[tuple[float, float]] = []

    def at(x):
        probes.append((x, curve(x)))
        return probes[-1][1]

    old: list[float] = []
    try:
        _old_plan_trial_epsilon(1.0, lambda x: (old.append(x), curve(x))[1], rel_tol=rel_tol)
    except ValueError:  # halving can jump over a narrow window above the floor; the secant may find it
        old = []
    try:
        trial = plan_trial_epsilon(1.0, at, rel_tol=rel_tol)
    except ValueError:
        assert not old  # no fit found where the old rule found one
        return
    assert curve(trial) <= 1.0 and (trial, curve(trial)) in probes
    assert trial == 1.0 or any(trial < x <= trial * (1 + rel_tol) + 1e-15 and y > 1.0 for x, y in probes)
    if old:
        assert len(probes) <= len(old) + 2  # a staircase can cost a closing probe or two; a smooth curve saves (below)


@pytest.mark.parametrize(("power", "scale"), [(1.3, 5.0), (0.8, 2.4), (2.0, 9.0)])
def test_on_a_power_law_the_probes_are_about_half_of_bisections(power, scale):
    new: list[float] = []
    old: list[float] = []
    plan_trial_epsilon(1.0, lambda x: (new.append(x), scale * x**power)[1], rel_tol=0.01)
    _old_plan_trial_epsilon(1.0, lambda x: (old.append(x), scale * x**power)[1], rel_tol=0.01)
    assert len(new) <= 5 < len(old), (new, old)
