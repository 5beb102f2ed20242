"""The accountant: known values, supported trees, budget search and calibration."""

from __future__ import annotations

import math

import dp_accounting as dpa
import pytest
from dp_accounting.pld import pld_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_reference_shared_value():
    # Joint PLD (raco_cli.privacy.joint_pld), connect-the-dots, discretisation 1e-4.
    event = events.repeated(events.raco_step(**REF, sampling="shared"), 1000)
    value = accountant.epsilon(event, 1e-5)
    assert 2.15 <= value <= 2.35
    assert value == pytest.approx(2.2073, abs=2e-3)


def test_library_rejects_the_shared_tree_and_we_accept_it():
    step = events.raco_step(**REF, sampling="shared")
    assert not pld_privacy_accountant.PLDAccountant().supports(step)
    assert accountant.supports(step)


def test_gaussians_on_one_sample_equal_one_combined_gaussian():
    two = dpa.PoissonSampledDpEvent(0.02, dpa.ComposedDpEvent([dpa.GaussianDpEvent(2.0), dpa.GaussianDpEvent(3.0)]))
    sigma = (2.0**-2 + 3.0**-2) ** -0.5
    one = dpa.PoissonSampledDpEvent(0.02, dpa.GaussianDpEvent(sigma))
    for T in (1, 100):
        assert accountant.epsilon(events.repeated(two, T), 1e-5) == pytest.approx(
            accountant.epsilon(events.repeated(one, T), 1e-5), rel=1e-9
        )


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
    from raco_cli.methods.base import MethodSpec
    from raco_cli.methods.planning import plan
    from raco_cli.privacy import limits

    spec = MethodSpec(name="raco_dp", batch_size=100, steps=5, calibrate_noise=True, clip_norm=1.0,
                      noise_multiplier=sigma, hist_noise_multiplier=2.0 * sigma)
    p = plan(methods.get("raco_dp"), spec, n_train=1000, eps=1e4, delta=1e-5, constrained=True)
    assert p.eps_planned <= 1e4
    assert p.spec.noise_multiplier >= limits.MIN_NOISE_MULTIPLIER * (1 - 1e-9)
    assert p.spec.noise_multiplier == pytest.approx(limits.MIN_NOISE_MULTIPLIER, rel=0.01)
