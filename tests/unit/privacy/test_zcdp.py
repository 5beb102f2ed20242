"""zCDP budgets (privacy.rho) and their (eps, delta) conversion against closed forms and an
independent accountant."""

from __future__ import annotations

import math

import dp_accounting as dpa
import pytest
from dp_accounting.pld import pld_privacy_accountant
from specs import paper_spec

from raco_cli.privacy import accountant, zcdp

DELTAS = (1e-5, 1e-8)
RHOS = (0.005, 0.125, 0.5, 2.0, 4.5, 8.0, 50.0)


def phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def analytic_gaussian_delta(rho: float, eps: float) -> float:
    """delta(eps) of the rho-zCDP Gaussian, mu = sqrt(2 rho) (Balle & Wang 2018, Thm. 8), with erfc
    (independent of the implementation's scipy log_ndtr)."""
    mu = math.sqrt(2.0 * rho)
    return phi(mu / 2 - eps / mu) - math.exp(eps) * phi(-mu / 2 - eps / mu)


def pld_epsilon(event: dpa.DpEvent, delta: float) -> float:
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(event)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("rho", RHOS)
def test_rho_epsilon_is_the_closed_form_of_the_rho_gaussian(rho, delta):
    eps = accountant.rho_epsilon(rho, delta)
    # the closed form at eps is delta (to float precision), and a hair below eps it exceeds it
    assert analytic_gaussian_delta(rho, eps) == pytest.approx(delta, rel=1e-6)
    assert analytic_gaussian_delta(rho, eps * (1 - 1e-6)) > delta
    # tighter than the conversion the paper quotes, rho + 2 sqrt(rho ln(1/delta)) (Bun & Steinke Prop. 1.3)
    assert eps < zcdp.bun_steinke_epsilon(rho, delta)


def test_known_values():
    """rho = 2, delta = 1e-5 (Table 1's budget): eps = 9.997 exactly, 11.597 by the paper's bound."""
    assert accountant.rho_epsilon(2.0, 1e-5) == pytest.approx(9.99726, abs=1e-4)
    assert zcdp.bun_steinke_epsilon(2.0, 1e-5) == pytest.approx(2 + 2 * math.sqrt(2 * math.log(1e5)))
    assert accountant.epsilon(dpa.GaussianDpEvent(1.0), 1e-5) == pytest.approx(4.377178, abs=1e-5)


@pytest.mark.parametrize("rho", (0.01, 1.0, 20.0))
def test_noise_and_rho_are_inverse(rho):
    assert zcdp.gaussian_rho(zcdp.noise_for_rho(rho)) == pytest.approx(rho, rel=1e-12)
    assert zcdp.noise_for_rho(rho) == pytest.approx(1 / math.sqrt(2 * rho))


def test_a_composition_of_gaussians_is_the_gaussian_of_the_summed_rho():
    """zCDP adds under composition, and a plain-Gaussian tree is exactly one Gaussian: its eps is
    rho_epsilon of its rho (the round trip a privacy.rho run relies on)."""
    parts = [dpa.GaussianDpEvent(3.0), dpa.GaussianDpEvent(5.0), dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(20.0), 50)]
    tree = dpa.ComposedDpEvent(parts)
    rho = 1 / 18 + 1 / 50 + 50 / 800
    assert zcdp.event_rho(tree) == pytest.approx(rho, rel=1e-12)
    assert accountant.epsilon(tree, 1e-5) == pytest.approx(accountant.rho_epsilon(rho, 1e-5), rel=1e-9)
    assert accountant.epsilon(tree, 1e-5) * (1 - 1e-9) <= pld_epsilon(tree, 1e-5) <= accountant.epsilon(tree, 1e-5) + 1e-3


def test_event_rho_of_pure_and_subsampled_releases():
    assert zcdp.event_rho(dpa.LaplaceDpEvent(0.5)) == pytest.approx(2.0)  # 2-DP -> 2^2 / 2
    rr = dpa.RandomizedResponseDpEvent(2 / (1 + math.e), 2)  # pure 1-DP
    assert zcdp.event_rho(rr) == pytest.approx(0.5)
    assert zcdp.event_rho(dpa.NoOpDpEvent()) == 0.0
    assert zcdp.event_rho(dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(1.0))) is None
    assert zcdp.event_rho(dpa.ComposedDpEvent([dpa.GaussianDpEvent(1.0), dpa.NonPrivateDpEvent()])) is None


@pytest.mark.parametrize("sigma", (0.5, 2.0, 30.0))  # rho = 2, 0.125, 5.6e-4 (small sigma: slow PLDs)
def test_the_exact_gaussian_path_agrees_with_the_pld_accountant(sigma):
    """An independent computation: accountant.epsilon answers plain Gaussians in closed form;
    dp-accounting's PLD accountant (pessimistic, discretised) agrees to within its discretisation."""
    for delta in DELTAS:
        exact = accountant.gaussian_epsilon(sigma, delta)
        assert exact * (1 - 1e-9) <= pld_epsilon(dpa.GaussianDpEvent(sigma), delta) <= exact + 1e-3 * max(exact, 1.0)
    assert accountant.rho_epsilon(zcdp.gaussian_rho(sigma), 1e-5) == pytest.approx(accountant.gaussian_epsilon(sigma, 1e-5))


def test_rho_budget_is_planned_and_spent_exactly():
    """A DPSE run under privacy.rho: the calibrated event tree is rho-zCDP (counts included), just
    below the target, and its eps is that of the rho-Gaussian."""
    from raco_cli.methods import dpse
    from raco_cli.methods.planning import plan

    spec = paper_spec(name="dpse", steps=50, noise_multiplier=1.0, clip_norm=2.0, calibrate_noise=True, options={"bgl_penalty": 0.0})
    target = accountant.rho_epsilon(4.5, 1e-5)
    p = plan(dpse, spec, n_train=1000, eps=target, delta=1e-5, constrained=False)
    assert p.eps_planned <= target
    assert 4.5 * (1 - 3e-3) <= zcdp.event_rho(p.event) <= 4.5
