"""Private checkpoint selection (privacy.scope=model): the mechanism, its accounting, its plan."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from specs import paper_spec

from raco_cli.methods import planning
from raco_cli.methods.sgda import raco_dp
from raco_cli.privacy import accountant
from raco_cli.privacy.selection import (
    NoisyArgmax,
    exponential_mechanism_probabilities,
    selection_event,
)


def _rr_delta(eps: float, eps_prime: float) -> float:
    """delta(eps') of binary randomized response with parameter eps, by hand: the hockey-stick
    divergence of (e^eps, 1)/(1+e^eps) from (1, e^eps)/(1+e^eps)."""
    p, q = math.exp(eps) / (1 + math.exp(eps)), 1 / (1 + math.exp(eps))
    return max(0.0, p - math.exp(eps_prime) * q) + max(0.0, q - math.exp(eps_prime) * p)


@pytest.mark.parametrize("eps", [0.05, 0.5, 2.0])
def test_selection_event_is_accounted_as_pure_eps_dp(eps):
    event = selection_event(eps)
    assert accountant.randomized_response_epsilon(event) == pytest.approx(eps, rel=1e-12)
    # pure eps-DP: delta = 0 at eps, and at eps/2 the closed-form delta of randomized response
    assert accountant.epsilon(event, 1e-12) == pytest.approx(eps, abs=2e-4)
    target = _rr_delta(eps, eps / 2)
    assert accountant.epsilon(event, target) == pytest.approx(eps / 2, abs=2e-4)


def test_selection_composes_with_training_and_costs_budget():
    step = dpa.PoissonSampledDpEvent(0.02, dpa.GaussianDpEvent(1.0))
    train = dpa.SelfComposedDpEvent(step, 300)
    alone = accountant.epsilon(train, 1e-5)
    both = accountant.epsilon(dpa.ComposedDpEvent([train, selection_event(0.1)]), 1e-5)
    assert alone < both <= alone + 0.1 + 1e-3  # never more than basic composition


def test_plan_includes_the_selection_and_stays_within_eps(synthetic):
    n = len(synthetic.splits["train"])
    base = paper_spec(name="raco_dp", batch_size=100, max_steps=2000, noise_multiplier=3.0, hist_noise_multiplier=6.0)
    private = paper_spec(name="raco_dp", batch_size=100, max_steps=2000, noise_multiplier=3.0, hist_noise_multiplier=6.0,
                         scope="model", selection_eps=0.1)
    p0 = planning.plan(raco_dp, base, n_train=n, eps=1.0, delta=1e-5, constrained=True)
    p1 = planning.plan(raco_dp, private, n_train=n, eps=1.0, delta=1e-5, constrained=True)
    assert "RandomizedResponse" in str(p1.event) and "RandomizedResponse" not in str(p0.event)
    assert p1.eps_planned <= 1.0 and p1.steps < p0.steps  # the selection's share is paid in steps
    again = accountant.epsilon(planning.run_event(raco_dp, p1.spec, p1.sample_rate, p1.steps, constrained=True), 1e-5)
    assert again == pytest.approx(p1.eps_planned)


def test_plan_with_fixed_steps_calibrates_noise_for_the_selection_too(synthetic):
    n = len(synthetic.splits["train"])
    kw = dict(name="raco_dp", batch_size=200, steps=100, calibrate_noise=True)
    p0 = planning.plan(raco_dp, paper_spec(**kw), n_train=n, eps=1.0, delta=1e-5, constrained=True)
    p1 = planning.plan(raco_dp, paper_spec(**kw, scope="model", selection_eps=0.1), n_train=n, eps=1.0, delta=1e-5, constrained=True)
    assert p1.eps_planned <= 1.0 and p1.spec.noise_multiplier > p0.spec.noise_multiplier


def test_gumbel_max_samples_the_exponential_mechanism():
    """Monte Carlo: the frequency of each winner matches P(i) ∝ exp(eps u_i) (a wrong Gumbel
    scale, e.g. 2/eps, or Laplace noise, gives visibly different frequencies)."""
    counts = np.array([100.0, 101.0, 103.0, 99.0])
    eps, draws = 0.7, 20000
    gen = torch.Generator().manual_seed(0)
    wins = np.zeros(len(counts))
    for _ in range(draws):
        nm = NoisyArgmax(eps, gen)
        for i, c in enumerate(counts):
            nm.offer(i, nm.noisy_score(c), eligible=True)
        assert nm.best is not None
        wins[nm.best] += 1
    expected = exponential_mechanism_probabilities(counts, eps)
    se = np.sqrt(expected * (1 - expected) / draws)
    assert np.all(np.abs(wins / draws - expected) < 5 * se + 1e-3)


def test_exponential_mechanism_is_eps_dp_for_monotone_neighbours():
    """Adding one validation record raises some counts by 1 (monotone): every outcome's
    probability changes by at most e^eps (the bound the accounting uses)."""
    rng = np.random.default_rng(0)
    eps = 0.3
    for _ in range(200):
        u = rng.integers(0, 50, 6).astype(float)
        u2 = u + rng.integers(0, 2, 6)  # neighbour: each count +0 or +1
        p, p2 = exponential_mechanism_probabilities(u, eps), exponential_mechanism_probabilities(u2, eps)
        assert np.all(np.maximum(p / p2, p2 / p) <= math.exp(eps) * (1 + 1e-12))


def test_ineligible_candidates_are_never_selected():
    nm = NoisyArgmax(0.01, torch.Generator().manual_seed(1))
    nm.offer(0, nm.noisy_score(1e6), eligible=False)
    nm.offer(1, nm.noisy_score(0.0), eligible=True)
    assert nm.best == 1


def test_every_declared_key_status_is_documented():
    """docs/privacy.md lists every key of the status table (one source, no drift)."""
    from pathlib import Path

    from raco_cli.tracking.summary import STATUS

    doc = (Path(__file__).resolve().parents[3] / "docs" / "privacy.md").read_text()

    def keys(node, prefix=""):
        for k, v in node.items():
            yield from keys(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]

    missing = [k for k in keys(STATUS) if f"`{k}`" not in doc]
    assert not missing, missing
